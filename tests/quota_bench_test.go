package tests

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// BenchmarkStrictQuotaDecide measures strict-mode quota decisions beside
// GCRA decisions, in the same run against the same redis-server, with 1,
// 16 and 256 concurrent callers: decisions/s and the Redis CPU of each
// (see runDecisions). Every caller has its own key, never denied; the
// quota's keys count a day of 2^40 units, so after each key's first
// decision of the period (which also sets its expiry) a step is HMGET and
// HSET. make bench reports quota against GCRA at 256 callers.
//
//	go test -run '^$' -bench StrictQuotaDecide -benchtime 20000x .
func BenchmarkStrictQuotaDecide(b *testing.B) {
	srv := startRedis(b)
	ctx := context.Background()
	store, err := distributed.Open(distributed.Options{Addresses: []string{srv.Addr}, Timeout: time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	limit := algorithms.NewLimit(1_000_000_000, int64(time.Hour), 0)
	periods := zones.PeriodsAt(algorithms.Day, time.Now(), time.UTC)
	quota := zones.QuotaLimit{Limit: zones.MaxEvents, Periods: &periods}
	for _, callers := range []int{1, 16, 256} {
		n := strconv.Itoa(callers)
		b.Run("gcra/callers="+n, func(b *testing.B) {
			runDecisions(b, rdb, callers, func(key string) (bool, error) {
				r, err := stepDecide(store, ctx, "bench", key, limit, 1)
				return r.Allowed, err
			})
		})
		b.Run("quota/callers="+n, func(b *testing.B) {
			runDecisions(b, rdb, callers, func(key string) (bool, error) {
				r, err := stepDecideQuota(store, ctx, "bench", key, quota, 1)
				return r.Allowed, err
			})
		})
	}
}
