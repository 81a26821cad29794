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
	nodes, addrs := startRedisClusterNodes(t, time.Minute)
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

// Concurrency slots on a Cluster with one master hung: each master's
// renewals and releases are a pipeline of their own. In one pipeline across
// masters go-redis stamps the hung master's deadline on every command, so
// the healthy masters' renewals, though Redis ran them, failed, and their
// breakers opened as if they were down too. Here the healthy masters' slots
// stay held in Redis, their leases moving on, for several lease lifetimes
// under requests still running; only the hung master is reported down; and
// their releases reach Redis at once. Once the master answers again its
// slots recover and releases land.
func TestSlotsOfHealthyMastersStayHeldWhileAClusterMasterHangs(t *testing.T) {
	t.Parallel()
	nodes, addrs := startRedisClusterNodes(t, time.Minute) // no failover in the test
	ctx := context.Background()
	// Renewals every 667ms, each waiting up to the timeout for the hung
	// master: 5 failed rounds (a breaker's trip) well inside the window.
	const timeout, lease = 300 * time.Millisecond, 2 * time.Second
	store := openStore(t, distributed.Options{Addresses: addrs, Timeout: timeout}, nil)
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer view.Close()
	rkey := func(k string) string { return "tally:z:" + k }
	keys, owner := keysOnEveryMaster(t, ctx, view, addrs, 1, rkey)
	// The victim serves only slots: other calls (the heartbeat's) would
	// trip its breaker before the renewals show what they cost the others.
	beat, err := view.MasterForKey(ctx, "tally:instances")
	if err != nil {
		t.Fatal(err)
	}
	victim := nodes[0]
	if victim.Addr == beat.Options().Addr {
		victim = nodes[1]
	}
	ids := map[string]string{}
	var hung string
	var healthy []string
	for _, k := range keys {
		id, _, err := store.Acquire(ctx, "z", k, 2, lease)
		if err != nil || id == "" {
			t.Fatalf("Acquire %s: %q %v", k, id, err)
		}
		ids[k] = id
		if owner[k] == victim.Addr {
			hung = k
		} else {
			healthy = append(healthy, k)
		}
	}
	extra := map[string]string{} // released during the hang
	for _, k := range []string{hung, healthy[0]} {
		id, _, err := store.Acquire(ctx, "z", k, 2, lease)
		if err != nil || id == "" {
			t.Fatalf("Acquire a second slot of %s: %q %v", k, id, err)
		}
		extra[k] = id
	}
	score := func(k, id string) (float64, bool) {
		s, err := view.ZScore(ctx, rkey(k), id).Result()
		return s, err == nil
	}
	first := map[string]float64{}
	for _, k := range healthy {
		first[k], _ = score(k, ids[k])
	}
	gone := func(ks ...string) func() bool {
		return func() bool {
			for _, k := range ks {
				if n, err := view.Exists(ctx, rkey(k)).Result(); err != nil || n != 0 {
					return false
				}
			}
			return true
		}
	}

	victim.Pause()
	t.Cleanup(victim.Resume)
	end := time.Now().Add(4 * lease)
	moved := map[string]bool{}
	for time.Now().Before(end) {
		for _, k := range healthy {
			s, held := score(k, ids[k])
			if !held || s <= float64(time.Now().UnixMilli()) {
				t.Fatalf("slot %s of key %s on healthy master %s: held %v, lease ends at %.0f (now %d): its renewals failed with the hung master's",
					ids[k], k, owner[k], held, s, time.Now().UnixMilli())
			}
			moved[k] = moved[k] || s > first[k]+float64(2*lease.Milliseconds())
		}
		for _, o := range store.Outages() {
			if o.Node != victim.Addr {
				t.Fatalf("outage %+v: only the hung master %s is down", o, victim.Addr)
			}
		}
		time.Sleep(20 * time.Millisecond) // polling; not a synchronisation
	}
	for _, k := range healthy {
		if !moved[k] {
			t.Errorf("slot of key %s on healthy master %s: lease never moved two lifetimes past its first", k, owner[k])
		}
	}
	// Requests ending while the master still hangs, one of them its own:
	// the others' slots leave Redis at once, not when their leases end.
	store.Release("z", hung, extra[hung])
	for _, k := range healthy {
		store.Release("z", k, ids[k])
	}
	store.Release("z", healthy[0], extra[healthy[0]])
	waitFor(t, lease/2, "the healthy masters' releases to reach Redis", gone(healthy...))

	victim.Resume()
	// The hung master's slot still held is renewed again (taken back if
	// its lease ended in Redis meanwhile), the one released while it hung
	// leaves Redis, and so does the last once released.
	waitFor(t, 10*time.Second, "the hung master's slots to recover once it answers", func() bool {
		s, held := score(hung, ids[hung])
		_, released := score(hung, extra[hung])
		return held && !released && s > float64(time.Now().UnixMilli()+lease.Milliseconds()/2)
	})
	store.Release("z", hung, ids[hung])
	waitFor(t, 5*time.Second, "the recovered master's release to reach Redis", gone(hung))
}
