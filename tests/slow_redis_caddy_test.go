package tests

// A Redis that accepts connections but does not answer (frozen with SIGSTOP,
// or busy in DEBUG SLEEP) must cost each request at most the configured
// timeout: every zone then applies its fail policy, and none answers 5xx;
// through several handlers and zones, a request waits one timeout in all.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// slowRedisTimeout is the distributed timeout of the Caddy under test, and
// slowRedisMargin what a response may take beyond it (the Caddy is built
// with -race and shares the machine with the test).
const (
	slowRedisTimeout = 50 * time.Millisecond
	slowRedisMargin  = time.Second
)

func slowRedisSite(redisAddr string) string {
	return `http:// {
	rate_limit {
		zone open {
			match {
				path /open
			}
			key {http.request.header.X-API-Key}
			events 1
			window 1h
			fail_policy open
		}
		zone closed {
			match {
				path /closed
			}
			key {http.request.header.X-API-Key}
			events 100
			window 1h
			fail_policy closed
		}
		zone fallback {
			match {
				path /local
			}
			key {http.request.header.X-API-Key}
			events 3
			window 1h
			fail_policy local
		}
		distributed {
			redis redis://` + redisAddr + `
			timeout ` + slowRedisTimeout.String() + `
		}
	}
	respond "ok"
}
`
}

func TestSlowRedisBoundsEveryRequestByTimeout(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	c := startCaddy(t, slowRedisSite(rs.Addr))
	// Healthy, with the heartbeat seen (one instance: fail_policy local
	// then enforces the whole limit on this instance).
	waitFor(t, 10*time.Second, "the store to be healthy with 1 instance", func() bool {
		ok, n := zoneStore(t, c, "fallback")
		return ok && n == 1
	})
	waitRedisDecides(t, c, "start")

	t.Run("SIGSTOP", func(t *testing.T) {
		rs.Pause()
		paused := true
		defer func() {
			if paused {
				rs.Resume()
			}
		}()
		checkFailPolicies(t, c, "sigstop")
		rs.Resume()
		paused = false
		waitRedisDecides(t, c, "sigstop")
	})

	t.Run("DEBUG SLEEP", func(t *testing.T) {
		ctx := context.Background()
		sleeper := redis.NewClient(&redis.Options{Addr: rs.Addr, ReadTimeout: 10 * time.Second, MaxRetries: -1})
		defer sleeper.Close()
		woke := make(chan error, 1)
		go func() { woke <- sleeper.Do(ctx, "DEBUG", "SLEEP", "2").Err() }()
		defer func() {
			select {
			case <-woke:
			case <-time.After(10 * time.Second):
				t.Error("DEBUG SLEEP 2 did not return within 10s")
			}
		}()

		// Poll from a third connection until the server no longer answers:
		// then it is inside DEBUG SLEEP.
		probe := redis.NewClient(&redis.Options{Addr: rs.Addr, ReadTimeout: 100 * time.Millisecond,
			ContextTimeoutEnabled: true, MaxRetries: -1})
		defer probe.Close()
		waitFor(t, 5*time.Second, "redis-server to be busy in DEBUG SLEEP", func() bool {
			pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			return probe.Ping(pctx).Err() != nil
		})
		start := time.Now()
		checkFailPolicies(t, c, "debug-sleep")
		select {
		case err := <-woke:
			woke <- err // for the deferred wait
			t.Fatalf("redis-server finished DEBUG SLEEP 2 before the requests were done (they took %v): the assertions above assumed it was busy throughout", time.Since(start))
		default:
		}
		select {
		case err := <-woke:
			woke <- err
			if err != nil {
				t.Fatalf("DEBUG SLEEP 2: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("DEBUG SLEEP 2 did not return within 10s")
		}
		waitRedisDecides(t, c, "debug-sleep")
	})
}

// checkFailPolicies sends requests to each zone while Redis does not answer
// and checks that each response is timely, not 5xx, and what the zone's fail
// policy says: open allows, closed denies with a Retry-After, local enforces
// the zone's limit in-process (3 allowed, then denied).
func checkFailPolicies(t *testing.T, c *caddyInstance, tag string) {
	t.Helper()
	limit := slowRedisTimeout + slowRedisMargin
	var slowest time.Duration
	defer func() { t.Logf("slowest response with Redis not answering: %v (bound %v)", slowest, limit) }()
	send := func(path, key string) response {
		t.Helper()
		res, err := c.try(request{Path: path, Header: map[string]string{"X-API-Key": key}})
		if err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, res.Elapsed)
		if res.Elapsed > limit {
			t.Errorf("%s took %v with Redis not answering, want at most %v (timeout %v)", path, res.Elapsed, limit, slowRedisTimeout)
		}
		if res.Status >= 500 {
			t.Errorf("%s answered %d with Redis not answering: %s", path, res.Status, res.Body)
		}
		return res
	}
	var local []int
	for i := 0; i < 5; i++ {
		if res := send("/open", "open-"+tag); res.Status != 200 {
			t.Errorf("request %d to /open (fail_policy open): %d, want 200", i, res.Status)
		}
		res := send("/closed", "closed-"+tag)
		ra, err := strconv.Atoi(res.Header.Get("Retry-After"))
		if res.Status != 429 || err != nil || ra < 1 {
			t.Errorf("request %d to /closed (fail_policy closed): %d with Retry-After %q, want 429 with a Retry-After >= 1",
				i, res.Status, res.Header.Get("Retry-After"))
		}
		local = append(local, send("/local", "local-"+tag).Status)
	}
	if got, want := fmt.Sprint(local), "[200 200 200 429 429]"; got != want {
		t.Errorf("/local (fail_policy local, events 3, 1 instance): %s, want %s", got, want)
	}
}

// waitRedisDecides polls until decisions go through Redis again: the admin
// API reports the store healthy, a fresh key of the open zone (events 1) is
// denied on its second request, which fail_policy open would have allowed,
// and a fresh key of the closed zone is allowed.
func waitRedisDecides(t *testing.T, c *caddyInstance, tag string) {
	t.Helper()
	attempt := 0
	waitFor(t, 20*time.Second, "decisions to go through Redis again", func() bool {
		attempt++
		if ok, _ := zoneStore(t, c, "open"); !ok {
			return false
		}
		key := "recovered-" + tag + "-" + strconv.Itoa(attempt)
		var got []int
		for _, path := range []string{"/open", "/open", "/closed"} {
			res, err := c.try(request{Path: path, Header: map[string]string{"X-API-Key": key}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status >= 500 {
				t.Fatalf("%s answered %d during recovery: %s", path, res.Status, res.Body)
			}
			got = append(got, res.Status)
		}
		return fmt.Sprint(got) == "[200 429 200]"
	})
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

// An outage starts at the second failed call in a row, before the breaker
// opens (5 failures): the store's one WARN is logged then and the zone list
// says the calls are failing; the next success ends it. (One slow call alone
// is no outage: TestDeadSeedAddressesCostNothingOnCluster.)
func TestRedisFailingBeforeTheBreakerOpensIsLoggedAndShown(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	c := startCaddy(t, slowRedisSite(rs.Addr))
	waitRedisDecides(t, c, "start")
	rs.Pause()
	paused := true
	defer func() {
		if paused {
			rs.Resume()
		}
	}()
	// Two failed decisions; the heartbeat (one call a second) adds at most
	// one more before the checks below, so the breaker stays closed.
	for i := range 2 {
		c.Do(request{Path: "/closed", Header: map[string]string{"X-API-Key": "failing-" + strconv.Itoa(i)}})
	}
	// Caddy's log reaches the test through a pipe: poll for the line.
	waitFor(t, 2*time.Second, "the WARN after two failed calls", func() bool { return strings.Contains(c.Output(), unreachableMsg) })
	if n := strings.Count(c.Output(), unreachableMsg); n != 1 {
		t.Errorf("%d WARN lines %q after two failed calls, want 1", n, unreachableMsg)
	}
	if f := row(rateLimitCLI(t, c, "zones").ok(t, "zones"), "closed"); !slices.Contains(f, "FAILING") {
		t.Errorf("caddy rate-limit zones, zone closed: %q, want the REDIS column FAILING", f)
	}
	rs.Resume()
	paused = false
	waitRedisDecides(t, c, "failing")
	for _, z := range listHealth(t, c) {
		if z.Store == nil || !z.Store.OK || z.Store.Failing {
			t.Errorf("zone %s after Redis answered again: store %+v, want ok", z.Name, z.Store)
		}
	}
	if n := strings.Count(c.Output(), unreachableMsg); n != 1 {
		t.Errorf("%d WARN lines %q for one outage, want 1", n, unreachableMsg)
	}
	waitFor(t, 2*time.Second, "the INFO line 'redis reachable again' after the outage", func() bool {
		return strings.Contains(c.Output(), "redis reachable again")
	})
}
