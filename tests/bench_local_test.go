package tests

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	"golang.org/x/time/rate"

	"github.com/caddy-tally/ratelimit/zones"
)

// The local benchmarks put tally's zone beside the in-process limiters people
// reach for instead, on the same workload in the same run: 100k keys of 16
// bytes, a limit high enough that every decision allows, one decision per op
// on a key already tracked, each op reading the clock once (as a request
// would). cmd/benchtable turns their output into the table of docs/performance.md.

// localKeys is how many distinct keys the local benchmarks spread over.
const localKeys = 100_000

// localEvents per second per key: far more than any key receives here, so
// every decision is the allowed path.
const localEvents = 1_000_000_000

func localBenchKeys() []string {
	keys := make([]string, localKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%012d", i)
	}
	return keys
}

// localLimiter is one contender: allow decides a unit-cost request for key
// now, creating the key's state when it has none.
type localLimiter func(key string) bool

// localContenders builds fresh, empty instances of tally and the other
// in-process limiters, each bounded the way it would be run in production
// where it can be.
var localContenders = []struct {
	name string
	new  func(tb testing.TB) localLimiter
}{
	{"tally", func(tb testing.TB) localLimiter {
		cfg := zones.Config{Name: "bench", Events: localEvents, Window: time.Second}
		state := zones.NewState(cfg, time.Hour)
		tb.Cleanup(func() { _ = state.Destruct() })
		zone := mustZone(cfg, state, nil)
		ctx := context.Background()
		return func(key string) bool {
			return zone.Decide(ctx, key, time.Now().UnixNano()).Allowed
		}
	}},
	{"x-time-rate", func(tb testing.TB) localLimiter {
		limiters := newShardedLimiters(func() *rate.Limiter {
			return rate.NewLimiter(rate.Limit(localEvents), localEvents)
		})
		return func(key string) bool {
			return limiters.get(key).AllowN(time.Now(), 1)
		}
	}},
	{"throttled", func(tb testing.TB) localLimiter {
		store, err := memstore.NewCtx(zones.DefaultMaxKeys) // LRU-bounded, like tally's max_keys
		if err != nil {
			tb.Fatal(err)
		}
		gcra, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{
			MaxRate: throttled.PerSec(localEvents), MaxBurst: localEvents,
		})
		if err != nil {
			tb.Fatal(err)
		}
		ctx := context.Background()
		return func(key string) bool {
			limited, _, err := gcra.RateLimitCtx(ctx, key, 1)
			return err == nil && !limited
		}
	}},
}

// BenchmarkLocalDecideParallel measures one decision on an existing key from
// every P at once, for tally and the other in-process limiters.
func BenchmarkLocalDecideParallel(b *testing.B) {
	keys := localBenchKeys()
	for _, c := range localContenders {
		allow := c.new(b)
		for _, k := range keys {
			allow(k)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(len(keys))
				for pb.Next() {
					if !allow(keys[i]) {
						b.Error("denied: the benchmark limit is meant never to deny")
						return
					}
					if i++; i == len(keys) {
						i = 0
					}
				}
			})
		})
	}
}

// BenchmarkLocalBytesPerKey measures the heap each limiter holds per tracked
// key after 100k keys of 16 bytes, the key's own copy included (bytes/key)
// and excluded (state-bytes/key). -benchtime 3x is plenty.
func BenchmarkLocalBytesPerKey(b *testing.B) {
	keys := localBenchKeys()
	for _, c := range localContenders {
		b.Run(c.name, func(b *testing.B) {
			var total uint64
			for b.Loop() {
				before := liveHeap()
				allow := c.new(b)
				for _, k := range keys {
					if !allow(k) {
						b.Fatal("denied a fresh key")
					}
				}
				after := liveHeap()
				runtime.KeepAlive(allow)
				total += after - before
			}
			perKey := float64(total) / float64(b.N) / float64(len(keys))
			b.ReportMetric(perKey, "bytes/key")
			b.ReportMetric(perKey-float64(len(keys[0])), "state-bytes/key")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// shardedLimiters is the usual way to keep a *rate.Limiter per key: a map
// split into shards with a read-write lock each (a sync.Map would box every
// key into an interface and allocate on each lookup).
type shardedLimiters struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.RWMutex
		m  map[string]*rate.Limiter
		_  [32]byte
	}
	newLimiter func() *rate.Limiter
}

func newShardedLimiters(newLimiter func() *rate.Limiter) *shardedLimiters {
	s := &shardedLimiters{seed: maphash.MakeSeed(), newLimiter: newLimiter}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*rate.Limiter)
	}
	return s
}

func (s *shardedLimiters) get(key string) *rate.Limiter {
	sh := &s.shards[maphash.String(s.seed, key)&63]
	sh.mu.RLock()
	l, ok := sh.m[key]
	sh.mu.RUnlock()
	if ok {
		return l
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l, ok = sh.m[key]; !ok {
		l = s.newLimiter()
		sh.m[key] = l
	}
	return l
}
