package tests

// Config reloads while requests are in flight (issue 23): what a request
// took before a reload (a concurrency slot, locally or in Redis; a charge
// still to be made after its response) is still counted, renewed, released
// and charged after it, whatever the reload changed.

import (
	"fmt"
	"net/http"
	"strconv"
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
