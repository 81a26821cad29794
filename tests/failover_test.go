package tests

// Failover of a replicated Redis Cluster and of a Sentinel-watched master
// under load, with real redis-server processes: only the failed master's
// keys use the fail policy, and only until a replica has been promoted.

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// resumeBound is how soon after a promotion every key of the failed master
// must be decided in Redis again.
const resumeBound = 2 * time.Second

// keyLoad decides keys in a loop from several goroutines and records, per
// key, how many decisions failed (went to the fail policy) and when the last
// failure and the last success were.
type keyLoad struct {
	mu    sync.Mutex
	stats map[string]*keyStats
	stop  chan struct{}
	wg    sync.WaitGroup
}

type keyStats struct {
	failures          int
	lastErr           error
	lastFail, lastOK  time.Time
	decisions, denied int
}

func startKeyLoad(t *testing.T, keys []string, workers int, decide func(key string) (bool, error)) *keyLoad {
	l := &keyLoad{stats: map[string]*keyStats{}, stop: make(chan struct{})}
	for _, k := range keys {
		l.stats[k] = &keyStats{}
	}
	for w := range workers {
		l.wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				k := keys[i%len(keys)]
				allowed, err := decide(k)
				now := time.Now()
				l.mu.Lock()
				st := l.stats[k]
				st.decisions++
				if err != nil {
					st.failures++
					st.lastErr, st.lastFail = err, now
				} else {
					st.lastOK = now
					if !allowed {
						st.denied++
					}
				}
				l.mu.Unlock()
			}
		})
	}
	t.Cleanup(l.halt)
	return l
}

func (l *keyLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// allSucceededSince reports whether every key in keys had a success after
// at.
func (l *keyLoad) allSucceededSince(keys []string, at time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		if !l.stats[k].lastOK.After(at) {
			return false
		}
	}
	return true
}

func (l *keyLoad) snapshot(k string) keyStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return *l.stats[k]
}

// rejoin restarts old, a master that heir replaced, while four workers keep
// deciding key (spent by then) in zone "exact" through fleet[0], and waits
// within the given time until old follows heir as its replica. It returns
// how many of those decisions were allowed, and the key's stats.
func rejoin(t *testing.T, fleet []*distributed.Strict, key string, limit algorithms.Limit, old, heir *redisServer, within time.Duration) (allowed int64, st keyStats) {
	t.Helper()
	ctx := context.Background()
	var staleAllowed atomic.Int64
	load := startKeyLoad(t, []string{key}, 4, func(k string) (bool, error) {
		r, err := stepDecide(fleet[0], ctx, "exact", k, limit, 1)
		if err == nil && r.Allowed {
			staleAllowed.Add(1)
		}
		return r.Allowed, err
	})
	old.Start()
	oc := old.Client()
	waitFor(t, within, "the old master to follow the one that replaced it", func() bool {
		repl, err := oc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(repl, "role:slave") &&
			infoField(repl, "master_port") == strconv.Itoa(heir.Port) &&
			strings.Contains(repl, "master_link_status:up")
	})
	load.halt()
	return staleAllowed.Load(), load.snapshot(key)
}

// requireFailedThenResumed checks key k of a master killed under load: it
// failed (the kill did happen under load) and failed no more than
// resumeBound after the promotion.
func requireFailedThenResumed(t *testing.T, k string, st keyStats, promotedAt time.Time) {
	t.Helper()
	if st.failures == 0 {
		t.Errorf("key %s on the killed master never failed: the kill did not happen under load", k)
	}
	if late := st.lastFail.Sub(promotedAt); late > resumeBound {
		t.Errorf("key %s on the killed master still failed %v after the promotion (last: %v), want within %v",
			k, late.Round(time.Millisecond), st.lastErr, resumeBound)
	}
}

// logsAbout counts the log entries with message msg whose field names addr.
func logsAbout(logs *observer.ObservedLogs, msg, field, addr string) int {
	n := 0
	for _, e := range logs.FilterMessage(msg).All() {
		if v, ok := e.ContextMap()[field].(string); ok && strings.Contains(v, addr) {
			n++
		}
	}
	return n
}

const unreachableMsg = "redis unreachable; zones apply their fail_policy"

// exactFleet opens three stores on opts' Redis for an exactness check, with
// a timeout a loaded machine meets even while the stores connect (the check
// is about Redis's answers, not its latency), each having answered a
// heartbeat.
func exactFleet(t *testing.T, opts distributed.Options) []*distributed.Strict {
	t.Helper()
	opts.Timeout = 2 * time.Second
	var fleet []*distributed.Strict
	for range 3 {
		s := openStore(t, opts, nil)
		waitFor(t, 10*time.Second, "a new store's heartbeat", func() bool {
			_, err := s.Heartbeat(context.Background())
			return err == nil
		})
		fleet = append(fleet, s)
	}
	return fleet
}

// Killing one master of a replicated Cluster under load costs only its own
// keys, and only until its replica is promoted: keys on the other masters
// never fail, the failed master's keys are decided in Redis again within
// resumeBound of the promotion (the dead master stays a seed address
// throughout), the outage is logged once, naming the node, and Outages
// names it while it lasts. Afterwards three instances are exact on a key of
// the promoted shard, and the old master, restarted, rejoins as a replica
// without taking a write: the exhausted key stays denied, and every key
// still expires.
func TestClusterFailoverCostsOnlyTheFailedMastersKeys(t *testing.T) {
	t.Parallel()
	rc := startReplicatedCluster(t)
	ctx := context.Background()
	victim := rc.masters[0]
	heir := rc.replicaOf[victim.Addr]
	logger, logs := observedLogger()
	// The timeout is generous for a loaded 2-core machine: what is under
	// test is which keys fail, not how fast Redis answers.
	opts := distributed.Options{Addresses: rc.addrs(), Timeout: 500 * time.Millisecond}
	store := openStore(t, opts, logger)

	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.addrs()[1:]})
	defer view.Close()
	var masterAddrs []string
	for _, m := range rc.masters {
		masterAddrs = append(masterAddrs, m.Addr)
	}
	keys, owner := keysOnEveryNode(t, ctx, view, masterAddrs, 4)
	var victimKeys, otherKeys []string
	for _, k := range keys {
		if owner[k] == victim.Addr {
			victimKeys = append(victimKeys, k)
		} else {
			otherKeys = append(otherKeys, k)
		}
	}
	plenty := algorithms.NewLimit(1_000_000, int64(time.Hour), 0)
	load := startKeyLoad(t, keys, 8, func(k string) (bool, error) {
		r, err := stepDecide(store, ctx, "api", k, plenty, 1)
		return r.Allowed, err
	})
	waitFor(t, 10*time.Second, "a decision in Redis for every key", func() bool {
		return load.allSucceededSince(keys, time.Time{})
	})

	victim.Kill()
	waitFor(t, 5*time.Second, "Outages to name the killed master", func() bool {
		out := store.Outages()
		return len(out) == 1 && out[0].Node == victim.Addr
	})
	heirClient := heir.Client()
	waitFor(t, 20*time.Second, "the replica's promotion", func() bool { return promoted(ctx, heirClient) })
	promotedAt := time.Now()
	waitFor(t, 10*time.Second, "a decision in Redis for every key after the promotion", func() bool {
		return load.allSucceededSince(keys, promotedAt)
	})
	load.halt()

	for _, k := range otherKeys {
		if st := load.snapshot(k); st.failures > 0 {
			t.Errorf("key %s on healthy master %s: %d of %d decisions failed (last: %v), want none",
				k, owner[k], st.failures, st.decisions, st.lastErr)
		}
	}
	for _, k := range victimKeys {
		requireFailedThenResumed(t, k, load.snapshot(k), promotedAt)
	}
	if out := store.Outages(); len(out) != 0 {
		t.Errorf("Outages after the promotion: %+v, want none", out)
	}
	if ok, _ := store.Health(); !ok {
		t.Error("Health is not ok after the promotion")
	}
	if n := logsAbout(logs, unreachableMsg, "redis", victim.Addr); n != 1 {
		t.Errorf("%d log entries say %s is unreachable, want exactly 1", n, victim.Addr)
	}
	if n := logs.FilterMessage(unreachableMsg).Len(); n != 1 {
		t.Errorf("%d 'unreachable' log entries in all, want 1 (the killed master only): %v", n, logs.FilterMessage(unreachableMsg).All())
	}
	if n := logsAbout(logs, "redis node replaced: its slots are served by another master now", "node", victim.Addr); n != 1 {
		t.Errorf("%d log entries say %s was replaced, want exactly 1", n, victim.Addr)
	}

	// Exactness on the promoted shard, across three instances.
	fleet := exactFleet(t, opts)
	exactKey := victimKeys[0]
	limit := algorithms.NewLimit(50, int64(time.Hour), 0)
	requireExactAcrossFleet(t, fleet, "exact", exactKey, limit, 50, "on the promoted shard at 50/h")

	// The old master comes back, learns it was replaced and follows its
	// old replica. No decision reaches it meanwhile: the key stays spent.
	if staleAllowed, st := rejoin(t, fleet, exactKey, limit, victim, heir, 20*time.Second); st.decisions == 0 || staleAllowed != 0 {
		t.Errorf("while the old master rejoined: %d of %d decisions on a spent key allowed, want none of at least one",
			staleAllowed, st.decisions)
	}
	// Every key on the masters serving slots now expires (a replica would
	// redirect PTTL to its master). The load's keys may have expired
	// already (their TTL is their reset time); the spent key has not.
	heir.requireEveryKeyExpires(t, 1)
	for _, m := range rc.masters[1:] {
		m.requireEveryKeyExpires(t, 0)
	}
}

// Killing a Sentinel-watched master under load: decisions fail only until
// the replica is promoted, and are decided in Redis again within
// resumeBound of the promotion; the outage is logged once, and its end
// once. Afterwards three instances are exact on the new master, and the old
// master, restarted (empty, as a crash leaves it without persistence),
// takes no decision before Sentinel turns it into a replica of the new one.
func TestSentinelFailoverFollowsTheNewMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master, replica, sentinels := startSentinelSet(t)
	logger, logs := observedLogger()
	opts := distributed.Options{Addresses: sentinels, SentinelMaster: "mymaster", Timeout: 500 * time.Millisecond}
	store := openStore(t, opts, logger)

	var keys []string
	for i := range 8 {
		keys = append(keys, "key-"+strconv.Itoa(i))
	}
	plenty := algorithms.NewLimit(1_000_000, int64(time.Hour), 0)
	load := startKeyLoad(t, keys, 8, func(k string) (bool, error) {
		r, err := stepDecide(store, ctx, "api", k, plenty, 1)
		return r.Allowed, err
	})
	waitFor(t, 10*time.Second, "a decision in Redis for every key", func() bool {
		return load.allSucceededSince(keys, time.Time{})
	})

	master.Kill()
	waitFor(t, 5*time.Second, "Health to report the outage", func() bool {
		ok, _ := store.Health()
		return !ok
	})
	if out := store.Outages(); len(out) != 1 || out[0].Node != master.Addr {
		t.Errorf("Outages: %+v, want the killed master %s", out, master.Addr)
	}
	promotedAt := waitForSentinelPromotion(t, sentinels[0], replica)
	waitFor(t, 10*time.Second, "a decision in Redis for every key after the promotion", func() bool {
		return load.allSucceededSince(keys, promotedAt)
	})
	load.halt()
	for _, k := range keys {
		st := load.snapshot(k)
		if st.failures == 0 {
			t.Errorf("key %s never failed: the kill did not happen under load", k)
		}
		if late := st.lastFail.Sub(promotedAt); late > resumeBound {
			t.Errorf("key %s still failed %v after the promotion (last: %v), want within %v",
				k, late.Round(time.Millisecond), st.lastErr, resumeBound)
		}
	}
	if ok, _ := store.Health(); !ok {
		t.Error("Health is not ok after the promotion")
	}
	if n := logs.FilterMessage(unreachableMsg).Len(); n != 1 {
		t.Errorf("%d 'unreachable' log entries, want exactly 1: %v", n, logs.FilterMessage(unreachableMsg).All())
	}
	if n := logs.FilterMessage("redis reachable again").Len(); n != 1 {
		t.Errorf("%d 'reachable again' log entries, want exactly 1", n)
	}
	// The lines name the master set (in "redis") and the master's
	// address: the one that went away, then the promoted replica.
	for _, want := range []struct{ msg, field, addr string }{
		{unreachableMsg, "redis", "sentinel mymaster@"},
		{unreachableMsg, "master", master.Addr},
		{"redis reachable again", "redis", "sentinel mymaster@"},
		{"redis reachable again", "master", replica.Addr},
		{"redis reachable again", "previous_master", master.Addr},
	} {
		if logsAbout(logs, want.msg, want.field, want.addr) != 1 {
			t.Errorf("no %q line with %s %s: %v", want.msg, want.field, want.addr, logs.FilterMessage(want.msg).All())
		}
	}

	fleet := exactFleet(t, opts)
	limit := algorithms.NewLimit(50, int64(time.Hour), 0)
	requireExactAcrossFleet(t, fleet, "exact", "k", limit, 50, "on the new master at 50/h")

	// Sentinel turns the old master into a replica after up to one INFO
	// period (10s) and 8s of it reporting the wrong role, and 30s later if
	// a late timer put it in TILT mode meanwhile. One of 20 runs beside a
	// CPU hog timed out at 30s (the cause not seen); 20 more took at most
	// 27s for the whole test with this bound.
	if staleAllowed, st := rejoin(t, fleet, "k", limit, master, replica, 60*time.Second); st.decisions == 0 || staleAllowed != 0 || st.failures != 0 {
		t.Errorf("while the old master rejoined: %d allowed and %d failed of %d decisions on a spent key, want none of at least one",
			staleAllowed, st.failures, st.decisions)
	}
	replica.requireEveryKeyExpires(t, 1)
	mc := master.Client()
	waitFor(t, 5*time.Second, "the spent key replicated to the old master", func() bool {
		n, err := mc.Exists(ctx, store.RedisKey("exact", "k")).Result()
		return err == nil && n == 1
	})
	master.requireEveryKeyExpires(t, 1)
}

// BenchmarkStrictDecideOnCluster measures strict decisions on a three-master
// Cluster, keys spread over every master: the per-master breaker adds a
// lookup in the client's cached slot map and no allocation (compare
// allocs/op with BenchmarkStrictDecide on one server).
func BenchmarkStrictDecideOnCluster(b *testing.B) {
	addrs := startRedisCluster(b)
	store, err := distributed.Open(distributed.Options{Addresses: addrs, Timeout: time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	limit := algorithms.NewLimit(1_000_000_000, int64(time.Hour), 0)
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	if _, err := stepDecide(store, ctx, "bench", keys[0], limit, 1); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := stepDecide(store, ctx, "bench", keys[next.Add(1)%int64(len(keys))], limit, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// Seed addresses that are dead (nothing listening) or hung (a frozen
// server that accepts connections and never answers) cost nothing once the
// topology is known from the live nodes: every decision is made in Redis,
// no outage is reported or logged.
func TestDeadSeedAddressesCostNothingOnCluster(t *testing.T) {
	t.Parallel()
	addrs := startRedisCluster(t)
	hung := startRedis(t)
	hung.Pause()
	t.Cleanup(hung.Resume)
	refused := "127.0.0.1:" + strconv.Itoa(freePort(t))
	logger, logs := observedLogger()
	seeds := append([]string{refused, hung.Addr}, addrs...)
	store := openStore(t, distributed.Options{Addresses: seeds, Timeout: 500 * time.Millisecond}, logger)
	ctx := context.Background()
	limit := algorithms.NewLimit(1_000_000, int64(time.Hour), 0)
	waitFor(t, 10*time.Second, "the topology from the live nodes", func() bool {
		_, err := stepDecide(store, ctx, "api", "first", limit, 1)
		return err == nil
	})
	var failed atomic.Int64
	// A pointer, not an atomic.Value: errors of different types would panic its Store.
	var lastErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 100 {
				if _, err := stepDecide(store, ctx, "api", "k"+strconv.Itoa(g*100+i), limit, 1); err != nil {
					failed.Add(1)
					lastErr.Store(&err)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of 1600 decisions failed with dead and hung seed addresses (last: %v), want none", n, *lastErr.Load())
	}
	if out := store.Outages(); len(out) != 0 {
		t.Errorf("Outages: %+v, want none", out)
	}
	if n := logs.FilterMessage(unreachableMsg).Len(); n != 0 {
		t.Errorf("%d 'unreachable' log entries, want none: %v", n, logs.FilterMessage(unreachableMsg).All())
	}
}

// Concurrency slots live on the master of their key: while one master is
// down, the slots held on the others keep being renewed past their lease
// and released on time, and the outage stays the dead master's alone.
func TestClusterMasterDownKeepsOtherMastersSlots(t *testing.T) {
	t.Parallel()
	rc := startReplicatedCluster(t)
	ctx := context.Background()
	victim := rc.masters[0]
	opts := distributed.Options{Addresses: rc.addrs(), Timeout: 500 * time.Millisecond}
	store := openStore(t, opts, nil)
	observer := openStore(t, opts, nil)
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.addrs()[1:]})
	defer view.Close()
	var masterAddrs []string
	for _, m := range rc.masters {
		masterAddrs = append(masterAddrs, m.Addr)
	}
	// keysOnEveryNode places keys by their "tally:api:" name, which is
	// also where zone api's slots live.
	keys, owner := keysOnEveryNode(t, ctx, view, masterAddrs, 1)
	const lease = 900 * time.Millisecond
	ids := map[string]string{}
	for _, k := range keys {
		id, _, err := store.Acquire(ctx, "api", k, 5, lease)
		if err != nil || id == "" {
			t.Fatalf("acquiring a slot of %s: %q %v", k, id, err)
		}
		ids[k] = id
	}

	victim.Kill()
	// Several leases long, through the failures of the dead master's
	// renewals: every slot on a healthy master stays held.
	until := time.Now().Add(5 * lease)
	for time.Now().Before(until) {
		for _, k := range keys {
			if owner[k] == victim.Addr {
				continue
			}
			n, err := observer.Slots(ctx, "api", k)
			if err != nil {
				t.Fatalf("reading the slots of %s on healthy master %s: %v", k, owner[k], err)
			}
			if n != 1 {
				t.Fatalf("key %s on healthy master %s holds %d slots %v after the kill, want its 1 slot renewed",
					k, owner[k], n, time.Since(until.Add(-5*lease)).Round(time.Millisecond))
			}
		}
		for _, o := range store.Outages() {
			if o.Node != victim.Addr {
				t.Fatalf("outage %+v: only the killed master %s is down", o, victim.Addr)
			}
		}
		time.Sleep(50 * time.Millisecond) // the sampling period of a check over time
	}
	for _, k := range keys {
		if owner[k] != victim.Addr {
			store.Release("api", k, ids[k])
		}
	}
	for _, k := range keys {
		if owner[k] == victim.Addr {
			continue
		}
		waitFor(t, 2*time.Second, "the release of "+k+" on a healthy master", func() bool {
			n, err := observer.Slots(ctx, "api", k)
			return err == nil && n == 0
		})
	}
}

// requireExactAcrossFleet sends 300 concurrent decisions for key of zone,
// spread over the stores of fleet, and fails unless exactly want of them
// are allowed and none fails.
func requireExactAcrossFleet(t *testing.T, fleet []*distributed.Strict, zone, key string, limit algorithms.Limit, want int64, where string) {
	t.Helper()
	ctx := context.Background()
	var allowed, failed atomic.Int64
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			r, err := stepDecide(fleet[i%len(fleet)], ctx, zone, key, limit, 1)
			switch {
			case err != nil:
				failed.Add(1)
			case r.Allowed:
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != want || failed.Load() != 0 {
		t.Fatalf("300 decisions over %d instances %s: %d allowed, %d failed, want exactly %d and 0",
			len(fleet), where, allowed.Load(), failed.Load(), want)
	}
}
