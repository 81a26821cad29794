package tests

// The cut's confirmation margin (issue 29's safety rule): a region
// confirms a cut to the global store only once every one of its instances
// applied it, so that the capacity never reaches the other region while an
// instance of the first still spends it.

import (
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/distributed"
)

// One eu instance's link to its regional Redis is slow (400 ms each way,
// inside the regional timeout of 1 s): it reads a cut up to a poll and a
// round trip after the coordinator published it, while applying its old
// share. With the margin the coordinator waits (two polls and twice the
// regional timeout), the global store hands the capacity to us only after
// that; with none, us is raised within a second of the cut, while the slow
// instance still applies its old share, and Σ shares passes the whole limit.
func TestGlobalCutIsConfirmedOnlyOnceASlowInstanceAppliedIt(t *testing.T) {
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: testInterval, lease: 10 * time.Second, timeout: 2500 * time.Millisecond}, nil)
	f.waitContact()
	stop := f.demandIn(0, "k")
	eu := f.regions[0]
	slow := 1 // not the coordinator: its own lock renewals must not fail
	if eu.regions[1].Stats().Coordinating.Load() {
		slow = 0
	}
	eu.links[slow].SetLatency(time.Second, time.Second)
	check := f.sumGuard("k")
	stop()
	var wg sync.WaitGroup
	done := make(chan struct{})
	f.drive(1, "k", 40, done, &wg)
	f.waitShare(1, "k", distributed.ShareScale*9/10, 20*time.Second)
	// Σ is sampled until the slow instance, too, applies eu's cut.
	for start := time.Now(); eu.regions[slow].Share(globalZone, "k") > distributed.ShareScale/10; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the slow eu instance still applies %d of k", eu.regions[slow].Share(globalZone, "k"))
		}
	}
	close(done)
	wg.Wait()
	check()
}
