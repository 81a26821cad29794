package tests

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// A Cluster master that hangs (SIGSTOP: it accepts connections and never
// answers) costs only its own keys. Decisions on the other masters' keys,
// batched together with the hung master's, are made in Redis and each
// returns well inside the timeout (under half of it: before each master got
// its own pipeline, they waited for the hung one until the deadline and
// failed), through the first wave of hung calls and the breaker's probes
// after each cool-down. The store reports only the hung master as down.
func TestHungMasterCostsOtherMastersNothingOnCluster(t *testing.T) {
	t.Parallel()
	// No failover within the test: the masters mark the hung one failed
	// only after a minute.
	nodes := startRedisClusterNodes(t, time.Minute)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	ctx := context.Background()
	const timeout = time.Second
	store := openStore(t, distributed.Options{Addresses: addrs, Timeout: timeout}, nil)
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer view.Close()
	keys, owner := keysOnEveryNode(t, ctx, view, addrs, 8)
	limit := algorithms.NewLimit(1_000_000, int64(time.Hour), 0)
	for _, k := range keys { // the slot map is known, each master has a breaker
		if _, err := stepDecide(store, ctx, "api", k, limit, 1); err != nil {
			t.Fatalf("deciding %s before the hang: %v", k, err)
		}
	}

	victim := nodes[0]
	victim.Pause()
	t.Cleanup(victim.Resume)
	type outcome struct {
		key     string
		err     error
		elapsed time.Duration
	}
	var mu sync.Mutex
	var outcomes []outcome
	var wg sync.WaitGroup
	// Past two breaker cool-downs (1s each): the first wave and two probes
	// of the hung master land in batches with healthy keys.
	end := time.Now().Add(3 * timeout)
	for g := range 24 {
		wg.Go(func() {
			for i := g; time.Now().Before(end); i++ {
				k := keys[i%len(keys)]
				t0 := time.Now()
				_, err := stepDecide(store, ctx, "api", k, limit, 1)
				o := outcome{k, err, time.Since(t0)}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	healthy, hung := 0, 0
	for _, o := range outcomes {
		if owner[o.key] == victim.Addr {
			if errors.Is(o.err, distributed.ErrTimeout) || errors.Is(o.err, context.DeadlineExceeded) {
				hung++
			}
			continue
		}
		healthy++
		if o.err != nil {
			t.Errorf("key %s on healthy master %s: %v after %v, want a decision made in Redis", o.key, owner[o.key], o.err, o.elapsed)
		} else if o.elapsed >= timeout/2 {
			t.Errorf("key %s on healthy master %s took %v, want well inside the timeout (< %v)", o.key, owner[o.key], o.elapsed, timeout/2)
		}
	}
	if hung < 2 {
		t.Errorf("%d decisions on the hung master's keys timed out, want the first wave and a probe at least: the test did not mix hung and healthy keys", hung)
	}
	if healthy < 1000 {
		t.Errorf("%d decisions on healthy masters in %v, want at least 1000", healthy, 3*timeout)
	}
	for _, o := range store.Outages() {
		if o.Node != victim.Addr {
			t.Errorf("outage %+v: only the hung master %s is down", o, victim.Addr)
		}
	}
	t.Logf("%d decisions on healthy masters, %d timed out on the hung one", healthy, hung)
}
