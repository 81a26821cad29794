package zones

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// benchKeys is how many distinct keys the table benchmarks spread over: a
// busy public endpoint keyed by client IP or API key.
const benchKeys = 100_000

// makeBenchKeys returns n distinct keys of 16 bytes each, about the size of an
// IPv4 address or a short API key.
func makeBenchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%012d", i)
	}
	return keys
}

// benchConfig allows every request the benchmarks make: a key may take 1e9
// requests at once, each moving its TAT by 1ns, so now can stay fixed.
var benchConfig = Config{Name: "bench", Events: 1_000_000_000, Window: time.Second} // finer than Validate allows: only a benchmark may

// BenchmarkTableDecideExistingKey measures the local decision for a key the
// table already holds (the steady state of a busy zone): shard lookup, lock,
// GCRA step, store. Target: 0 allocs/op.
func BenchmarkTableDecideExistingKey(b *testing.B) {
	keys := makeBenchKeys(benchKeys)
	t := NewTable(DefaultMaxKeys)
	l := benchConfig.Limit()
	now := monotime.Now()
	for _, k := range keys {
		t.Decide(k, now, l, 1, 0)
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if !t.Decide(keys[i], now, l, 1, 0).Allowed {
			b.Fatal("denied: the benchmark limit is meant never to deny")
		}
		if i++; i == len(keys) {
			i = 0
		}
	}
}

// BenchmarkZoneDecideParallel measures Zone.Decide in local mode from every
// P at once over 100k existing keys, each goroutine walking the keys from its
// own random start so that goroutines rarely meet on one shard. Target: 0
// allocs/op.
func BenchmarkZoneDecideParallel(b *testing.B) { benchZoneDecideParallel(b, benchConfig) }

// BenchmarkZoneWithBanDecideParallel is BenchmarkZoneDecideParallel in a
// zone with `ban 1h` and no key banned: what a ban costs on the allowed
// path (one lookup in an empty table). Target: 0 allocs/op, within noise
// of the zone without ban.
func BenchmarkZoneWithBanDecideParallel(b *testing.B) {
	c := benchConfig
	c.Ban = time.Hour
	benchZoneDecideParallel(b, c)
}

func benchZoneDecideParallel(b *testing.B, c Config) {
	keys := makeBenchKeys(benchKeys)
	state := NewState(c, time.Hour)
	defer state.Destruct()
	z := mustNew(c, state, nil)
	ctx := context.Background()
	now := monotime.Now()
	for _, k := range keys {
		z.Decide(ctx, k, now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(keys))
		for pb.Next() {
			if !z.Decide(ctx, keys[i], now).Allowed {
				b.Error("denied: the benchmark limit is meant never to deny")
				return
			}
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
}

// BenchmarkTableBytesPerKey measures the heap a Table holds per tracked key:
// 100k keys of 16 bytes inserted into an empty table, HeapAlloc after a full
// GC before and after. It reports bytes/key (everything the table holds,
// its own copy of the key included) and table-bytes/key (the same less the
// key's bytes). Target: table-bytes/key <= 96.
//
// Each iteration builds a fresh table; -benchtime 3x is plenty.
func BenchmarkTableBytesPerKey(b *testing.B) { benchBytesPerKey(b, benchKeys) }

// BenchmarkTableBytesPerKeyAtMaxKeys is the same with 1M keys, the default
// max_keys: the table at its largest.
func BenchmarkTableBytesPerKeyAtMaxKeys(b *testing.B) { benchBytesPerKey(b, DefaultMaxKeys) }

func benchBytesPerKey(b *testing.B, n int) {
	keys := makeBenchKeys(n)
	keyBytes := 0
	for _, k := range keys {
		keyBytes += len(k)
	}
	l := benchConfig.Limit()
	now := monotime.Now()
	var total uint64
	var held int
	for b.Loop() {
		before := heapAfterGC()
		t := NewTable(DefaultMaxKeys)
		for _, k := range keys {
			t.Decide(k, now, l, 1, 0)
		}
		after := heapAfterGC()
		// At max_keys a few shards fill before the others and evict.
		if held = t.Len(); held < len(keys)*99/100 {
			b.Fatalf("table holds %d keys, want %d", held, len(keys))
		}
		runtime.KeepAlive(t)
		total += after - before
	}
	perKey := float64(total) / float64(b.N) / float64(held)
	b.ReportMetric(perKey, "bytes/key")
	b.ReportMetric(perKey-float64(keyBytes)/float64(len(keys)), "table-bytes/key")
	b.ReportMetric(0, "ns/op") // the time to build a table is not the point
}

// heapAfterGC returns the live heap after a full collection.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkQuotaZoneDecideParallel is BenchmarkZoneDecideParallel for a
// quota zone (a day of 2^40 units: never denied), to set beside it: the
// period check (an atomic load) and the packed count instead of the GCRA
// step. Target: 0 allocs/op, within a few ns/op of the rate zone's.
func BenchmarkQuotaZoneDecideParallel(b *testing.B) {
	keys := makeBenchKeys(benchKeys)
	c := Config{Name: "bench", Quota: MaxEvents, Period: algorithms.Day}
	state := NewState(c, time.Hour)
	defer state.Destruct()
	z := mustNew(c, state, nil)
	ctx := context.Background()
	for _, k := range keys {
		z.Decide(ctx, k, monotime.Now())
	}
	now := monotime.Now()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(keys))
		for pb.Next() {
			if !z.Decide(ctx, keys[i], now).Allowed {
				b.Error("denied: the benchmark quota is meant never to deny")
				return
			}
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
}
