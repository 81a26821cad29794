package tests

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// BenchmarkStrictDecide measures strict-mode decisions against one local
// redis-server with 1, 16 and 256 concurrent callers, tally's batching store
// beside go-redis/redis_rate (one EVALSHA per decision) in the same run.
// Every caller has its own key and the limit is high, so every decision is
// an allowed write. It reports decisions/s, the p99, p99.9 and maximum
// latency of one call (docs/distributed.md's choice of the default timeout rests on
// them, measured beside a CPU hog) and the Redis CPU each decision cost:
// the usec INFO commandstats counts for scripts (EVALSHA and EVAL,
// heartbeats included) over the run, divided by the decisions.
//
// Bounded by count, e.g.:
//
//	go test -run '^$' -bench StrictDecide -benchtime 20000x .
func BenchmarkStrictDecide(b *testing.B) {
	srv := startRedis(b)
	ctx := context.Background()
	// A generous timeout: this measures throughput, and a timeout would
	// open the breaker and make failures look fast.
	store, err := distributed.Open(distributed.Options{Addresses: []string{srv.Addr}, Timeout: time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	tallyLimit := algorithms.NewLimit(1_000_000_000, int64(time.Hour), 0)

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	limiter := redis_rate.NewLimiter(rdb)
	rateLimit := redis_rate.PerHour(1_000_000_000)

	for _, callers := range []int{1, 16, 256} {
		n := strconv.Itoa(callers)
		b.Run("tally/callers="+n, func(b *testing.B) {
			runDecisions(b, rdb, callers, func(key string) (bool, error) {
				r, err := stepDecide(store, ctx, "bench", key, tallyLimit, 1)
				return r.Allowed, err
			})
		})
		b.Run("redis_rate/callers="+n, func(b *testing.B) {
			runDecisions(b, rdb, callers, func(key string) (bool, error) {
				r, err := limiter.Allow(ctx, key, rateLimit)
				if err != nil {
					return false, err
				}
				return r.Allowed > 0, nil
			})
		})
	}
}

// runDecisions spreads b.N decisions over a fixed number of goroutines, one
// key each, and reports decisions/s, p99 latency in microseconds and the
// Redis CPU per decision (script usec from INFO commandstats, read through
// rdb).
func runDecisions(b *testing.B, rdb *redis.Client, callers int, decide func(key string) (bool, error)) {
	b.ReportAllocs()
	if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	lat := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range callers {
		wg.Go(func() {
			key := "g" + strconv.Itoa(g)
			own := make([]time.Duration, 0, b.N/callers+1)
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				allowed, err := decide(key)
				own = append(own, time.Since(t0))
				if err != nil {
					b.Error(err)
					return
				}
				if !allowed {
					b.Error("denied; the benchmark limit is meant never to deny")
					return
				}
			}
			lat[g] = own
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(all[len(all)*999/1000].Microseconds()), "p999-µs")
		b.ReportMetric(float64(all[len(all)-1].Microseconds()), "max-µs")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	usec, calls, err := scriptStats(rdb)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(usec)/float64(b.N), "redis-µs/decision")
	b.ReportMetric(float64(b.N)/float64(max(calls, 1)), "decisions/call")
}
