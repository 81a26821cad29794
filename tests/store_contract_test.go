package tests

// What the strict and the async store promise alike, whichever mode a zone
// runs in.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// modeStore is a store of either mode, with the name of its Redis keys.
type modeStore interface {
	zones.Store
	RedisKey(zone, key string) string
}

// An admin read of a key (GET /rate_limit/zones/<zone>/keys/<key>) goes
// through the breaker of the Cluster master serving the key, in async mode
// as in strict mode: with one master dead, reads of its keys fail, and
// reads of the other masters' keys keep answering, before, while and after
// the dead master's breaker is open.
func TestAdminReadsOnAClusterFailOnlyForTheDeadMastersKeys(t *testing.T) {
	t.Parallel()
	// A node timeout far longer than the test: the surviving masters never
	// mark the dead one failed, so they serve their slots throughout.
	nodes, addrs := startRedisClusterNodes(t, time.Minute)
	victim := nodes[0]
	ctx := context.Background()
	opts := distributed.Options{Addresses: addrs, Timeout: 500 * time.Millisecond, Instance: nextTestInstance()}
	strict := openStore(t, opts, nil)
	asyncOpts := opts
	asyncOpts.Mode = "async"
	async, err := distributed.OpenAsync(asyncOpts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { async.Close() })
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs[1:]})
	defer view.Close()

	limit := algorithms.NewLimit(10, int64(time.Minute), 0)
	type placed struct {
		mode          string
		store         modeStore
		dead, healthy []string
	}
	var stores []placed
	for _, s := range []struct {
		mode  string
		store modeStore
	}{{"strict", strict}, {"async", async}} {
		keys, owner := keysOnEveryMaster(t, ctx, view, addrs, 2, func(k string) string { return s.store.RedisKey("api", k) })
		p := placed{mode: s.mode, store: s.store}
		for _, k := range keys {
			if _, err := stepPeek(s.store, ctx, "api", k, limit); err != nil {
				t.Fatalf("%s: peeking %s before the kill: %v", s.mode, k, err)
			}
			if owner[k] == victim.Addr {
				p.dead = append(p.dead, k)
			} else {
				p.healthy = append(p.healthy, k)
			}
		}
		stores = append(stores, p)
	}

	victim.Kill()
	requireHealthyReads := func(p placed, when string) {
		t.Helper()
		for _, k := range p.healthy {
			if _, err := stepPeek(p.store, ctx, "api", k, limit); err != nil {
				t.Fatalf("%s: peeking %s on a healthy master %s: %v", p.mode, k, when, err)
			}
		}
	}
	for _, p := range stores {
		// Reads of the dead master's keys alone fail until its breaker
		// opens (a handful of failures in a row) and refuses them at once.
		refused := false
		for i := 0; i < 50 && !refused; i++ {
			_, err := stepPeek(p.store, ctx, "api", p.dead[i%len(p.dead)], limit)
			if err == nil {
				t.Fatalf("%s: peeking %s on the killed master succeeded", p.mode, p.dead[i%len(p.dead)])
			}
			refused = errors.Is(err, distributed.ErrUnavailable)
		}
		if !refused {
			t.Fatalf("%s: 50 reads of the killed master's keys, none refused by its breaker", p.mode)
		}
		// For a breaker's cool-down and more: the dead master's reads
		// keep its breaker open, the healthy masters' reads answer.
		until := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(until) {
			requireHealthyReads(p, "while the killed master's breaker is open")
			if _, err := stepPeek(p.store, ctx, "api", p.dead[0], limit); err == nil {
				t.Fatalf("%s: peeking %s on the killed master succeeded", p.mode, p.dead[0])
			}
			time.Sleep(10 * time.Millisecond) // pacing the reads, not a synchronisation
		}
	}
}
