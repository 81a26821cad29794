package tests

// Hardening II: what must hold when Redis or its data misbehave, through
// real Caddy processes and a real redis-server: resets reach every
// instance, values tally did not write are deleted and reported, async
// zones keep max_keys, fail_policy local starts from what Redis last said,
// a request a cached denial settles costs Redis nothing, one request waits
// for Redis at most once, and a reload never counts an instance twice.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// zoneHealth is the store part of a zone in GET /rate_limit/zones, with the
// fields these tests read.
type zoneHealth struct {
	Name      string `json:"name"`
	Mode      string `json:"mode"`
	LocalKeys int    `json:"local_keys"`
	Store     *struct {
		OK          bool   `json:"ok"`
		Instances   int    `json:"instances"`
		LastProblem string `json:"last_problem"`
	} `json:"store"`
}

func zoneHealthOf(t *testing.T, c *caddyInstance, zone string) zoneHealth {
	t.Helper()
	var list []zoneHealth
	c.adminJSON("/rate_limit/zones", &list)
	for _, z := range list {
		if z.Name == zone {
			return z
		}
	}
	t.Fatalf("zone %s not listed by %s", zone, c.AdminURL)
	return zoneHealth{}
}

// distributedSite is a site whose rate_limit has zones and a distributed
// block with extra settings (mode, timeout...).
func distributedSite(redisAddr, zones, extra string) string {
	return `http:// {
	rate_limit {
` + zones + `
		distributed {
			redis redis://` + redisAddr + `
` + extra + `
		}
	}
	respond "ok"
}
`
}

// The README says a DELETE lets the key through on every instance at once.
// The deny cache of the other instances must hear of it: a reset is
// published, and reaches them within resetBound.
func TestAdminResetUnblocksTheKeyOnEveryInstance(t *testing.T) {
	t.Parallel()
	const resetBound = time.Second
	for _, mode := range []string{"strict", "async"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			rs := startRedis(t)
			site := distributedSite(rs.Addr, `
		zone api {
			key {http.request.header.X-API-Key}
			events 10
			window 1h
		}`, "\t\t\tmode "+mode+"\n\t\t\ttimeout 1s")
			a, b := startCaddy(t, site), startCaddy(t, site)
			for _, c := range []*caddyInstance{a, b} {
				waitFor(t, 10*time.Second, c.URL+" to deny cust", func() bool { return c.Do(withKey("cust")).Status == 429 })
			}
			// Both instances now deny cust from their own state.
			if got := b.Do(withKey("cust")); got.Status != 429 {
				t.Fatalf("B before the reset: %d, want 429", got.Status)
			}
			if status, body := a.adminDo("DELETE", keyPath("api", "cust")); status != 204 {
				t.Fatalf("DELETE on A: %d %s", status, body)
			}
			reset := time.Now()
			if got := a.Do(withKey("cust")); got.Status != 200 {
				t.Fatalf("A after its own reset: %d, want 200", got.Status)
			}
			waitFor(t, 10*time.Second, "B to let cust through after the reset on A", func() bool {
				return b.Do(withKey("cust")).Status == 200
			})
			if d := time.Since(reset); d > resetBound {
				t.Errorf("B let cust through %v after the reset on A, want within %v", d.Round(time.Millisecond), resetBound)
			}
		})
	}
}

// A value tally did not write at one of its keys (here a SET or HSET by
// someone else, with no TTL) must neither block nor free the key for good:
// the decision that finds it goes to the fail policy, the value is deleted,
// the key is limited again from its next request, and the problem shows in
// the log (once), the store errors metric and the admin zone list.
func TestForeignValueAtATallyKeyIsDeletedAndReported(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode, policy, redisKey, plant string
		// the foreign value costs one decision, by the fail policy
		wantAllowed int
	}{
		{"strict", "open", "tally:z:w", "hset", 11},
		{"strict", "closed", "tally:z:w", "hset", 10},
		{"async", "closed", "tally:z.async:w", "set", 10},
	} {
		t.Run(c.mode+"/"+c.policy, func(t *testing.T) {
			t.Parallel()
			rs := startRedis(t)
			inst := startCaddyWith(t, "metrics", distributedSite(rs.Addr, `
		zone z {
			key {http.request.header.X-API-Key}
			events 10
			window 1h
			fail_policy `+c.policy+`
		}`, "\t\t\tmode "+c.mode+"\n\t\t\ttimeout 1s"+map[string]string{"async": "\n\t\t\tsync_interval 50ms"}[c.mode]))
			ctx := context.Background()
			rc := rs.Client()
			if c.plant == "hset" {
				rc.HSet(ctx, c.redisKey, "a", "b")
			} else {
				rc.Set(ctx, c.redisKey, "x", 0)
			}
			allowed := 0
			for i := 0; i < 30; i++ {
				res := inst.Do(withKey("w"))
				if res.Status >= 500 {
					t.Fatalf("request %d: %d", i, res.Status)
				}
				if res.Status == 200 {
					allowed++
				}
				if c.mode == "async" && i == 0 {
					// Let a sync find the value before the fresh share
					// is spent.
					waitFor(t, 5*time.Second, "the sync to report the foreign value", func() bool {
						return zoneHealthOf(t, inst, "z").Store.LastProblem != ""
					})
				}
			}
			if c.mode == "async" {
				// Async admits from local allowances: what is checked is
				// that the key is limited at all (10 per hour), not starved.
				if allowed < 9 || allowed > 11 {
					t.Errorf("30 requests for a key whose Redis value was foreign: %d allowed, want 10 (±1)", allowed)
				}
			} else if allowed != c.wantAllowed {
				t.Errorf("30 requests for a key whose Redis value was foreign, fail_policy %s: %d allowed, want %d", c.policy, allowed, c.wantAllowed)
			}
			want := map[string]string{"strict": "string", "async": "hash"}[c.mode]
			waitFor(t, 5*time.Second, "tally's own value at "+c.redisKey, func() bool {
				return rc.Type(ctx, c.redisKey).Val() == want
			})
			if ttl := rc.PTTL(ctx, c.redisKey).Val(); ttl <= 0 {
				t.Errorf("the key has no TTL after the requests (%v)", ttl)
			}
			h := zoneHealthOf(t, inst, "z")
			if h.Store == nil || !strings.Contains(h.Store.LastProblem, "tally did not write") && !strings.Contains(h.Store.LastProblem, "another type") {
				t.Errorf("admin zone list: store %+v, want last_problem naming the foreign value", h.Store)
			}
			if v, ok := metricValue(inst.scrape(), "caddy_rate_limit_store_errors_total", map[string]string{"zone": "z"}); !ok || v < 1 {
				t.Errorf("caddy_rate_limit_store_errors_total{zone=z} = %v (present %v), want >= 1", v, ok)
			}
			if n := strings.Count(inst.Output(), "a value tally did not write"); n != 1 {
				t.Errorf("the log has %d lines about the foreign value, want 1", n)
			}
		})
	}
}

// Async mode keeps a zone's records within its max_keys, and reports them
// in the keys metric and the admin zone list.
func TestAsyncZoneHoldsAtMostMaxKeys(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	inst := startCaddyWith(t, "metrics", distributedSite(rs.Addr, `
		zone z {
			key {http.request.header.X-API-Key}
			events 10
			window 1h
			max_keys 100
			fail_policy open
		}`, "\t\t\tmode async\n\t\t\tsync_interval 1h"))
	sendConcurrently(t, 400, 8, func(i int) (response, error) {
		return inst.try(withKey("k" + strconv.Itoa(i)))
	}, nil)
	h := zoneHealthOf(t, inst, "z")
	if h.LocalKeys != 100 {
		t.Errorf("400 keys in an async zone with max_keys 100: local_keys %d, want 100: the cap, and the records counted", h.LocalKeys)
	}
	if v, ok := metricValue(inst.scrape(), "caddy_rate_limit_keys", map[string]string{"zone": "z"}); !ok || v != float64(h.LocalKeys) {
		t.Errorf("caddy_rate_limit_keys{zone=z} = %v (present %v), want %d as the admin API says", v, ok, h.LocalKeys)
	}
}

// fail_policy local must start from what this instance last learned of a
// key, not from a full share: a key used up in Redis stays used up when
// Redis stops answering.
func TestFailLocalStartsFromWhatRedisLastSaid(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	inst := startCaddy(t, distributedSite(rs.Addr, `
		zone z {
			key {http.request.header.X-API-Key}
			events 100
			window 100s
		}`, "\t\t\ttimeout 300ms"))
	waitFor(t, 10*time.Second, "the store to see this instance", func() bool {
		h := zoneHealthOf(t, inst, "z")
		return h.Store.OK && h.Store.Instances == 1
	})
	got := countStatuses(inst.Send(100, withKey("k")))
	if got[200] != 100 {
		t.Fatalf("100 requests with Redis up: %v, want 100×200", got)
	}
	rs.Pause()
	defer rs.Resume()
	start := time.Now()
	statuses := inst.Send(60, withKey("k"))
	elapsed := time.Since(start)
	after := countStatuses(statuses)
	// One token per second refills; the run takes a few seconds.
	if want := int(elapsed/time.Second) + 2; after[200] > want || after.serverErrors() > 0 {
		t.Errorf("a used-up key during an outage, over %v: %v, want at most %d allowed (refill at 1/s), no 5xx", elapsed.Round(time.Millisecond), after, want)
	}
}

// A request that a zone's deny cache already denies costs no Redis call in
// the other zones: no decision, no refund.
func TestRequestDeniedByACachedZoneCostsNoRedisCall(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	// hourly (100/h) is the tighter rate and is checked first; burst5
	// (360/h, burst 5) denies after 5 and then for 10s.
	inst := startCaddy(t, distributedSite(rs.Addr, `
		zone hourly {
			key {http.request.header.X-API-Key}
			events 100
			window 1h
		}
		zone burst5 {
			key {http.request.header.X-API-Key}
			events 360
			window 1h
			burst 5
		}`, "\t\t\ttimeout 1s"))
	// Load the scripts (a first call may be NOSCRIPT and then EVAL) and
	// let the first heartbeat run before counting.
	if got := inst.Do(withKey("warm-up")); got.Status != 200 {
		t.Fatalf("warm-up request: %d", got.Status)
	}
	waitFor(t, 10*time.Second, "the first heartbeat", func() bool {
		h := zoneHealthOf(t, inst, "hourly")
		return h.Store.OK && rs.Client().Exists(context.Background(), "tally:instances").Val() == 1
	})
	before := evalCalls(t, rs)
	start := time.Now()
	got := countStatuses(inst.Send(100, withKey("k")))
	elapsed := time.Since(start)
	calls := evalCalls(t, rs) - before
	if got[200] != 5 || got[429] != 95 {
		t.Fatalf("100 requests: %v, want 5×200 95×429", got)
	}
	// 5 allowed × 2 zones, the first denial (hourly decided, burst5
	// denied, hourly refunded), then nothing; plus a heartbeat a second.
	want := int64(5*2+3) + int64(elapsed/time.Second) + 1
	if calls > want {
		t.Errorf("100 requests, 95 denied by burst5's deny cache, ran %d scripts in %v, want at most %d: cached denials must cost no decision or refund in hourly", calls, elapsed.Round(time.Millisecond), want)
	}
}

// "A request waits at most timeout for Redis" holds per request: through
// two rate_limit handlers (and their zones) with Redis frozen, a request
// waits one timeout, not one per handler or zone.
func TestOneRequestWaitsForRedisAtMostOneTimeout(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	const timeout = 800 * time.Millisecond
	handler := func(zone string) string {
		return `
	rate_limit {
		zone ` + zone + ` {
			key {http.request.header.X-API-Key}
			events 100
			window 1h
			fail_policy open
		}
		distributed {
			redis redis://` + rs.Addr + `
			timeout 800ms
		}
	}`
	}
	inst := startCaddy(t, "http:// {\n\troute {"+handler("first")+handler("second")+"\n\t\trespond \"ok\"\n\t}\n}\n")
	if got := inst.Do(withKey("k")); got.Status != 200 {
		t.Fatalf("with Redis up: %d", got.Status)
	}
	rs.Pause()
	defer rs.Resume()
	// The breaker opens after a few failures; the first requests wait.
	res := inst.Do(withKey("k"))
	if res.Status != 200 {
		t.Fatalf("fail_policy open with Redis frozen: %d, want 200", res.Status)
	}
	if res.Elapsed < timeout*3/4 {
		t.Fatalf("the first request with Redis frozen took %v: it did not wait for Redis, so this test proves nothing", res.Elapsed)
	}
	if res.Elapsed > timeout+timeout/2 {
		t.Errorf("a request through two handlers with Redis frozen took %v, want one timeout (%v) and a margin, not one per handler", res.Elapsed.Round(time.Millisecond), timeout)
	}
}

// A reload that replaces the store (here: another timeout) while Redis is
// unreachable must not leave this instance counted twice once Redis is
// back: that would halve every fail_policy local share.
func TestStoreChangingReloadDuringOutageCountsTheInstanceOnce(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	zone := `
		zone z {
			key {http.request.header.X-API-Key}
			events 100
			window 1h
		}`
	inst := startCaddy(t, distributedSite(rs.Addr, zone, "\t\t\ttimeout 100ms"))
	waitFor(t, 10*time.Second, "the store to see this instance", func() bool {
		h := zoneHealthOf(t, inst, "z")
		return h.Store.OK && h.Store.Instances == 1
	})
	rs.Pause()
	waitFor(t, 10*time.Second, "the breaker to open", func() bool {
		inst.Do(withKey("k"))
		return !zoneHealthOf(t, inst, "z").Store.OK
	})
	load(t, inst, "", distributedSite(rs.Addr, zone, "\t\t\ttimeout 150ms"))
	rs.Resume()
	ctx := context.Background()
	waitFor(t, 10*time.Second, "the new store to beat", func() bool {
		h := zoneHealthOf(t, inst, "z")
		return h.Store.OK && rs.Client().ZCard(ctx, "tally:instances").Val() >= 1
	})
	// The old store's id would live on for 10s after its last beat; the
	// new store removes it with its next beat (every second).
	waitFor(t, 3*time.Second, "one member in tally:instances", func() bool {
		return rs.Client().ZCard(ctx, "tally:instances").Val() == 1
	})
	waitFor(t, 3*time.Second, "the zone to count 1 instance", func() bool {
		return zoneHealthOf(t, inst, "z").Store.Instances == 1
	})
}

// A process is one instance in the heartbeat set however many stores it
// has: here a strict and an async handler on one Redis. Counted twice, it
// would get half its fail_policy local share (and async fresh shares).
func TestOneCaddyWithStrictAndAsyncHandlersCountsOnce(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	inst := startCaddy(t, matrixSite(rs.Addr))
	ctx := context.Background()
	waitFor(t, 10*time.Second, "both stores to beat", func() bool {
		s, a := zoneHealthOf(t, inst, "s_local"), zoneHealthOf(t, inst, "a_local")
		return s.Store.OK && a.Store.OK && rs.Client().Exists(ctx, "tally:instances").Val() == 1
	})
	// Both stores beat at once when they open and then every second:
	// over two seconds each has beaten at least twice.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		if n := rs.Client().ZCard(ctx, "tally:instances").Val(); n != 1 {
			t.Fatalf("tally:instances has %d members for one Caddy, want 1", n)
		}
		for _, z := range []string{"s_local", "a_local"} {
			if n := zoneHealthOf(t, inst, z).Store.Instances; n != 1 {
				t.Fatalf("zone %s counts %d instances, want 1", z, n)
			}
		}
		time.Sleep(50 * time.Millisecond) // pacing the polls over the period the invariant must hold
	}
}
