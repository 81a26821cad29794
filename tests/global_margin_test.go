package tests

// The cut's confirmation margin (issue 29's safety rule): a region
// confirms a cut to the global store only once every one of its instances
// applied it, so that the capacity never reaches the other region while an
// instance of the first still spends it.

import (
	"sync"
	"sync/atomic"
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

// The cut's own margin, as the global store sees it: eu reports the share
// it had before a cut as held for two polls and twice the regional timeout
// after publishing the cut, whatever the phase of its coordinator's ticks.
// Sync interval 2 s (polls every 500 ms) and a regional timeout of 100 ms
// make the margin 1.2 s, of which the polls are 1 s: a margin of the
// timeouts alone is confirmed within a poll and a global round trip of
// them (about 0.8 s).
func TestGlobalCutIsConfirmedNoSoonerThanTheMargin(t *testing.T) {
	const margin = 2*500*time.Millisecond + 2*100*time.Millisecond
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: 2 * time.Second, lease: 10 * time.Second, timeout: 100 * time.Millisecond}, nil)
	f.waitContact()
	eu, us := f.regions[0], f.regions[1]
	ctx := t.Context()
	published := func() int64 { // eu's share of k as its coordinator published it
		v, err := eu.redis.Client().HGet(ctx, "tally:global{r}.shares:"+globalZone, "k").Int64()
		if err != nil {
			return eu.regions[0].Weight()
		}
		return v
	}
	held := func() int64 { // what the global store counts as eu's
		v, _ := f.global.Client().HGet(ctx, "tally:g.z:"+globalZone+":k", "a.eu").Int64()
		return v
	}
	var usWants atomic.Bool
	defer countEvery(25*time.Millisecond, func(n int) {
		if usWants.Load() {
			us.regions[n%2].Count(globalZone, "k", false, 1)
		} else {
			eu.regions[n%2].Count(globalZone, "k", false, 1)
		}
	})()
	if err := waitUntil(20*time.Second, func() bool { return held() >= distributed.ShareScale*9/10 }); err != nil {
		t.Fatalf("eu was not raised to 90%% of k: it holds %d", held())
	}
	before := held()
	usWants.Store(true)
	var cut time.Time
	if err := waitUntil(20*time.Second, func() bool {
		if cut.IsZero() && published() < before {
			cut = time.Now()
		}
		return held() < before
	}); err != nil || cut.IsZero() {
		t.Fatalf("eu's cut was not published and confirmed: published %d, held %d of k (%v)", published(), held(), err)
	}
	gap := time.Since(cut)
	t.Logf("eu's cut from %d was confirmed %v after it was published (the margin: %v)", before, gap.Round(time.Millisecond), margin)
	if gap < margin-50*time.Millisecond {
		t.Errorf("eu's cut was confirmed %v after it was published, within the margin %v: an instance that missed a poll may still apply the old share", gap.Round(time.Millisecond), margin)
	}
}
