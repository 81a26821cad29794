package tests

// What a move of demand between regions costs in capacity: while a key's
// shares move, the region losing it is cut at once and the region gaining
// it is raised only once the cut is confirmed (Σ shares ≤ 1 at every
// instant); the limit left unused meanwhile is the cost. The region
// waiting on the cut syncs at every poll until the cut's confirmation
// grants its raise, instead of at its next interval.

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/distributed"
)

func TestGlobalMoveKeepsTheLimitInUse(t *testing.T) {
	t.Parallel()
	const interval = time.Second
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: interval, lease: 10 * time.Second}, nil)
	for _, r := range f.regions {
		r.proxy.SetLatency(50*time.Millisecond, 50*time.Millisecond)
	}
	f.waitContact()
	// Σ shares in use, sampled every 100 ms.
	type sample struct {
		at  time.Time
		sum int64
	}
	var samples []sample
	var smu sync.Mutex
	defer countEvery(100*time.Millisecond, func(int) {
		s := sample{at: time.Now(), sum: f.share(0, "k") + f.share(1, "k")}
		smu.Lock()
		samples = append(samples, s)
		smu.Unlock()
	})()
	const phase = 16 * time.Second
	var wg sync.WaitGroup
	stop := make(chan struct{})
	f.drive(0, "k", 15, stop, &wg) // eu alone
	time.Sleep(phase)
	moved := time.Now()
	f.drive(1, "k", 15, stop, &wg) // then both
	time.Sleep(phase)
	close(stop)
	wg.Wait()
	end := time.Now()

	f.mu.Lock()
	in := func(from, to time.Time) (n int64) {
		for _, a := range f.admitted {
			for _, at := range a {
				if at >= from.UnixNano() && at < to.UnixNano() {
					n++
				}
			}
		}
		return n
	}
	whole, last := in(moved, end), in(end.Add(-6*time.Second), end)
	f.mu.Unlock()
	smu.Lock()
	var during, after, nd, na int64
	for _, s := range samples {
		switch {
		case s.at.After(moved) && s.at.Before(moved.Add(4*interval)):
			during, nd = during+s.sum, nd+1
		case s.at.After(moved.Add(4 * interval)):
			after, na = after+s.sum, na+1
		}
	}
	smu.Unlock()
	perSecond := int64(time.Second) / globalLimit.EmissionInterval
	t.Logf("both regions admitted %d in the %v after the move (limit %d, burst %d), %d in its last 6 s (limit %d); mean Σ shares %d ppm in the 4 s after the move, %d after",
		whole, phase, perSecond*16, globalLimit.Burst, last, perSecond*6, during/max(1, nd), after/max(1, na))
	if want := perSecond * 16 * 3 / 4; whole < want {
		t.Errorf("both regions admitted %d in the %v that starts with the move, want at least 75%% of the limit (%d)", whole, phase, want)
	}
	if want := perSecond * 6 * 9 / 10; last < want {
		t.Errorf("both regions admitted %d in the last 6 s of contention, want at least 90%% of the limit (%d)", last, want)
	}
	f.checkBound(time.Second, 3*time.Second, 10*time.Second)
}

// The region whose raise waits on a cut collects it within a poll of the
// cut's confirmation, not at its next interval. With sync_interval 6s the
// losing region confirms its cut 3.4 s (its margin: two polls and twice the
// regional timeout) and a few round trips after the gaining region
// reported its demand; the gaining region's next regular sync is an
// interval after that report, 1 to 2.5 s after the confirmation.
func TestGlobalRaiseIsCollectedAtTheCutsConfirmation(t *testing.T) {
	t.Parallel()
	const interval = 6 * time.Second
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: interval, lease: 30 * time.Second}, nil)
	for _, r := range f.regions {
		r.proxy.SetLatency(5*time.Millisecond, 5*time.Millisecond)
	}
	f.waitContact()
	// Demand as denials counted (no decisions): eu's from now on, us's
	// once usDemands is set.
	var usDemands atomic.Bool
	defer countEvery(50*time.Millisecond, func(n int) {
		f.regions[0].regions[n%2].Count(globalZone, "k", false, 1)
		if usDemands.Load() {
			f.regions[1].regions[n%2].Count(globalZone, "k", false, 1)
		}
	})()
	f.waitShare(0, "k", distributed.ShareScale*9/10, 8*interval)
	g, ctx := f.global.Client(), t.Context()
	field := func(name string) int64 {
		v, _ := g.HGet(ctx, "tally:g.z:"+globalZone+":k", name).Int64()
		return v
	}
	var coord *distributed.Region
	waitFor(t, 10*time.Second, "an eu coordinator", func() bool {
		for _, r := range f.regions[0].regions {
			if r.Stats().Coordinating.Load() {
				coord = r
			}
		}
		return coord != nil
	})
	// eu's next sync waits until us reported its demand, so that eu hears
	// of its cut at once and confirms it a margin later.
	release := <-coord.HoldNextSync()
	usDemands.Store(true)
	waitFor(t, 3*interval, "us's demand in the global store", func() bool { return field("d.us") == distributed.ShareScale })
	changes := func() (n, syncs int64) {
		for _, r := range f.regions[1].regions {
			n += r.Stats().ShareChanges.Load()
			syncs += r.Stats().Syncs.Load()
		}
		return n, syncs
	}
	before, syncsBefore := changes()
	var syncs int64
	close(release)
	// When eu's confirmation reached the global store, and when us's
	// coordinator applied the raise it granted (polled together: the
	// raise may come within milliseconds).
	var confirmed, raised time.Time
	waitFor(t, 3*interval, "eu's confirmation of its cut and us's raise", func() bool {
		if a := field("a.eu"); confirmed.IsZero() && a > 0 && a <= distributed.ShareScale*55/100 {
			confirmed = time.Now()
		}
		if n, s := changes(); n > before {
			raised, syncs = time.Now(), s-syncsBefore
		}
		return !raised.IsZero()
	})
	if confirmed.IsZero() {
		confirmed = raised
	}
	took := raised.Sub(confirmed)
	t.Logf("us collected its raise %v after eu confirmed its cut (a poll: %v), with the %d syncs since it reported its demand", took, interval/4, syncs)
	// eu confirms 3.4 s (its margin) to 4.9 s (and a poll) after us
	// reported its demand: us syncs at its polls in between, not only an
	// interval after its report.
	if syncs < 2 {
		t.Errorf("us collected its raise with the %d syncs since it reported its demand, want it to sync at its polls while it waits (2 or more)", syncs)
	}
	if bound := interval/4 + 400*time.Millisecond; took > bound {
		t.Errorf("us collected its raise %v after eu confirmed its cut, want within a poll and a round trip (%v)", took, bound)
	}
}
