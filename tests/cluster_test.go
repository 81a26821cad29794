package tests

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// Three instances on a three-node Redis Cluster are as exact as on one
// server, and keys on every node work (a batch is one script call per hash
// slot; no hash tags needed, and keys sharing one are decided together).
func TestStoreOnRedisCluster(t *testing.T) {
	addrs := startRedisCluster(t)
	opts := distributed.Options{Addresses: addrs, Timeout: 5 * time.Second}
	var stores []*distributed.Strict
	for range 3 {
		stores = append(stores, openStore(t, opts, nil))
	}
	ctx := context.Background()
	limit := algorithms.NewLimit(50, int64(time.Hour), 0)

	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range stores {
		for range 100 {
			wg.Go(func() {
				<-start
				r, err := stepDecide(s, ctx, "api", "one-key", limit, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if allowed.Load() != 50 {
		t.Fatalf("allowed %d of 300 on the cluster, want exactly 50", allowed.Load())
	}

	// Many keys in one batch: the pipeline spans every node, one script
	// call per hash slot; keys sharing a hash tag share calls.
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cluster.Close()
	nodes := map[string]bool{}
	for i := range 120 {
		wg.Go(func() {
			key := "k" + strconv.Itoa(i/2)
			if i%2 == 1 {
				key = "{tagged}" + key
			}
			for j := range 3 {
				r, err := stepDecide(stores[i%3], ctx, "spread", key, algorithms.NewLimit(2, int64(time.Minute), 0), 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed != (j < 2) {
					t.Errorf("key %s decision %d: allowed=%v", key, j, r.Allowed)
				}
			}
		})
	}
	wg.Wait()
	for i := range 60 {
		slot, err := cluster.ClusterKeySlot(ctx, stores[0].RedisKey("spread", "k"+strconv.Itoa(i))).Result()
		if err != nil {
			t.Fatal(err)
		}
		nodes[strconv.Itoa(int(slot)*3/16384)] = true
	}
	if len(nodes) != 3 {
		t.Errorf("the keys landed in %d thirds of the slot space, want all 3", len(nodes))
	}
	if _, err := stores[0].Heartbeat(ctx); err != nil {
		t.Errorf("heartbeat on the cluster: %v", err)
	}
	waitFor(t, 5*time.Second, "3 instances on the cluster", func() bool {
		n, err := stores[0].Heartbeat(ctx)
		return err == nil && n == 3
	})
}
