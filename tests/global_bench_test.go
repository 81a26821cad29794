package tests

// The global store's work for hot keys: each of 3 regions' coordinators
// reports the same hot keys every sync (demand moving between them), and
// Redis's own CPU time for the allocation script is measured.

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
)

// BenchmarkGlobalSyncHotKeys runs one sync of 10,000 hot keys per op,
// from eu, us and ap in turn, and reports the global Redis's script time
// per sync and per key (Redis CPU, from INFO commandstats).
func BenchmarkGlobalSyncHotKeys(b *testing.B) {
	const keys = 10_000
	src, err := os.ReadFile("../distributed/global.lua")
	if err != nil {
		b.Fatal(err)
	}
	rs := startRedis(b)
	rdb := rs.Client()
	script := redis.NewScript(string(src))
	regions := []string{"eu", "us", "ap"}
	args := make([][]any, len(regions))
	for i, r := range regions {
		a := []any{r, 1, "", "1", 300000, 1000, "eu:1,us:1,ap:1", "tally:", 1, "api", keys}
		for k := range keys {
			// the reporting region is denied (wants everything) and holds
			// a third
			a = append(a, "key-"+strconv.Itoa(k), 1000000, 333333)
		}
		args[i] = a
	}
	ctx := context.Background()
	// warm up: every region registered, records created
	for i := range regions {
		if err := script.Run(ctx, rdb, []string{"tally:g.epoch"}, args[i]...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	usec0, _, _ := scriptStats(rdb)
	b.ResetTimer()
	for n := range b.N {
		if err := script.Run(ctx, rdb, []string{"tally:g.epoch"}, args[n%len(regions)]...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	usec1, _, _ := scriptStats(rdb)
	perSync := float64(usec1-usec0) / float64(b.N)
	b.ReportMetric(perSync, "redis-µs/sync")
	b.ReportMetric(perSync/keys, "redis-µs/key")
}
