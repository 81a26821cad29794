package tests

// Strict mode through real Caddy processes on a real three-master Redis
// Cluster: several addresses on the redis line make the store a cluster
// client, and decisions stay exact for keys on every node.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStrictModeIsExactAcrossThreeInstancesOnRedisCluster(t *testing.T) {
	t.Parallel()
	addrs := startRedisCluster(t)
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		urls[i] = "redis://" + a
	}
	// The timeout is raised from its 20ms default: this test is about
	// exactness, and three race-built Caddies with three redis-servers on a
	// small machine miss 20ms now and then, which hands the decision to
	// fail_policy local (each instance's share) and overshoots the limit.
	site := `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 50
			window 1h
		}
		distributed {
			redis ` + strings.Join(urls, " ") + `
			timeout 1s
		}
	}
	respond "ok"
}
`
	fleet := make([]*caddyInstance, 3)
	for i := range fleet {
		fleet[i] = startCaddy(t, site)
	}
	for _, c := range fleet {
		waitFor(t, 20*time.Second, c.AdminURL+" to reach the cluster and see 3 instances", func() bool {
			ok, n := zoneStore(t, c, "api")
			return ok && n == 3
		})
	}

	// One key, hundreds of concurrent requests spread over the instances.
	counts := sendAcross(t, fleet, 300, 48, withKey("alice"), 5*time.Second)
	if counts[200] != 50 || counts[429] != 250 {
		t.Fatalf("300 concurrent requests for one key over 3 instances on a Redis Cluster at events 50: %v, want exactly 50×200 250×429", counts)
	}

	// Several keys, two on each master, all at once: each gets exactly its
	// limit, wherever its slot lives.
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cluster.Close()
	ctx := context.Background()
	keys, owner := keysOnEveryNode(t, ctx, cluster, addrs, 2)
	const perKey = 80
	var mu sync.Mutex
	byKey := map[string]statusCounts{}
	for _, k := range keys {
		byKey[k] = statusCounts{}
	}
	total := sendConcurrently(t, perKey*len(keys), 48, func(i int) (response, error) {
		k := keys[i%len(keys)]
		res, err := fleet[(i/len(keys))%len(fleet)].try(withKey(k))
		if err == nil {
			mu.Lock()
			byKey[k][res.Status]++
			mu.Unlock()
		}
		return res, err
	}, nil)
	if n := total.serverErrors(); n > 0 {
		t.Errorf("%d server errors: %v", n, total)
	}
	for _, k := range keys {
		if got := byKey[k]; got[200] != 50 || got[429] != perKey-50 {
			t.Errorf("key %q (on %s): %v, want exactly 50×200 %d×429", k, owner[k], got, perKey-50)
		}
	}
	// Each key's state lives on the master that owns its slot.
	for _, k := range keys {
		c := redis.NewClient(&redis.Options{Addr: owner[k]})
		n, err := c.Exists(ctx, "tally:api:"+k).Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("Redis key tally:api:%s is not on %s, the master owning its slot", k, owner[k])
		}
	}
}
