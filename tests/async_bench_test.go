package tests

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// BenchmarkAsyncDecide measures an async-mode decision on a key the store
// already holds (no Redis call on the path; the sync loop runs against a
// real redis-server meanwhile), beside the local zones.Table step on the
// same keys in the same run. Parallel, every decision allowed.
//
// The active set is asyncBenchKeys: every sync sends one script call per
// active key, so an instance with far more keys active per interval than
// Redis runs scripts (about 100k per interval at 100ms) cannot keep its
// view fresh and its zones fall back to their fail policy.
//
//	go test -run '^$' -bench AsyncDecide -benchmem .
func BenchmarkAsyncDecide(b *testing.B) {
	const asyncBenchKeys = 1000
	srv := startRedis(b)
	ctx := context.Background()
	store, err := distributed.OpenAsync(distributed.Options{Addresses: []string{srv.Addr}, Mode: "async",
		Timeout: time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	limit := algorithms.NewLimit(localEvents, int64(time.Second), 0)
	keys := localBenchKeys()[:asyncBenchKeys]
	for _, k := range keys {
		if _, err := stepDecide(store, ctx, "bench", k, limit, 1); err != nil {
			b.Fatal(err)
		}
	}
	table := zones.NewTable(zones.DefaultMaxKeys)

	b.Run("async", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := keys[next.Add(1)%uint64(len(keys))]
				if r, err := stepDecide(store, ctx, "bench", k, limit, 1); err != nil || !r.Allowed {
					b.Errorf("async decide: %+v, %v", r, err)
					return
				}
			}
		})
	})
	// The zone's path on top of the store's: its deny cache, kept in the
	// key's record since issue 23, is read before each decision.
	cfg := zones.Config{Name: "bench", Events: localEvents, Window: time.Second}
	state := zones.NewState(cfg, time.Minute)
	defer state.Destruct()
	zone := mustZone(cfg, state, store)
	b.Run("async-zone", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := keys[next.Add(1)%uint64(len(keys))]
				if d := zone.Decide(ctx, k, monotime.Now()); !d.Allowed {
					b.Errorf("async zone decide: %+v", d)
					return
				}
			}
		})
	})
	b.Run("local-table", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := keys[next.Add(1)%uint64(len(keys))]
				if !table.Decide(k, time.Now().UnixNano(), limit, 1, 0).Allowed {
					b.Error("local decide denied")
					return
				}
			}
		})
	})
}
