package tests

// What a move of demand between regions costs in capacity: while a key's
// shares move, the region losing it is cut at once and the region gaining
// it is raised only once the cut is confirmed (Σ shares ≤ 1 at every
// instant); the limit left unused meanwhile is the cost. The region
// waiting on the cut syncs at every poll until the cut's confirmation
// grants its raise, instead of at its next interval.

import (
	"sync"
	"testing"
	"time"
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
