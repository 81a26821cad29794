package tests

// Async mode on a Redis Cluster: syncs go through each master's breaker,
// so a dead master makes only its own keys stale (and their zones apply
// their fail policy), while the other masters' keys keep syncing.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// asyncKeysOnEveryMaster picks perNode keys of zone whose async Redis keys
// hash to slots owned by each master, with the address of their master.
func asyncKeysOnEveryMaster(t *testing.T, ctx context.Context, a *distributed.Async, cluster *redis.ClusterClient, zone string, masters []string, perNode int) ([]string, map[string]string) {
	t.Helper()
	return keysOnEveryMaster(t, ctx, cluster, masters, perNode, func(k string) string { return a.RedisKey(zone, k) })
}

// asyncKeyStats is what a key's decisions gave during the run.
type asyncKeyStats struct {
	failures, allowed int
	lastErr           error
	lastFail          time.Time
	allowedAt         []time.Time
}

// A master killed (connections refused) or hung (SIGSTOP: connections
// accepted, nothing answered) under async load: the other masters' keys
// never go to the fail policy and keep syncing at the refill rate; the
// failed master's keys go stale, and are decided in Redis again soon after
// its replica is promoted.
func TestAsyncClusterMasterDownCostsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"killed", "hung"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			testAsyncClusterMasterDown(t, how == "hung")
		})
	}
}

func testAsyncClusterMasterDown(t *testing.T, hang bool) {
	rc := startReplicatedCluster(t)
	ctx := context.Background()
	victim := rc.masters[0]
	heir := rc.replicaOf[victim.Addr]
	const interval = 100 * time.Millisecond
	a, err := distributed.OpenAsync(distributed.Options{Addresses: rc.addrs(), Mode: "async",
		SyncInterval: interval, Timeout: 500 * time.Millisecond, Instance: nextTestInstance()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.addrs()[1:]})
	defer view.Close()
	var masters []string
	for _, m := range rc.masters {
		masters = append(masters, m.Addr)
	}
	keys, owner := asyncKeysOnEveryMaster(t, ctx, a, view, "api", masters, 4)

	// 20 a second per key, asked for far more often: every key is short of
	// tokens, so every sync sends every key (leases move with the refill),
	// and a key whose syncs stop is soon denied or stale.
	limit := algorithms.NewLimit(20, int64(time.Second), 0)
	var mu sync.Mutex
	stats := map[string]*asyncKeyStats{}
	for _, k := range keys {
		stats[k] = &asyncKeyStats{}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[i%len(keys)]
				r, err := stepDecide(a, ctx, "api", k, limit, 1)
				now := time.Now()
				mu.Lock()
				st := stats[k]
				switch {
				case err != nil:
					st.failures++
					st.lastErr, st.lastFail = err, now
				case r.Allowed:
					st.allowed++
					st.allowedAt = append(st.allowedAt, now)
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // pacing the load, not a synchronisation
			}
		})
	}
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(halt)
	allowedBetween := func(k string, from, to time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, at := range stats[k].allowedAt {
			if at.After(from) && at.Before(to) {
				n++
			}
		}
		return n
	}
	waitForSyncs(t, []*distributed.Async{a}, interval)
	time.Sleep(time.Second) // the steady state before the kill, being measured

	killedAt := time.Now()
	if hang {
		victim.Pause()
		t.Cleanup(victim.Resume)
	} else {
		victim.Kill()
	}
	if !hang {
		// Refused connections trip its breaker within a few syncs; a
		// hung master's (each sync waits a timeout for it) may not trip
		// before its replica is promoted.
		waitFor(t, 5*time.Second, "Outages to name the killed master", func() bool {
			out := a.Outages()
			return len(out) == 1 && out[0].Node == victim.Addr
		})
	}
	heirClient := heir.Client()
	waitFor(t, 20*time.Second, "the replica's promotion", func() bool {
		for _, o := range a.Outages() {
			if o.Node != victim.Addr {
				t.Fatalf("outage %+v: only the failed master %s is down", o, victim.Addr)
			}
		}
		return promoted(ctx, heirClient)
	})
	promotedAt := time.Now()
	// The victim's keys are decided in Redis again: allowed beyond what a
	// stale view could hold.
	for _, k := range keys {
		if owner[k] != victim.Addr {
			continue
		}
		waitFor(t, 10*time.Second, "key "+k+" of the failed master to be allowed again", func() bool {
			mu.Lock()
			defer mu.Unlock()
			st := stats[k]
			return len(st.allowedAt) > 0 && st.allowedAt[len(st.allowedAt)-1].After(promotedAt) && time.Since(st.lastFail) > interval
		})
	}
	halt()
	outage := promotedAt.Sub(killedAt)
	t.Logf("promotion %v after the kill", outage.Round(time.Millisecond))

	for _, k := range keys {
		st := stats[k]
		if owner[k] != victim.Addr {
			if st.failures > 0 {
				t.Errorf("key %s on healthy master %s: %d decisions failed (last: %v), want none", k, owner[k], st.failures, st.lastErr)
			}
			// Its syncs went on: leases kept coming at the refill rate
			// (20/s) while the other master was down.
			if n := allowedBetween(k, killedAt, promotedAt); float64(n) < 20*outage.Seconds()/2 {
				t.Errorf("key %s on healthy master %s: %d allowed in the %v of the outage, want about %.0f (its syncs stopped)",
					k, owner[k], n, outage.Round(time.Millisecond), 20*outage.Seconds())
			}
			continue
		}
		requireFailedThenResumed(t, k, keyStats{failures: st.failures, lastErr: st.lastErr, lastFail: st.lastFail}, promotedAt)
	}
	if out := a.Outages(); len(out) != 0 {
		t.Errorf("Outages after the promotion: %+v, want none", out)
	}
}

// Async quotas on a Cluster: a hung master (SIGSTOP) fails only its own
// keys' quota syncs. While it hangs, the other masters' idle keys hand
// their leases back within a few syncs, through its first timeouts, its
// breaker's opening and probes, and only its breaker opens; once it
// answers again, its own keys hand theirs back too. Redis then counts
// every key's charges exactly: none twice, no lease left behind.
func TestAsyncQuotaClusterHungMasterCostsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	// No failover within the test: the masters mark the hung one failed
	// only after a minute.
	nodes, addrs := startRedisClusterNodes(t, time.Minute)
	ctx := context.Background()
	const interval, timeout = 100 * time.Millisecond, 500 * time.Millisecond
	a, err := distributed.OpenAsync(distributed.Options{Addresses: addrs, Mode: "async",
		SyncInterval: interval, Timeout: timeout, Instance: nextTestInstance()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer view.Close()
	keys, owner := keysOnEveryMaster(t, ctx, view, addrs, 2, func(k string) string { return a.QuotaKey("q", k) })
	victim := nodes[0]
	var healthy, hung []string
	for _, k := range keys {
		if owner[k] == victim.Addr {
			hung = append(hung, k)
		} else {
			healthy = append(healthy, k)
		}
	}
	// A lease is ⌈1600/16⌉ = 100 units beyond the request.
	periods := zones.PeriodsAt(algorithms.Day, time.Now(), time.UTC)
	q := zones.QuotaLimit{Limit: 1600, Periods: &periods}
	charged := map[string]int64{}
	// traffic runs post-charged requests (a check, then a charge) on ks:
	// each takes a lease on the request path, Redis counting it whole.
	traffic := func(ks []string) {
		t.Helper()
		for range 3 {
			for _, k := range ks {
				if r, err := stepCheckQuota(a, ctx, "q", k, q); err != nil || !r.Allowed {
					t.Fatalf("checking %s: %+v, %v", k, r, err)
				}
				if _, err := stepChargeQuota(a, ctx, "q", k, q, 1); err != nil {
					t.Fatalf("charging %s: %v", k, err)
				}
				charged[k]++
			}
		}
	}
	counted := func(k string) int64 {
		n, _ := view.HGet(ctx, a.QuotaKey("q", k), "u").Int64()
		return n
	}
	handedBack := func(ks []string) func() bool {
		return func() bool {
			for _, k := range ks {
				if counted(k) != charged[k] {
					return false
				}
			}
			return true
		}
	}
	traffic(keys)
	if handedBack(keys)() {
		t.Fatal("Redis counts no lease for the keys in use: the test does not test hand-backs")
	}
	victim.Pause()
	t.Cleanup(victim.Resume)
	// The healthy masters' keys, idle, hand their leases back at their
	// second sync, however long the hung master makes each sync wait; again
	// after more traffic, past the hung master's breaker opening (5
	// failures) and its probes (a second apart).
	// Within 3s: two syncs and a hung call's timeout take 1s, the rest is
	// for a loaded machine's stalls (the test runs 4s of hang, so a sync
	// held by the hung master still fails it).
	const within = 3 * time.Second
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
		waitFor(t, within, "the healthy masters' idle keys to hand their leases back", handedBack(healthy))
		traffic(healthy)
	}
	waitFor(t, within, "the healthy masters' idle keys to hand their leases back", handedBack(healthy))
	for _, o := range a.Outages() {
		if o.Node != victim.Addr {
			t.Errorf("outage %+v: only the hung master %s is down", o, victim.Addr)
		}
	}
	victim.Resume()
	waitFor(t, 10*time.Second, "the hung master's keys to hand their leases back once it answers", handedBack(hung))
	time.Sleep(5 * interval) // syncs that could count a report twice, being measured
	for _, k := range keys {
		if n := counted(k); n != charged[k] {
			t.Errorf("key %s (master %s): Redis counts %d, %d were charged", k, owner[k], n, charged[k])
		}
	}
}
