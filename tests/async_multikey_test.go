package tests

// One async.lua call syncs many keys: a sync's Redis work is a handful of
// script calls, not one per key, and an error about one key of a call
// fails that key alone.

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

func TestAsyncSyncReportsManyKeysPerScriptCall(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	const interval = 100 * time.Millisecond
	a := openAsyncStores(t, 1, srv.Addr, interval, time.Second)[0]
	waitForSyncs(t, []*distributed.Async{a}, interval)
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// 1,000 keys, each admitted 3 times from its fresh share of 10: the
	// next sync reports all of them.
	const keys = 1000
	limit := algorithms.NewLimit(10, int64(time.Hour), 0)
	for i := range keys {
		for range 3 {
			if r, err := stepDecide(a, ctx, "z", "k"+strconv.Itoa(i), limit, 1); err != nil || !r.Allowed {
				t.Fatalf("key %d: %+v, %v", i, r, err)
			}
		}
	}
	// Each key is reported (3 admitted, the rest of the share reserved as
	// its lease), in calls of up to 100 keys; closing the store hands the
	// leases back, in calls of up to 100 keys too.
	reported := settledScriptCalls(t, srv, a, interval, 1)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, calls, err := scriptStats(rdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d script calls to report %d keys, %d in all with the hand-back at Close", reported, keys, calls)
	if calls > keys/10 {
		t.Errorf("%d script calls to report %d keys and hand their leases back: want a few per 100 keys (one call per key would be %d)", calls, keys, 2*keys)
	}
	// And every key is counted in Redis: its 3 admissions are spent, its
	// lease is back.
	peek := openAsyncStores(t, 1, srv.Addr, interval, time.Second)[0]
	for i := range keys {
		r, err := stepPeek(peek, ctx, "z", "k"+strconv.Itoa(i), limit)
		if err != nil || r.Remaining != 10-3 {
			t.Fatalf("key %d in Redis: %+v, %v; want 7 remaining", i, r, err)
		}
	}
}

func TestAsyncErrorAboutOneKeyOfACallFailsThatKeyAlone(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	const interval = 100 * time.Millisecond
	a := openAsyncStores(t, 1, srv.Addr, interval, time.Second)[0]
	limit := algorithms.NewLimit(10, int64(time.Hour), 0)
	const bad = "k7"
	// A string where tally keeps a hash, written before any sync of the
	// key, so the sync that reports all 20 keys in one call meets it.
	if err := rdb.Set(ctx, a.RedisKey("z", bad), "not tally's", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if r, err := stepDecide(a, ctx, "z", "k"+strconv.Itoa(i), limit, 1); err != nil || !r.Allowed {
			t.Fatalf("key %d: %+v, %v", i, r, err)
		}
	}
	waitFor(t, 10*time.Second, "the foreign value to be deleted by a sync", func() bool {
		n, err := rdb.Exists(ctx, a.RedisKey("z", bad)).Result()
		return err == nil && n == 0
	})
	waitForSyncs(t, []*distributed.Async{a}, interval)
	var failed []string
	for i := range 20 {
		k := "k" + strconv.Itoa(i)
		if _, err := stepDecide(a, ctx, "z", k, limit, 1); err != nil {
			failed = append(failed, k)
			if errors.Is(err, distributed.ErrStale) || errors.Is(err, distributed.ErrUnavailable) {
				t.Errorf("key %s: %v, want the key's own error, not an outage", k, err)
			}
		}
	}
	if len(failed) != 1 || failed[0] != bad {
		t.Fatalf("keys whose decision failed after the sync: %v, want only %s", failed, bad)
	}
	if ok, _ := a.Health(); !ok {
		t.Errorf("a per-key error made the store unhealthy")
	}
	// The report is sent again, on a fresh key: the key is counted in
	// Redis (its 2 admissions) and decides again.
	waitFor(t, 10*time.Second, "the bad key's report to land", func() bool {
		r, err := stepPeek(a, ctx, "z", bad, limit)
		return err == nil && r.Remaining < 10-1
	})
	if r, err := stepDecide(a, ctx, "z", bad, limit, 1); err != nil || !r.Allowed {
		t.Errorf("the bad key after its report landed: %+v, %v", r, err)
	}
}
