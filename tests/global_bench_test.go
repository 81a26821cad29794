package tests

// The global store's work for hot keys across 3 regions, measured as
// Redis's own CPU time for the allocation script (INFO commandstats).

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/redis/go-redis/v9"
)

const benchHotKeys = 10_000

// BenchmarkGlobalSyncHotKeys reports the global Redis's script time per
// sync and per key (redis-µs/sync, redis-µs/key) for 10,000 hot keys:
//   - contested: each op is one sync of every key in full (global.lua
//     called directly), from eu, us and ap in turn, each region denied
//     (wanting everything) and holding a third: the cost of a full sync,
//     and of each key a region reports;
//   - steady: three regions' coordinators (distributed.Region), each op
//     one sync of one region in turn, every key denied in every region at
//     every sync: the same demand, so after the first syncs nothing
//     changes (a key's periodic refresh, every Refresh, is not due within
//     the benchmark).
func BenchmarkGlobalSyncHotKeys(b *testing.B) {
	b.Run("contested", benchGlobalContested)
	b.Run("steady", benchGlobalSteady)
}

func benchGlobalContested(b *testing.B) {
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
		// lease 5m, demand TTL 21s (sync_interval 1s's default)
		a := []any{r, 1, "", "1", 300000, 21000, "eu:1,us:1,ap:1", "tally:", 1, "api", benchHotKeys}
		for k := range benchHotKeys {
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
	b.ReportMetric(perSync/benchHotKeys, "redis-µs/key")
}

func benchGlobalSteady(b *testing.B) {
	global := startRedis(b)
	gdb := global.Client()
	regs := driven(b, global.Addr, "eu", "us", "ap")
	keys := make([]string, benchHotKeys)
	for k := range keys {
		keys[k] = "key-" + strconv.Itoa(k)
	}
	syncOne := func(reg *distributed.Region) {
		for _, k := range keys {
			reg.Count("api", k, false, 1)
		}
		if !reg.SyncNow() {
			b.Fatal("the region's only instance did not coordinate")
		}
	}
	// warm up: every region registered, the contest settled
	for range 4 {
		for _, reg := range regs {
			syncOne(reg)
		}
	}
	usec0, _, _ := scriptStats(gdb)
	b.ResetTimer()
	for n := range b.N {
		syncOne(regs[n%len(regs)])
	}
	b.StopTimer()
	usec1, _, _ := scriptStats(gdb)
	perSync := float64(usec1-usec0) / float64(b.N)
	b.ReportMetric(perSync, "redis-µs/sync")
	b.ReportMetric(perSync/benchHotKeys, "redis-µs/key")
}
