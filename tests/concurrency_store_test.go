package tests

// The Redis side of concurrency zones, through distributed.Strict against a
// real redis-server: slots, their TTLs, renewals and releases.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/distributed"
)

// Many goroutines of two stores (two instances) acquire and release slots of
// one key for 2.5s, while each store's loop renews (lease 3s: every second)
// and releases: never more than the limit held at once, and nothing left in
// Redis afterwards.
func TestSlotStoreNeverHoldsMoreThanTheLimitUnderRace(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	opts := distributed.Options{Addresses: []string{rs.Addr}, Timeout: 2 * time.Second}
	stores := []*distributed.Strict{openStore(t, opts, nil), openStore(t, opts, nil)}
	ctx := context.Background()
	var inFlight, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(2500 * time.Millisecond)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%2]
			for time.Now().Before(end) {
				id, inUse, err := s.Acquire(ctx, "z", "k", 3, 3*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if id == "" {
					if inUse < 3 {
						t.Errorf("denied with %d slots in use, limit 3", inUse)
					}
					continue
				}
				admitted.Add(1)
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(5 * time.Millisecond)
				inFlight.Add(-1)
				s.Release("z", "k", id)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > 3 {
		t.Fatalf("%d slots held at once, limit 3", p)
	}
	if admitted.Load() < 3 {
		t.Fatalf("only %d acquisitions succeeded", admitted.Load())
	}
	rc := rs.Client()
	waitFor(t, 5*time.Second, "every slot to leave Redis", func() bool {
		n, err := rc.Exists(ctx, "tally:z:k").Result()
		return err == nil && n == 0
	})
}

// A slot's key carries a TTL of its lease; renewals push it on while the slot
// is held; a release removes it at once.
func TestSlotStoreRenewsHeldSlotsAndReleasesPromptly(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{rs.Addr}, Timeout: 2 * time.Second}, nil)
	ctx := context.Background()
	rc := rs.Client()
	id, inUse, err := s.Acquire(ctx, "z", "k", 1, time.Second)
	if err != nil || id == "" || inUse != 1 {
		t.Fatalf("Acquire: %q %d %v", id, inUse, err)
	}
	if ttl := rc.PTTL(ctx, "tally:z:k").Val(); ttl <= 0 || ttl > time.Second {
		t.Fatalf("slot key TTL %v, want (0, 1s]", ttl)
	}
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n, _ := s.Slots(ctx, "z", "k"); n != 1 {
			t.Fatalf("a held slot of lease 1s is gone after renewals were due (%d in use)", n)
		}
		if id2, _, _ := s.Acquire(ctx, "z", "k", 1, time.Second); id2 != "" {
			t.Fatal("a second slot was given at limit 1")
		}
		time.Sleep(100 * time.Millisecond)
	}
	released := time.Now()
	s.Release("z", "k", id)
	waitFor(t, 2*time.Second, "the released slot to leave Redis", func() bool {
		return rc.Exists(ctx, "tally:z:k").Val() == 0
	})
	if took := time.Since(released); took > 500*time.Millisecond {
		t.Fatalf("release took %v to reach Redis", took)
	}
	if held, pending := s.HeldSlots(); held != 0 || pending != 0 {
		t.Fatalf("after release: %d held, %d pending", held, pending)
	}
}
