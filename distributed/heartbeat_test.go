package distributed

import (
	"sync"
	"sync/atomic"
	"testing"
)

// A heartbeat reply that arrives after the reply to a later beat describes an
// older fleet: it must not overwrite the count (it handed a store a fresh
// share of B/1 right after the store had seen 3 instances).
func TestLateHeartbeatReplyDoesNotOverwriteALaterOne(t *testing.T) {
	var b beats
	var n atomic.Int64
	if got := b.apply(2, 3, &n); got != 3 || n.Load() != 3 {
		t.Fatalf("reply to beat 2: count %d (stored %d), want 3", got, n.Load())
	}
	if got := b.apply(1, 1, &n); got != 3 || n.Load() != 3 {
		t.Fatalf("late reply to beat 1 after beat 2's: count %d (stored %d), want 3 kept", got, n.Load())
	}
	if got := b.apply(3, 2, &n); got != 2 || n.Load() != 2 {
		t.Fatalf("reply to beat 3: count %d (stored %d), want 2", got, n.Load())
	}
	if got := b.apply(4, 0, &n); got != 1 {
		t.Fatalf("a reply of 0 instances: count %d, want at least 1 (this one)", got)
	}
}

// Beats applied from many goroutines in any order end with the reply to the
// last beat sent, and the count never moves back to an earlier beat's.
func TestHeartbeatRepliesInAnyOrderEndWithTheLastBeat(t *testing.T) {
	var b beats
	var n atomic.Int64
	const beatsSent = 2000
	var wg sync.WaitGroup
	var backwards atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			// Each goroutine applies its beats in descending order, so
			// late replies are the rule; the reply to beat s says s.
			for s := beatsSent - g; s > 0; s -= 8 {
				before := n.Load()
				b.apply(uint64(s), int64(s), &n)
				if after := n.Load(); after < before {
					backwards.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := n.Load(); got != beatsSent {
		t.Errorf("after every reply the count is %d, want %d (the last beat's)", got, beatsSent)
	}
	if k := backwards.Load(); k > 0 {
		t.Errorf("the count moved back to an older beat's %d times", k)
	}
}
