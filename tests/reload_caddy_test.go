package tests

// Config reloads while requests are in flight (issue 23): what a request
// took before a reload (a concurrency slot, locally or in Redis; a charge
// still to be made after its response) is still counted, renewed, released
// and charged after it, whatever the reload changed.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// genSite is a site whose rate_limit block is block, in front of the
// counting upstream, answering with X-Gen: gen so that a test can tell when
// the reloaded config serves.
func genSite(u *countingUpstream, gen int, block string) string {
	return `http:// {
	header X-Gen ` + strconv.Itoa(gen) + `
	rate_limit {
` + block + `
	}
	reverse_proxy ` + u.Addr + `
}
`
}

// reloadTo loads sites into c and waits until a request of key probe (which
// must not be limited by the test's checks) is served by generation gen.
func reloadTo(t *testing.T, c *caddyInstance, global string, gen int, sites string) {
	t.Helper()
	load(t, c, global, sites)
	waitFor(t, 5*time.Second, fmt.Sprintf("config generation %d to serve", gen), func() bool {
		res, err := c.try(keyRequest(fmt.Sprintf("probe-%d", gen), "/fast"))
		return err == nil && res.Header.Get("X-Gen") == strconv.Itoa(gen)
	})
}

// A local concurrency zone's requests in flight stay counted across reloads
// that change its concurrency or its max_keys, and the in-flight gauge says
// what the upstream sees.
func TestLocalConcurrencyCountsSurviveReloadsThatChangeTheZone(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	zone := func(n, maxKeys int) string {
		return fmt.Sprintf(`
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency %d
			max_keys %d
		}`, n, maxKeys)
	}
	c := startCaddyWith(t, "metrics", genSite(u, 1, zone(2, 5000)))
	var held []<-chan response
	for range 2 {
		held = append(held, inBackground(c, keyRequest("alice", "/held?gate=first")))
	}
	u.waitInFlight(2)

	gauge := func(want float64) {
		t.Helper()
		if v, _ := metricValue(c.scrape(), "caddy_rate_limit_in_flight", map[string]string{"zone": "uploads"}); v != want {
			t.Errorf("caddy_rate_limit_in_flight{zone=uploads} = %v, want %v (the upstream serves %d)", v, want, u.inFlight.Load())
		}
	}
	// concurrency 2 -> 3 with 2 running: exactly one more fits.
	reloadTo(t, c, "metrics", 2, genSite(u, 2, zone(3, 5000)))
	held = append(held, inBackground(c, keyRequest("alice", "/held?gate=second")))
	u.waitInFlight(3)
	for i := range 3 {
		if res := c.Do(keyRequest("alice", "/fast")); res.Status != 429 {
			t.Fatalf("request %d beside 3 in flight after concurrency 2 -> 3: %d, want 429 (the upstream serves %d)", i, res.Status, u.inFlight.Load())
		}
	}
	gauge(3)

	// max_keys 5000 -> 6000: the 3 still count.
	reloadTo(t, c, "metrics", 3, genSite(u, 3, zone(3, 6000)))
	if res := c.Do(keyRequest("alice", "/fast")); res.Status != 429 {
		t.Fatalf("a request beside 3 in flight after max_keys 5000 -> 6000: %d, want 429 (the upstream serves %d)", res.Status, u.inFlight.Load())
	}
	gauge(3)
	if n := u.inFlight.Load(); n != 3 {
		t.Errorf("the upstream serves %d requests, want alice's 3", n)
	}

	// Once they end, their slots are free: 3 fit again, and the gauge is 0.
	u.open("first")
	u.open("second")
	for i, ch := range held {
		if res := <-ch; res.Status != 200 {
			t.Fatalf("held request %d: %d, want 200", i, res.Status)
		}
	}
	waitFor(t, 5*time.Second, "alice to hold no slot", func() bool {
		status, _ := c.adminDo(http.MethodGet, keyPath("uploads", "alice"))
		return status == http.StatusNotFound
	})
	gauge(0)
	u.peak.Store(0)
	u.gathered.Store(false)
	if counts := c.SendConcurrently(3, 3, keyRequest("alice", "/slow?gather=3&hold=100ms"), nil); counts[200] != 3 {
		t.Fatalf("3 requests after the held ones ended: %v, want 3×200", counts)
	}
}

// A reload that changes a distributed setting (here the timeout, part of
// what the Redis clients are pooled by) while requests are in flight: the
// store their slots and charges live in stays open until the last of them
// ends, so their slots are renewed past the lease and released when they
// end, and the charges of their responses land in Redis.
func TestReloadChangingDistributedKeepsInFlightSlotsAndCharges(t *testing.T) {
	t.Parallel()
	// Timeouts of seconds: this test is about the reload; with the default
	// a loaded machine would hand some decisions to fail_policy local.
	distributed := func(rs *redisServer, timeout string) string {
		return `
		distributed {
			redis redis://` + rs.Addr + `
			timeout ` + timeout + `
		}`
	}
	t.Run("renewals", func(t *testing.T) {
		t.Parallel()
		const lease = 3 * time.Second
		rs := startRedis(t)
		u := startCountingUpstream(t)
		zone := `
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 2
			lease 3s
		}`
		c := startCaddy(t, genSite(u, 1, zone+distributed(rs, "2s")))
		var held []<-chan response
		for range 2 {
			held = append(held, inBackground(c, keyRequest("alice", "/held?gate=long")))
		}
		u.waitInFlight(2)
		reloadTo(t, c, "", 2, genSite(u, 2, zone+distributed(rs, "3s")))
		start := time.Now()
		for time.Since(start) < lease+lease/2 {
			if res := c.Do(keyRequest("alice", "/fast")); res.Status != 429 {
				t.Fatalf("%v after the reload, beside alice's 2 requests in flight (concurrency 2, lease %v): %d, want 429",
					time.Since(start).Round(time.Millisecond), lease, res.Status)
			}
			time.Sleep(100 * time.Millisecond)
		}
		u.open("long")
		for i, ch := range held {
			if res := <-ch; res.Status != 200 {
				t.Fatalf("held request %d: %d, want 200", i, res.Status)
			}
		}
		ended := time.Now()
		waitFor(t, 2*time.Second, "alice's slots to be released", func() bool {
			return c.Do(keyRequest("alice", "/fast")).Status == 200
		})
		t.Logf("alice admitted %v after her requests ended", time.Since(ended).Round(time.Millisecond))
	})
	t.Run("releases", func(t *testing.T) {
		t.Parallel()
		rs := startRedis(t)
		u := startCountingUpstream(t)
		zone := `
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 2
		}`
		c := startCaddy(t, genSite(u, 1, zone+distributed(rs, "2s")))
		var held []<-chan response
		for range 2 {
			held = append(held, inBackground(c, keyRequest("alice", "/held?gate=short")))
		}
		u.waitInFlight(2)
		reloadTo(t, c, "", 2, genSite(u, 2, zone+distributed(rs, "3s")))
		u.open("short")
		for i, ch := range held {
			if res := <-ch; res.Status != 200 {
				t.Fatalf("held request %d: %d, want 200", i, res.Status)
			}
		}
		// With the default lease of 30s, slots never released would
		// lock alice out for half a minute.
		waitFor(t, 2*time.Second, "alice's slots to leave Redis", func() bool {
			return rs.Client().Exists(context.Background(), "tally:uploads:alice").Val() == 0
		})
		if res := c.Do(keyRequest("alice", "/fast")); res.Status != 200 {
			t.Fatalf("alice after her requests ended: %d, want 200", res.Status)
		}
	})
	t.Run("charges", func(t *testing.T) {
		t.Parallel()
		rs := startRedis(t)
		u := startCountingUpstream(t)
		zone := `
		zone api {
			key {http.request.header.X-API-Key}
			events 5
			window 1h
			count {
				status 200
			}
		}`
		c := startCaddy(t, genSite(u, 1, zone+distributed(rs, "2s")))
		var held []<-chan response
		for range 5 {
			held = append(held, inBackground(c, keyRequest("alice", "/stream?gate=stream")))
		}
		u.waitInFlight(5)
		reloadTo(t, c, "", 2, genSite(u, 2, zone+distributed(rs, "3s")))
		u.open("stream")
		for i, ch := range held {
			if res := <-ch; res.Status != 200 {
				t.Fatalf("held request %d: %d, want 200", i, res.Status)
			}
		}
		// The 5 responses' charges land in Redis: alice has nothing left.
		waitFor(t, 3*time.Second, "alice's 5 charges to land in Redis", func() bool {
			var k adminKey
			status, body := c.adminDo(http.MethodGet, keyPath("api", "alice"))
			return status == http.StatusOK && json.Unmarshal([]byte(body), &k) == nil && k.Remaining == 0
		})
		if res := c.Do(keyRequest("alice", "/fast")); res.Status != 429 {
			t.Fatalf("alice after 5 counted responses of 5 per hour: %d, want 429", res.Status)
		}
	})
}

// reloadSite has zone api at events, and zone steady, which no reload
// below changes.
func reloadSite(events int) string {
	return fmt.Sprintf(`http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events %d
			window 1h
		}
		zone steady {
			key {http.request.header.X-API-Key}
			events 100
			window 1h
		}
	}
	respond "ok"
}
`, events)
}

// A reload that changes a local zone's limits starts its state afresh
// (every key has its full limit again): one INFO line per such zone says so,
// and why; a zone the reload leaves as it was says nothing, nor does a
// reload that changes no limit.
func TestReloadThatStartsAZoneAfreshSaysSoAndWhy(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, reloadSite(3))
	if got := c.Send(4, withKey("alice")); got[3] != 429 {
		t.Fatalf("alice: %v, want the fourth denied", got)
	}
	const afresh = `"msg":"zone starts afresh: a reload changed its limits, so every key has its full limit again"`
	load(t, c, "", reloadSite(5))
	waitFor(t, 5*time.Second, "the INFO line of zone api starting afresh", func() bool {
		return strings.Contains(c.Output(), afresh+`,"zone":"api","changed":"events 3 → 5, burst 3 → 5"}`)
	})
	if got := c.Send(1, withKey("alice")); got[0] != 200 {
		t.Errorf("alice after the reload: %v, want 200 (a fresh state)", got)
	}
	load(t, c, "", strings.Replace(reloadSite(5), `respond "ok"`, `respond "still ok"`, 1))
	waitFor(t, 5*time.Second, "the reloaded config to serve", func() bool { return c.Do(request{}).Body == "still ok" })
	if n := strings.Count(c.Output(), afresh); n != 1 {
		t.Errorf("%d lines of a zone starting afresh, want 1 (zone api's first reload; not zone steady, not a reload that changes no limit):\n%s", n, c.Output())
	}
}

// The same for a connection zone (the listener wrapper's): a reload that
// changes its limits says it starts afresh, and why.
func TestReloadThatStartsAConnectionZoneAfreshSaysSo(t *testing.T) {
	t.Parallel()
	global := func(events int) string {
		return fmt.Sprintf(`	servers {
		listener_wrappers {
			rate_limit {
				zone conn {
					key {remote_ip}
					events %d
					window 1h
				}
			}
			tls
		}
	}`, events)
	}
	const site = "http:// {\n\trespond \"ok\"\n}\n"
	c := startCaddyWith(t, global(50), site)
	load(t, c, global(60), site)
	waitFor(t, 5*time.Second, "the INFO line of connection zone conn starting afresh", func() bool {
		return strings.Contains(c.Output(), `"msg":"zone starts afresh: a reload changed its limits, so every key has its full limit again","zone":"conn","changed":"events 50 → 60, burst 50 → 60"}`)
	})
}
