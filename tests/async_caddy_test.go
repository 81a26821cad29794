package tests

// Async mode through three real Caddy processes sharing one real
// redis-server: the fleet stays near the limit and within the stated bound,
// and a zone's records stay within its max_keys.

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

// Not parallel: Go runs it before the parallel tests, on a quieter machine.
func TestAsyncModeStaysNearTheLimitAcrossThreeInstances(t *testing.T) {
	rs := startRedis(t)
	const interval = 100 * time.Millisecond
	fleet := startAsyncFleet(t, 3, rs.Addr, "100ms", `
		zone events {
			match {
				not path /steady
			}
			key {http.request.header.X-API-Key}
			events 100
			window 1h
		}
		zone steady {
			match {
				path /steady
			}
			key {http.request.header.X-API-Key}
			events 10
			window 1s
		}`)
	for _, c := range fleet {
		waitFor(t, 10*time.Second, c.URL+" to see 3 instances through the heartbeat", func() bool {
			ok, n := asyncZoneStore(t, c, "events")
			return ok && n == 3
		})
	}
	limit := zones.Config{Events: 100, Window: time.Hour}.Limit()

	start := time.Now()
	counts := sendAcross(t, fleet, 900, 48, withKey("alice"), 5*time.Second)
	elapsed := time.Since(start)
	bound := asyncBound(limit, elapsed, interval, len(fleet))
	allowed := counts[200]
	t.Logf("async, 3 Caddy instances, events 100 window 1h, sync_interval 100ms: 900 concurrent requests for one key in %v: %v; allowed %d (overshoot %+d, bound %d)",
		elapsed.Round(time.Millisecond), counts, allowed, allowed-100, bound)
	if counts[200]+counts[429] != 900 {
		t.Fatalf("responses other than 200 and 429: %v", counts)
	}
	// Within 10% of 100 on a quiet machine; a starved sync loop can land
	// an instance's first report after the hold, which the bound's
	// (N-1)·share term covers (128 was seen beside a CPU hog). The
	// store-level TestAsyncStoresStayWithinTheBoundForOneKey holds the
	// fresh-share burst to B exactly.
	if allowed < 90 || int64(allowed) > bound {
		t.Errorf("the fleet allowed %d for events 100, want at least 90 and at most the stated bound %d", allowed, bound)
	}

	// The budget is spent and every instance has synced it: nobody admits
	// more (a token comes back only after 36s).
	waitFor(t, 10*time.Second, "every instance to deny alice", func() bool {
		for _, c := range fleet {
			if c.Do(withKey("alice")).Status != 429 {
				allowed++
				return false
			}
		}
		return true
	})
	if int64(allowed) > bound {
		t.Errorf("after the burst the fleet allowed %d in all, above the bound %d", allowed, bound)
	}
	checkAsyncSteadyFlow(t, fleet, interval)
	for _, c := range fleet {
		if ok, _ := asyncZoneStore(t, c, "events"); !ok {
			t.Errorf("%s reports its store unhealthy with Redis up", c.AdminURL)
		}
	}
}

// checkAsyncSteadyFlow floods zone steady (10/s, burst 10) for one key
// through every instance of fleet for 3s, about 30 sync intervals: what the
// fleet admits after its fresh shares comes from leases, which must add up
// to the refill rate, not more (the bound) and not much less.
func checkAsyncSteadyFlow(t *testing.T, fleet []*caddyInstance, interval time.Duration) {
	t.Helper()
	limit := zones.Config{Events: 10, Window: time.Second}.Limit()
	const run = 3 * time.Second
	r := withKey("carol")
	r.Path = "/steady"
	var allowed, denied, other atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := w; time.Since(start) < run; i++ {
				res, err := fleet[i%len(fleet)].try(r)
				switch {
				case err != nil:
					other.Add(1)
				case res.Status == 200:
					allowed.Add(1)
				case res.Status == 429:
					denied.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	got := allowed.Load()
	ideal := limit.Burst + int64(elapsed)/limit.EmissionInterval
	bound := asyncBound(limit, elapsed, interval, len(fleet))
	t.Logf("async, 3 instances, events 10 window 1s, sync_interval 100ms: a flood for one key over %v (%d syncs): %d allowed, %d denied; ideal %d, bound %d",
		elapsed.Round(time.Millisecond), elapsed/interval, got, denied.Load(), ideal, bound)
	if n := other.Load(); n > 0 {
		t.Fatalf("%d responses were neither 200 nor 429", n)
	}
	if denied.Load() == 0 {
		t.Fatalf("the flood was never denied: it did not test the limit")
	}
	if got > bound {
		t.Errorf("the fleet admitted %d across %v, above the stated bound %d", got, elapsed.Round(time.Millisecond), bound)
	}
	if got < ideal*3/4 {
		t.Errorf("the fleet admitted %d across %v, less than 3/4 of the %d the limit allows", got, elapsed.Round(time.Millisecond), ideal)
	}
}

// Async mode keeps a zone's records within its max_keys, and reports them
// in the keys metric and the admin zone list. A key counts once whatever
// the zone holds of it: its record, its denial and its fail_policy local
// state are one entry (issue 23, item 6: records and the fallback table
// were each capped and summed, 2×max_keys).
func TestAsyncZoneHoldsAtMostMaxKeys(t *testing.T) {
	for _, policy := range []string{"open", "local"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			rs := startRedis(t)
			inst := startCaddyWith(t, "metrics", distributedSite(rs.Addr, `
		zone z {
			key {http.request.header.X-API-Key}
			events 1
			window 1h
			max_keys 100
			fail_policy `+policy+`
		}`, "\t\t\tmode async\n\t\t\tsync_interval 1h"))
			// Each key twice: allowed, then denied (its deny cache).
			got := sendConcurrently(t, 800, 8, func(i int) (response, error) {
				return inst.try(withKey("k" + strconv.Itoa(i/2)))
			}, nil)
			if got[429] == 0 {
				t.Errorf("400 keys sent twice at events 1: %v, want denials", got)
			}
			h := zoneHealthOf(t, inst, "z")
			if h.LocalKeys != 100 {
				t.Errorf("400 keys in an async zone with max_keys 100: local_keys %d, want 100: the cap, and each key counted once", h.LocalKeys)
			}
			if v, ok := metricValue(inst.scrape(), "caddy_rate_limit_keys", map[string]string{"zone": "z"}); !ok || v != float64(h.LocalKeys) {
				t.Errorf("caddy_rate_limit_keys{zone=z} = %v (present %v), want %d as the admin API says", v, ok, h.LocalKeys)
			}
		})
	}
}

// A FLUSHALL under an async fleet's traffic does not give a key its budget
// again: the instances notice by the epoch and restore the key from what
// they last heard (issue 23, item 8: 178 and 185 of 150 admitted).
func TestAsyncFleetKeepsAKeysBudgetAcrossAFlushAll(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	fleet := startAsyncFleet(t, 3, rs.Addr, "100ms", `
		zone api {
			key {http.request.header.X-API-Key}
			events 150
			window 1h
		}`)
	for _, c := range fleet {
		waitFor(t, 10*time.Second, c.URL+" to see 3 instances", func() bool {
			_, n := asyncZoneStore(t, c, "api")
			return n == 3
		})
	}
	r := withKey("alice")
	var allowed atomic.Int64
	send := func(n int) {
		got := sendAcross(t, fleet, n, 6, r, 5*time.Second)
		allowed.Add(int64(got[200]))
	}
	send(75) // half the budget; the syncs lease out the rest
	rc := rs.Client()
	waitFor(t, 10*time.Second, "every instance to report alice (t, c and one field each)", func() bool {
		n, _ := rc.HLen(context.Background(), "tally:api.async:alice").Result()
		return n == 5
	})
	if err := rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	flushedAt := time.Now()
	for time.Since(flushedAt) < 3*time.Second { // past the restore's hold
		send(30)
	}
	got := allowed.Load()
	t.Logf("async, 3 instances, 150 per hour: %d allowed across a FLUSHALL", got)
	if got > 150+1 {
		t.Errorf("the fleet allowed %d of a key's 150 across a FLUSHALL: it trusted a blank Redis", got)
	}
}
