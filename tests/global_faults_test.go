package tests

// Multi-region budgets under faults of the global store and its links:
// hung, cut past the lease, replies dropped, restarted empty, and a stale
// coordinator. Each bounds Σ shares ≤ 1 by sampling every instance's
// applied share every 20 ms.

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

const testInterval = 200 * time.Millisecond

// demandIn makes region i hold 90% of key and keeps it demanding until
// the returned stop is called.
func (f *globalFleet) demandIn(i int, key string) (stop func()) {
	f.t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	f.drive(i, key, 40, done, &wg)
	f.waitShare(i, key, distributed.ShareScale*9/10, 10*time.Second)
	return func() { close(done); wg.Wait() }
}

// sumGuard samples Σ shares of key until the returned check is called,
// which fails the test if the sum ever exceeded the whole limit.
func (f *globalFleet) sumGuard(key string) (check func()) {
	var wg sync.WaitGroup
	var worst atomic.Int64
	stop := make(chan struct{})
	f.sampleShares(key, stop, &wg, &worst)
	return func() {
		f.t.Helper()
		close(stop)
		wg.Wait()
		if w := worst.Load(); w > distributed.ShareScale {
			f.t.Errorf("the regions' shares of %s summed to %d ppm, over the whole limit (%d)", key, w, distributed.ShareScale)
		}
	}
}

func TestGlobalStoreHungFreezesShares(t *testing.T) {
	t.Parallel() // 30 s, with the other faults at their real length
	logger, logs := observedLogger()
	// A lease longer than the hang (30 s, as the issue has it): shares
	// freeze, and no region falls to its floor. The regional timeout is
	// 1 s, not 200 ms: an instance that cannot poll its regional Redis for
	// the confirmation margin (2 polls + 2 timeouts) rightly holds its
	// floor, and a loaded machine stalls a poll past 500 ms; this test is
	// about the global store.
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: testInterval, lease: time.Minute, timeout: time.Second}, logger)
	f.waitContact()
	stop := f.demandIn(0, "k")
	defer stop()
	check := f.sumGuard("k")
	held := f.share(0, "k")
	before := f.decisionLatency(0, "other")
	for _, r := range f.regions {
		r.proxy.Hang()
	}
	// Demand in us meanwhile: it must get nothing, and eu keep its share.
	var wg sync.WaitGroup
	usStop := make(chan struct{})
	f.drive(1, "k", 40, usStop, &wg)
	deadline := time.Now().Add(30 * time.Second)
	during := f.decisionLatency(0, "other")
	// The decisions never wait on the global store (a sync waits up to
	// its timeout, 1 s): the margin is for a loaded machine.
	t.Logf("median decision latency in eu: %v before the hang, %v during it", before, during)
	if during > 2*before+50*time.Millisecond {
		t.Errorf("median decision latency in eu rose from %v to %v while the global store hung", before, during)
	}
	for time.Now().Before(deadline) {
		if s := f.share(0, "k"); s != held {
			t.Fatalf("eu's share moved from %d to %d while the global store hung", held, s)
		}
		if s := f.share(1, "k"); s > distributed.ShareScale-held {
			t.Fatalf("us's share rose to %d while the global store hung", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range f.regions {
		r.proxy.Unhang()
	}
	close(usStop)
	wg.Wait()
	check()
	// One WARN and one INFO per region's coordinator for the outage.
	deadline = time.Now().Add(5 * time.Second)
	for logs.FilterMessageSnippet("global store reachable again").Len() < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := logs.FilterMessageSnippet("global store unreachable").Len(); n != 2 {
		t.Errorf("%d WARN lines for the outage, want one per region (2)", n)
	}
	if n := logs.FilterMessageSnippet("global store reachable again").Len(); n != 2 {
		t.Errorf("%d INFO lines for the end of the outage, want one per region (2)", n)
	}
}

// decisionLatency is the median time of 51 decisions of key in region i
// (any error, that is a decision a fail policy would have taken, fails
// the test).
func (f *globalFleet) decisionLatency(i int, key string) time.Duration {
	f.t.Helper()
	var took []time.Duration
	for n := range 51 {
		start := time.Now()
		if _, err := stepDecide(f.regions[i].shared[n%2], context.Background(), globalZone, key, globalLimit, 1); err != nil {
			f.t.Fatalf("region %s: decision failed (a fail policy would have decided): %v", f.regions[i].name, err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2]
}

func TestGlobalRegionCutPastLeaseFallsToFloorAndOthersGainAfterTwoLeases(t *testing.T) {
	const lease = 2 * time.Second
	f := startGlobalFleet(t, testInterval, lease)
	f.waitContact()
	stop := f.demandIn(0, "k")
	stop()
	check := f.sumGuard("k")
	f.regions[0].proxy.Cut()
	cut := time.Now()
	var wg sync.WaitGroup
	usStop := make(chan struct{})
	f.drive(1, "k", 40, usStop, &wg)
	defer func() { close(usStop); wg.Wait() }()
	floor := distributed.ShareScale / 2 / 10
	// eu falls to its floor a lease after its last contact, the last sync
	// it sent before the cut: not before lease − one sync interval and
	// its round trip (up to 400 ms), not long after lease.
	for f.share(0, "k") > int64(floor) {
		if time.Since(cut) > lease+time.Second {
			t.Fatalf("eu still holds %d of k %v after it was cut off (lease %v)", f.share(0, "k"), time.Since(cut), lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if took := time.Since(cut); took < lease-testInterval-400*time.Millisecond {
		t.Errorf("eu fell to its floor %v after it was cut off, before its lease (%v) ran out", took, lease)
	}
	// us gains eu's share only 2 × lease after eu's last contact.
	for f.share(1, "k") < distributed.ShareScale*9/10 {
		if time.Since(cut) > 2*lease+3*time.Second {
			t.Fatalf("us holds %d of k %v after eu was cut off (2 × lease = %v)", f.share(1, "k"), time.Since(cut), 2*lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if took := time.Since(cut); took < 2*lease-testInterval-400*time.Millisecond {
		t.Errorf("us gained eu's share %v after eu was cut off, before 2 × lease (%v)", took, 2*lease)
	} else {
		t.Logf("eu cut off: us reached 90%% of k after %v (2 × lease = %v)", took, 2*lease)
	}
	check()
	f.regions[0].proxy.Uncut()
}

// A fifth of the global store's replies lost for a minute while the demand
// moves between the regions every 5 s: Σ shares ≤ 1 throughout (sampled
// every 20 ms), and the fleet within the strict bound.
func TestGlobalDroppedRepliesKeepSharesWithinTheLimit(t *testing.T) {
	t.Parallel() // 60 s, with the other faults at their real length
	f := startGlobalFleet(t, testInterval, 5*time.Second)
	f.waitContact()
	check := f.sumGuard("k")
	for _, r := range f.regions {
		r.proxy.DropReplies(0.2)
	}
	var wg sync.WaitGroup
	for n := range 12 {
		stop := make(chan struct{})
		f.drive(n%2, "k", 40, stop, &wg)
		time.Sleep(5 * time.Second)
		close(stop)
		wg.Wait()
	}
	for _, r := range f.regions {
		r.proxy.DropReplies(0)
	}
	check()
	f.checkBound(time.Second, 3*time.Second, 10*time.Second)
	// The allocation still follows demand once replies get through.
	stop := f.demandIn(1, "k")
	stop()
}

func TestGlobalStoreRestartedEmptyRelearnsBeforeGranting(t *testing.T) {
	f := startGlobalFleet(t, testInterval, 5*time.Second)
	f.waitContact()
	stop := f.demandIn(0, "k")
	stop()
	check := f.sumGuard("k")
	f.regions[0].proxy.Hang() // eu cannot re-register for now
	f.global.Kill()
	f.global.Start() // same port, no state
	// us demands at once: the new store does not know that eu holds 95%,
	// and must grant us nothing beyond what it holds until eu is back (or
	// a lease has passed).
	var wg sync.WaitGroup
	usStop := make(chan struct{})
	f.drive(1, "k", 40, usStop, &wg)
	time.Sleep(1500 * time.Millisecond)
	f.regions[0].proxy.Unhang()
	f.waitShare(1, "k", distributed.ShareScale*9/10, 10*time.Second)
	close(usStop)
	wg.Wait()
	check()
	f.checkBound(time.Second, 3*time.Second)
}

func TestGlobalStaleCoordinatorIsFenced(t *testing.T) {
	// A regional timeout of 1 s, not 200 ms: the few decisions of this
	// test are too few for the fleet's 1 in 50 that a loaded machine's
	// regional Redis may answer late, and fencing is about the global store.
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: testInterval, lease: 5 * time.Second, timeout: time.Second}, nil)
	f.waitContact()
	eu := f.regions[0]
	var a, b *distributed.Region
	for _, r := range eu.regions {
		if r.Stats().Coordinating.Load() {
			a = r
		} else {
			b = r
		}
	}
	if a == nil || b == nil {
		t.Fatal("eu has no single coordinator")
	}
	held := a.HoldNextSync() // a freezes mid-sync, as under SIGSTOP
	release := <-held
	// Its lock (3 × sync_interval + the global timeout) runs out; b takes over and syncs.
	deadline := time.Now().Add(5 * time.Second)
	for !b.Stats().Coordinating.Load() || b.Stats().Contacts.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b did not take over from the frozen coordinator")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release) // a wakes up and sends its sync with its old token
	for a.Stats().Fenced.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the global store took the stale coordinator's sync (syncs %d, answered %d, failed %d)", a.Stats().Syncs.Load(), a.Stats().Contacts.Load(), a.Stats().Failures.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a.Stats().Coordinating.Load() {
		t.Error("the fenced coordinator still thinks it coordinates")
	}
	// The region goes on: b serves demand.
	stop := f.demandIn(0, "k")
	stop()
}

func TestGlobalInstanceThatCannotReadItsRegionsSharesHoldsItsFloor(t *testing.T) {
	f := startGlobalFleet(t, testInterval, 5*time.Second)
	f.waitContact()
	stop := f.demandIn(0, "k")
	stop()
	eu := f.regions[0]
	// One eu instance's link to its regional Redis hangs: it could miss
	// a cut, which the coordinator confirms after its margin.
	eu.links[1].Hang()
	defer eu.links[1].Unhang()
	hung := time.Now()
	floor := int64(distributed.ShareScale / 2 / 10)
	for eu.regions[1].Share(globalZone, "k") != floor {
		if time.Since(hung) > 2*time.Second {
			t.Fatalf("an instance that cannot read its region's shares still applies %d of k after %v", eu.regions[1].Share(globalZone, "k"), time.Since(hung))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := eu.regions[0].Share(globalZone, "k"); s <= floor {
		t.Errorf("the instance that still reads them applies %d, its floor too", s)
	}
}

// A region's own Redis stopped: a scope global zone takes its fail policy
// as any zone does: open admits, closed denies, local admits this
// instance's part of the region's default share (its weight, 1/2, between
// the region's 2 instances: a burst of 20/4 = 5), starting fresh. The
// other region goes on deciding in its own Redis.
func TestGlobalRegionalRedisDownTakesEachFailPolicy(t *testing.T) {
	f := startGlobalFleet(t, 200*time.Millisecond, 2*time.Second)
	f.waitContact()
	eu := f.regions[0]
	for _, s := range eu.shared {
		waitFor(t, 5*time.Second, "eu's instances to see each other", func() bool { return s.Instances() >= 4 })
	}
	eu.redis.Kill()
	now := monotime.Now()
	for _, tc := range []struct {
		policy  zones.FailPolicy
		allowed int
		src     zones.Source
	}{
		{zones.FailOpen, 25, zones.SourceFailOpen},
		{zones.FailClosed, 0, zones.SourceFailClosed},
		{zones.FailLocal, 5, zones.SourceFailLocal},
	} {
		cfg := zones.Config{Name: globalZone, Events: 600, Window: time.Minute, Burst: 20, FailPolicy: tc.policy}
		state := zones.NewState(cfg, time.Minute)
		t.Cleanup(func() { state.Destruct() })
		z := mustZone(cfg, state, eu.shared[0])
		allowed := 0
		for i := range 25 {
			d := z.Decide(context.Background(), "k-"+tc.policy.String(), now)
			if d.Source != tc.src && !(tc.policy == zones.FailLocal && !d.Allowed) {
				t.Errorf("%s: decision %d from %v, want %v", tc.policy, i, d.Source, tc.src)
			}
			if d.Allowed {
				allowed++
			}
		}
		if allowed != tc.allowed {
			t.Errorf("fail_policy %s with eu's Redis down: %d of 25 allowed, want %d", tc.policy, allowed, tc.allowed)
		}
	}
	// us decides in its own Redis meanwhile.
	if r, err := stepDecide(f.regions[1].shared[0], context.Background(), globalZone, "k-us", globalLimit, 1); err != nil || !r.Allowed {
		t.Errorf("us with eu's Redis down: %+v, %v; want allowed from its Redis", r, err)
	}
}
