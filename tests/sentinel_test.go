package tests

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// Through Sentinel (addresses are the sentinels, sentinel_master names the
// master), strict mode decides in the master and stays exact.
func TestStrictModeThroughSentinelIsExact(t *testing.T) {
	t.Parallel()
	master := startRedis(t)
	sentinel := startSentinels(t, master, 1, 1, 0, 30*time.Second)[0]
	opts := distributed.Options{Addresses: []string{sentinel}, SentinelMaster: "mymaster", Timeout: 2 * time.Second}
	stores := []*distributed.Strict{openStore(t, opts, nil), openStore(t, opts, nil)}
	limit := algorithms.NewLimit(20, int64(time.Hour), 0)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				r, err := stepDecide(stores[g%2], context.Background(), "sentinel", "k", limit, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := allowed.Load(); n != 20 {
		t.Fatalf("%d of 120 decisions allowed through Sentinel at 20 per hour, want exactly 20", n)
	}
	if ttl, err := master.Client().PTTL(context.Background(), "tally:sentinel:k").Result(); err != nil || ttl <= 0 {
		t.Fatalf("the key is not in the master with a TTL: %v %v", ttl, err)
	}
}
