package zones

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// smooth is the zone: 5 per second, burst 1, delay 3s.
func smooth(queue int64) Config {
	return Config{Name: "smooth", Events: 5, Window: time.Second, Burst: 1, Delay: 3 * time.Second, Queue: queue}
}

func TestDelayAdmitsForLaterUpToTheDelay(t *testing.T) {
	c := smooth(0)
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	const T = 200 * time.Millisecond
	var delays []time.Duration
	for i := range 20 {
		d := z.Decide(context.Background(), "k", now)
		if !d.Allowed {
			if d.RetryAfter <= c.Delay || d.QueueFull {
				t.Fatalf("request %d denied with retry %v (queue full %v): within the delay", i, d.RetryAfter, d.QueueFull)
			}
			continue
		}
		delays = append(delays, d.Delay)
	}
	// One at once, then one per 200ms up to 3s: 15 more.
	if len(delays) != 16 {
		t.Fatalf("%d admitted, want 16 (1 at once and 15 within 3s)", len(delays))
	}
	for i, d := range delays {
		if want := time.Duration(i) * T; d != want {
			t.Errorf("request %d waits %v, want %v", i, d, want)
		}
	}
	if n := z.Waiting(); n != 15 {
		t.Errorf("%d waiting, want 15 (the one at once holds no queue place)", n)
	}
	for range 15 {
		z.EndWait()
	}
	if n := z.Waiting(); n != 0 {
		t.Errorf("%d waiting after every wait ended", n)
	}
}

func TestDelayRefundGivesTheTurnBack(t *testing.T) {
	c := smooth(0)
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	z.Decide(context.Background(), "k", now) // at once
	z.Decide(context.Background(), "k", now) // +200ms
	gone := z.Decide(context.Background(), "k", now)
	if gone.Delay != 400*time.Millisecond {
		t.Fatalf("third request waits %v, want 400ms", gone.Delay)
	}
	// Its client goes away: the slot comes back, the next request takes
	// the turn it had.
	if _, err := z.RefundWith(context.Background(), "k", now, gone, &z.plan, 1); err != nil {
		t.Fatal(err)
	}
	z.EndWait()
	if d := z.Decide(context.Background(), "k", now); d.Delay != 400*time.Millisecond {
		t.Errorf("after the refund the next request waits %v, want 400ms (600ms without the refund)", d.Delay)
	}
}

// TestDelayQueueHoldsUnderConcurrency decides from many goroutines at once
// on a zone whose queue is 3: never more than 3 wait, and every request
// whose turn was within the delay but found no place is denied as a full
// queue.
func TestDelayQueueHoldsUnderConcurrency(t *testing.T) {
	c := smooth(3)
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	var wg sync.WaitGroup
	var delayed, atOnce, full, most atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				d := z.Decide(context.Background(), "k", now)
				switch {
				case d.Allowed && d.Delay > 0:
					delayed.Add(1)
					if n := z.Waiting(); n > most.Load() {
						most.Store(n) // racy max: only ever an under-estimate
					}
					if n := z.Waiting(); n > 3 {
						t.Errorf("%d waiting, queue 3", n)
					}
				case d.Allowed:
					atOnce.Add(1)
				case d.QueueFull:
					full.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if atOnce.Load() != 1 || delayed.Load() != 3 {
		t.Errorf("%d at once and %d delayed, want 1 and 3 (queue 3)", atOnce.Load(), delayed.Load())
	}
	if n := z.Waiting(); n != 3 {
		t.Errorf("%d waiting, want 3", n)
	}
	// The key holds exactly the 4 admitted: with the queue freed the next
	// turn is 4 intervals away.
	for range 3 {
		z.EndWait()
	}
	if d := z.Decide(context.Background(), "k", now); !d.Allowed || d.Delay != 800*time.Millisecond {
		t.Errorf("after the queue emptied: %+v, want a wait of 800ms", d)
	}
	if full.Load() == 0 {
		t.Error("no request was denied for a full queue")
	}
}

func TestDelayStoreDenialIsCachedOnlyUntilATurnIsWithinTheDelay(t *testing.T) {
	c := smooth(0)
	st := &faultStore{} // denies with a retry of 30s
	z := mustNew(c, newTestState(t, c), st)
	now := monotime.Now()
	d := z.Decide(context.Background(), "k", now)
	if d.Allowed || d.RetryAfter != 30*time.Second {
		t.Fatalf("%+v, want denied for 30s", d)
	}
	// Cached until 27s: then a request could be admitted for later.
	if d := z.Decide(context.Background(), "k", now+int64(26*time.Second)); d.Source != SourceDenyCache || d.RetryAfter != 4*time.Second {
		t.Errorf("at 26s: %+v, want the cached denial with 4s to go", d)
	}
	// A read of the key says what its next request gets.
	if s := readKey(t, z, "k", now+int64(26*time.Second)); s.Source != SourceDenyCache || s.RetryAfter != 4*time.Second || s.Allowed {
		t.Errorf("read at 26s: %+v, want the cached denial with 4s to go", s)
	}
	z.Decide(context.Background(), "k", now+int64(27*time.Second))
	if n := st.calls.Load(); n != 2 {
		t.Errorf("store called %d times, want 2: the cache ends 3s before the retry time", n)
	}
}

func TestDelayInDryRunNeverWaits(t *testing.T) {
	c := smooth(0)
	c.DryRun = true
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	z.Decide(context.Background(), "k", now)
	if d := z.Decide(context.Background(), "k", now); d.Allowed || d.Delay != 0 || d.QueueFull {
		t.Errorf("dry run: %+v, want the denial a zone without delay gives", d)
	}
}

func TestDelayFailLocalAdmitsForLaterAtTheShare(t *testing.T) {
	c := smooth(0)
	z := mustNew(c, newTestState(t, c), &faultStore{err: errors.New("down"), instances: 2})
	now := monotime.Now()
	// Two instances: this one's share is ⌊5/2⌋ = 2 per second.
	var waits []time.Duration
	for range 3 {
		d := z.Decide(context.Background(), "k", now)
		if !d.Allowed || d.Source != SourceFailLocal {
			t.Fatalf("%+v, want admitted by the fallback", d)
		}
		waits = append(waits, d.Delay)
	}
	if waits[1] != 500*time.Millisecond || waits[2] != time.Second {
		t.Errorf("fallback waits %v, want 0, 500ms, 1s", waits)
	}
}

func TestDelayConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Name: "z", Concurrency: 2, Delay: time.Second}, "concurrency zone"},
		{Config{Name: "z", Events: 5, Window: time.Second, Delay: -time.Second}, "positive duration"},
		{Config{Name: "z", Events: 5, Window: time.Second, Delay: 2 * time.Minute}, "longer than the 1m0s"},
		{Config{Name: "z", Events: 5, Window: time.Second, Delay: time.Second, Queue: -1}, "queue must be"},
		{Config{Name: "z", Events: 5, Window: time.Second, Queue: 3}, "positive duration"},
	} {
		err := tc.c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.c, err, tc.want)
		}
	}
	if err := smooth(100).Validate(); err != nil {
		t.Errorf("the issue's zone: %v", err)
	}
}

// TestDelayTenThousandRequestsWaitAtMostTheDefaultQueue: 10,000 requests
// at once on a zone without queue, every turn within the delay (1ms apart,
// 60s): 1 passes at once, 1,000 wait (DefaultQueue), the other 8,999 are
// denied for the full queue and take nothing.
func TestDelayTenThousandRequestsWaitAtMostTheDefaultQueue(t *testing.T) {
	c := Config{Name: "flood", Events: 1000, Window: time.Second, Burst: 1, Delay: time.Minute}
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	var atOnce, delayed, full int
	for range 10_000 {
		switch d := z.Decide(context.Background(), "k", now); {
		case d.Allowed && d.Delay == 0:
			atOnce++
		case d.Allowed:
			delayed++
		case d.QueueFull:
			full++
		}
	}
	if atOnce != 1 || delayed != DefaultQueue || full != 10_000-1-DefaultQueue {
		t.Errorf("%d at once, %d waiting, %d denied for a full queue; want 1, %d, %d", atOnce, delayed, full, DefaultQueue, 10_000-1-DefaultQueue)
	}
	// Nothing was reserved for the denied: the key's next turn is right
	// after the 1,000 waiting.
	for range DefaultQueue {
		z.EndWait()
	}
	if d := z.Decide(context.Background(), "k", now); d.Delay != time.Duration(DefaultQueue+1)*time.Millisecond {
		t.Errorf("next turn %v, want %v", d.Delay, time.Duration(DefaultQueue+1)*time.Millisecond)
	}
}
