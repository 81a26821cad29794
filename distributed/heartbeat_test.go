package distributed

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Beats from the loop and from callers run one at a time, so the count is
// the reply of the last beat Redis ran and never goes back to an older view
// of the fleet (two beats in flight at once ran in Redis in the opposite
// order of their numbers, and the older view, applied last, handed a store
// a fresh share of B/2 with 3 instances live).
func TestHeartbeatsRunOneAtATimeSoTheCountIsTheLastBeatsReply(t *testing.T) {
	var b beats
	var n atomic.Int64
	var inFlight, ran, overlaps, backwards atomic.Int64
	const goroutines, each = 8, 250
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				before := n.Load()
				// The reply to a beat is how many beats Redis ran by then:
				// a later beat always sees more.
				_, _ = b.run(&n, func() (int64, error) {
					if inFlight.Add(1) > 1 {
						overlaps.Add(1)
					}
					v := ran.Add(1)
					runtime.Gosched()
					inFlight.Add(-1)
					return v, nil
				})
				if n.Load() < before {
					backwards.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if k := overlaps.Load(); k > 0 {
		t.Errorf("%d beats ran while another was in flight", k)
	}
	if k := backwards.Load(); k > 0 {
		t.Errorf("the count went back to an older beat's %d times", k)
	}
	if got := n.Load(); got != goroutines*each {
		t.Errorf("after every beat the count is %d, want %d (the last beat's reply)", got, goroutines*each)
	}
}

// A failed beat leaves the count alone; a reply of 0 counts this instance.
func TestFailedHeartbeatKeepsTheCountAndZeroCountsThisInstance(t *testing.T) {
	var b beats
	var n atomic.Int64
	if got, err := b.run(&n, func() (int64, error) { return 3, nil }); err != nil || got != 3 || n.Load() != 3 {
		t.Fatalf("beat replying 3: %d, %v (stored %d), want 3", got, err, n.Load())
	}
	fail := errors.New("no answer")
	if _, err := b.run(&n, func() (int64, error) { return 0, fail }); !errors.Is(err, fail) || n.Load() != 3 {
		t.Fatalf("failed beat: %v (stored %d), want its error and 3 kept", err, n.Load())
	}
	if got, err := b.run(&n, func() (int64, error) { return 0, nil }); err != nil || got != 1 || n.Load() != 1 {
		t.Fatalf("beat replying 0: %d, %v (stored %d), want 1 (this instance)", got, err, n.Load())
	}
}
