package tests

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Async quotas: leases are taken from the period's count before they are
// spent, so the fleet never admits more than the quota, however many
// instances hammer one key; what instances hold unspent when traffic
// stops is at most a lease each, ⌈quota/(16N)⌉ units beyond the request.
func TestAsyncQuotaNeverAdmitsMoreThanTheQuota(t *testing.T) {
	srv := startRedis(t)
	stores := openAsyncStores(t, 3, srv.Addr, 50*time.Millisecond, time.Second)
	ctx := context.Background()
	const quota, callers, each = 300, 64, 20
	periods := zones.PeriodsAt(algorithms.Day, time.Now(), time.UTC)
	q := zones.QuotaLimit{Limit: quota, Periods: &periods}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				r, err := stepDecideQuota(stores[(c+i)%len(stores)], ctx, "aq", "shared", q, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	lease := int64(quota+16*3-1) / (16 * 3)
	if n := allowed.Load(); n > quota || n < quota-3*(lease+1) {
		t.Fatalf("%d allowed of %d, want at most the quota %d and at least %d (a lease each unspent)", n, callers*each, quota, quota-3*(lease+1))
	}
	// Once the stores are idle, their leases go back: Redis counts what
	// was admitted, no more.
	rdb := srv.Client()
	rkey := stores[0].QuotaKey("aq", "shared")
	waitFor(t, 5*time.Second, "idle leases to be handed back", func() bool {
		u, err := rdb.HGet(ctx, rkey, "u").Int64()
		return err == nil && u == allowed.Load()
	})
	srv.requireEveryKeyExpires(t, 1)
}

// A key one instance stops using goes back to the others: its lease is
// handed back at the next sync, so another instance may use it.
func TestAsyncQuotaIdleLeaseGoesBack(t *testing.T) {
	srv := startRedis(t)
	stores := openAsyncStores(t, 2, srv.Addr, 50*time.Millisecond, time.Second)
	ctx := context.Background()
	periods := zones.PeriodsAt(algorithms.Month, time.Now(), time.UTC)
	q := zones.QuotaLimit{Limit: 64, Periods: &periods}
	if r, err := stepDecideQuota(stores[0], ctx, "idle", "k", q, 1); err != nil || !r.Allowed {
		t.Fatalf("first decision: %+v, %v", r, err)
	}
	// Store 0 holds a lease beyond its one unit; after it hands it back,
	// store 1 may spend all 63 that are left.
	waitForSyncs(t, stores, 50*time.Millisecond)
	waitFor(t, 5*time.Second, "the idle lease to go back", func() bool {
		r, err := stepPeekQuota(stores[1], ctx, "idle", "k", q)
		return err == nil && r.Used == 1
	})
	n := 0
	for range 100 {
		if r, err := stepDecideQuota(stores[1], ctx, "idle", "k", q, 1); err == nil && r.Allowed {
			n++
		}
	}
	if n != 63 {
		t.Fatalf("the other store admitted %d, want the 63 left", n)
	}
}

// An async post-charged quota: a charge past the lease is reported at the
// next sync and counted fleet-wide; a store ends the period in debt by at
// most one charge.
func TestAsyncQuotaChargesAreCountedFleetWide(t *testing.T) {
	srv := startRedis(t)
	stores := openAsyncStores(t, 2, srv.Addr, 50*time.Millisecond, time.Second)
	ctx := context.Background()
	periods := zones.PeriodsAt(algorithms.Month, time.Now(), time.UTC)
	q := zones.QuotaLimit{Limit: 1000, Periods: &periods}
	for i := range 3 {
		r, err := stepCheckQuota(stores[0], ctx, "tokens", "k", q)
		if err != nil || !r.Allowed {
			t.Fatalf("check %d: %+v, %v", i+1, r, err)
		}
		if _, err := stepChargeQuota(stores[0], ctx, "tokens", "k", q, 400); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "the debt to reach Redis", func() bool {
		r, err := stepPeekQuota(stores[1], ctx, "tokens", "k", q)
		return err == nil && r.Used >= 1000
	})
	r, err := stepPeekQuota(stores[1], ctx, "tokens", "k", q)
	if err != nil || r.Used > 1000+400 {
		t.Fatalf("Redis counts %+v, %v; want at most the quota and one charge", r, err)
	}
	if r, err := stepCheckQuota(stores[1], ctx, "tokens", "k", q); err != nil || r.Allowed {
		t.Fatalf("the other store's check: %+v, %v; want denied", r, err)
	}
}

// Many goroutines deciding, charging, refunding and peeking many keys on
// several async stores while the syncs run: under -race.
func TestAsyncQuotaUnderConcurrency(t *testing.T) {
	srv := startRedis(t)
	stores := openAsyncStores(t, 2, srv.Addr, 20*time.Millisecond, time.Second)
	ctx := context.Background()
	periods := zones.PeriodsAt(algorithms.Hour, time.Now(), time.UTC)
	q := zones.QuotaLimit{Limit: 50, Periods: &periods}
	var wg sync.WaitGroup
	deadline := time.Now().Add(time.Second)
	for g := range 32 {
		wg.Go(func() {
			s := stores[g%2]
			for i := 0; time.Now().Before(deadline) && i < 2000; i++ {
				key := "k" + strconv.Itoa(i%7)
				switch i % 5 {
				case 0:
					_, _ = stepChargeQuota(s, ctx, "mixed", key, q, 2)
				case 1:
					_ = stepRefundQuota(s, ctx, "mixed", key, q, 1)
				case 2:
					_, _ = stepCheckQuota(s, ctx, "mixed", key, q)
				default:
					if _, err := stepDecideQuota(s, ctx, "mixed", key, q, 1); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for _, s := range stores {
		if s.Keys("mixed") > 7 {
			t.Errorf("a store holds %d records for 7 keys", s.Keys("mixed"))
		}
	}
}
