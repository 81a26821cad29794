package tests

// Local mode (no distributed block) through a real Caddy: what an operator
// sees from the outside.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// apiKeySite is a site limiting each X-API-Key to events per window, with
// extra handler options.
func apiKeySite(events int, window, options string) string {
	return fmt.Sprintf(`http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events %d
			window %s
		}
		%s
	}
	respond "ok" 200
}
`, events, window, options)
}

func TestSequentialRunAllowsExactlyEventsThenDenies(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, apiKeySite(10, "1h", ""))

	got := c.Send(15, withKey("alice"))
	want := []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429, 429, 429, 429}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
}

func TestConcurrentRunAllowsExactlyEvents(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, apiKeySite(50, "1h", ""))

	counts := c.SendConcurrently(500, 64, withKey("alice"), nil)
	if counts[200] != 50 || counts[429] != 450 {
		t.Fatalf("500 concurrent requests at events 50: %v, want 50×200 450×429", counts)
	}
	if n := counts.serverErrors(); n > 0 {
		t.Fatalf("%d server errors: %v", n, counts)
	}
}

var (
	ietfState = regexp.MustCompile(`^"api";r=(\d+);t=(\d+)$`)
	legacy    = []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	ietf      = []string{"RateLimit-Policy", "RateLimit"}
)

func TestDefaultHeadersSendBothFamiliesWithDecreasingRemaining(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, apiKeySite(10, "1h", ""))

	start := time.Now()
	for i := 1; i <= 11; i++ {
		res := c.Do(withKey("alice"))
		// Every value is a whole number of seconds rounded up from
		// "interval minus the time since the first request": exact while
		// that time is under a second, one less for each second after.
		slack := int(time.Since(start) / time.Second)
		within := func(got, want int) bool { return got <= want && got >= want-slack }
		wantRemaining := max(10-i, 0)
		if got := res.Header.Get("RateLimit-Policy"); got != `"api";q=10;w=3600` {
			t.Fatalf("request %d: RateLimit-Policy = %q, want %q", i, got, `"api";q=10;w=3600`)
		}
		m := ietfState.FindStringSubmatch(res.Header.Get("RateLimit"))
		if m == nil {
			t.Fatalf("request %d: RateLimit = %q, want \"api\";r=<n>;t=<s>", i, res.Header.Get("RateLimit"))
		}
		if r, _ := strconv.Atoi(m[1]); r != wantRemaining {
			t.Errorf("request %d: RateLimit r=%d, want %d", i, r, wantRemaining)
		}
		// t is the time until one more request is available (draft-10):
		// one emission interval (360s) after the first request, whether
		// the key has quota left or is denied.
		if tt, _ := strconv.Atoi(m[2]); !within(tt, 360) {
			t.Errorf("request %d: RateLimit t=%d, want 360 (one interval), less %ds elapsed at most", i, tt, slack)
		}
		if got := res.Header.Get("RateLimit-Limit"); got != "10" {
			t.Errorf("request %d: RateLimit-Limit = %q, want 10", i, got)
		}
		if got := res.Header.Get("RateLimit-Remaining"); got != strconv.Itoa(wantRemaining) {
			t.Errorf("request %d: RateLimit-Remaining = %q, want %d", i, got, wantRemaining)
		}
		// The legacy trio keeps its meaning: seconds until the key is
		// full again, one interval further with each allowed request.
		if got, _ := strconv.Atoi(res.Header.Get("RateLimit-Reset")); !within(got, 360*min(i, 10)) {
			t.Errorf("request %d: RateLimit-Reset = %d, want %d", i, got, 360*min(i, 10))
		}
		if i <= 10 {
			if res.Status != 200 || res.Header.Get("Retry-After") != "" {
				t.Fatalf("request %d: status %d Retry-After %q, want 200 and none", i, res.Status, res.Header.Get("Retry-After"))
			}
		} else if res.Status != 429 || res.Header.Get("Retry-After") != m[2] {
			// Retry-After must not be earlier than t (draft-10 §6);
			// both are the time until the next request is allowed.
			t.Fatalf("request %d: status %d Retry-After %q, want 429 and Retry-After = t = %s", i, res.Status, res.Header.Get("Retry-After"), m[2])
		}
	}
}

// Caddy's header directive edits response header values in place (a
// deferred replace runs when the response is written, after rate_limit set
// them). Responses that carry the same numbers come from one cached
// rendering; each must still get its own copy: a replace that is not
// idempotent (q= becomes q=7) shows up exactly once on every response, on
// allowed requests and on 429s alike.
func TestHeaderDirectiveEditsOnlyItsOwnResponse(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	header >RateLimit-Policy "q=" "q=7"
	header >RateLimit-Limit "1" "71"
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 1
			window 1h
		}
	}
	respond "ok"
}
`)
	for round := range 3 {
		for _, key := range []string{"alice", "bob", "carol"} {
			res := c.Do(withKey(key))
			if want := []int{200, 429, 429}[round]; res.Status != want {
				t.Fatalf("%s, request %d: status %d, want %d", key, round+1, res.Status, want)
			}
			if got, want := res.Header.Get("RateLimit-Policy"), `"api";q=71;w=3600`; got != want {
				t.Fatalf("%s, request %d: RateLimit-Policy %q, want %q (edited once)", key, round+1, got, want)
			}
			if got := res.Header.Get("RateLimit-Limit"); got != "71" {
				t.Fatalf("%s, request %d: RateLimit-Limit %q, want 71 (edited once)", key, round+1, got)
			}
		}
	}
}

func TestHeadersModeSendsOnlyItsFamily(t *testing.T) {
	t.Parallel()
	cases := []struct {
		mode       string
		want, none []string
	}{
		{"ietf", ietf, legacy},
		{"legacy", legacy, ietf},
		{"off", nil, append(append([]string{}, ietf...), legacy...)},
	}
	var sites strings.Builder
	for _, tc := range cases {
		fmt.Fprintf(&sites, `http://%s.test {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 1
			window 1h
		}
		headers %s
	}
	respond "ok"
}
`, tc.mode, tc.mode)
	}
	c := startCaddy(t, sites.String())
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			// The three handlers define zone api alike, so they share
			// its state: each mode gets its own key.
			r := withKey("alice-" + tc.mode)
			r.Header["Host"] = tc.mode + ".test"
			for i, wantStatus := range []int{200, 429} {
				res := c.Do(r)
				if res.Status != wantStatus {
					t.Fatalf("request %d: status %d, want %d", i+1, res.Status, wantStatus)
				}
				for _, h := range tc.want {
					if res.Header.Get(h) == "" {
						t.Errorf("request %d: %s missing", i+1, h)
					}
				}
				for _, h := range tc.none {
					if v := res.Header.Get(h); v != "" {
						t.Errorf("request %d: %s = %q, want none with headers %s", i+1, h, v, tc.mode)
					}
				}
				if wantStatus == 429 && res.Header.Get("Retry-After") == "" {
					t.Errorf("denied without Retry-After under headers %s", tc.mode)
				}
			}
		})
	}
}

func TestRetryAfterIsWholeSecondsUntilTheNextRequestIsAllowed(t *testing.T) {
	t.Parallel()
	// 2 per 10s: one request every 5s once the burst is spent.
	c := startCaddy(t, apiKeySite(2, "10s", ""))
	start := time.Now()
	c.Send(2, withKey("alice"))
	res := c.Do(withKey("alice"))
	elapsed := time.Since(start)
	if res.Status != 429 {
		t.Fatalf("third request: status %d, want 429", res.Status)
	}
	ra, err := strconv.Atoi(res.Header.Get("Retry-After"))
	if err != nil {
		t.Fatalf("Retry-After = %q, want whole seconds", res.Header.Get("Retry-After"))
	}
	// 5s after the first request, rounded up: exactly 5 unless the three
	// requests took a second or more.
	if want := 5; ra > want || ra < want-int(elapsed/time.Second) {
		t.Fatalf("Retry-After = %d after %v, want 5 (window/events, rounded up)", ra, elapsed)
	}
}

func TestJitterOnlyLengthensRetryAfter(t *testing.T) {
	t.Parallel()
	// Without jitter a denied key would be told 360s (1h/10); jitter 0.5
	// adds up to half of that.
	c := startCaddy(t, apiKeySite(10, "1h", "jitter 0.5"))
	c.Send(10, withKey("alice"))
	seen := map[int]bool{}
	for i := 0; i < 20; i++ {
		res := c.Do(withKey("alice"))
		if res.Status != 429 {
			t.Fatalf("status %d, want 429", res.Status)
		}
		ra, err := strconv.Atoi(res.Header.Get("Retry-After"))
		if err != nil {
			t.Fatalf("Retry-After = %q, want whole seconds", res.Header.Get("Retry-After"))
		}
		if ra < 359 || ra > 540 {
			t.Fatalf("Retry-After = %d, want between the un-jittered 360 and 540", ra)
		}
		seen[ra] = true
	}
	if len(seen) < 2 {
		t.Fatalf("20 denials all had Retry-After %v: jitter 0.5 did not vary it", seen)
	}
}

func TestDifferentKeysHaveSeparateLimits(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, apiKeySite(3, "1h", ""))
	for _, key := range []string{"alice", "bob", "carol"} {
		got := countStatuses(c.Send(5, withKey(key)))
		if got[200] != 3 || got[429] != 2 {
			t.Errorf("key %s: %v, want 3×200 2×429", key, got)
		}
	}
}

func TestIPv4PrefixMakesANetworkShareOneLimit(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone net {
			key {client_ip}
			ipv4_prefix 24
			events 4
			window 1h
		}
		zone ip {
			key {client_ip}
			events 100
			window 1h
		}
	}
	respond "{client_ip}"
}
`)
	from1, from2 := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2")
	res := c.Do(request{Client: from2})
	if res.Status != 200 || res.Body != "127.0.0.2" {
		t.Fatalf("from 127.0.0.2: %d %q, want 200 and {client_ip} 127.0.0.2", res.Status, res.Body)
	}
	var got []int
	for i := 0; i < 3; i++ {
		got = append(got, c.Do(request{Client: from1}).Status)
	}
	// 127.0.0.1 and .2 are one /24: four requests in all, then denied
	// from either address.
	got = append(got, c.Do(request{Client: from2}).Status, c.Do(request{Client: from1}).Status)
	if fmt.Sprint(got) != "[200 200 200 429 429]" {
		t.Fatalf("statuses from one /24 = %v, want [200 200 200 429 429]", got)
	}
	// The key is the /24 itself: a /16 or the bare address would be
	// another key.
	var k adminKey
	c.adminJSON(keyPath("net", "127.0.0.0/24"), &k)
	if k.Remaining != 0 {
		t.Errorf("key 127.0.0.0/24: %+v, want the spent network", k)
	}
	if status, body := c.adminDo(http.MethodGet, keyPath("net", "127.0.0.0/16")); status != http.StatusNotFound {
		t.Errorf("zone net has state for 127.0.0.0/16: %d %s, want only the /24", status, body)
	}
	// An address is read as the zone stores it: its /24.
	var addr adminKey
	c.adminJSON(keyPath("net", "127.0.0.1"), &addr)
	if addr.StoredAs != "127.0.0.0/24" || addr.Remaining != 0 {
		t.Errorf("GET of 127.0.0.1: %+v, want it read as stored, 127.0.0.0/24, spent", addr)
	}
}

func TestDeniedRequestConsumesNothingInOtherZones(t *testing.T) {
	t.Parallel()
	// Zones are evaluated tightest (lowest rate) first: global (6 per hour)
	// decides before per_key (3 per minute), so when per_key denies, the
	// request global allowed must be given back.
	c := startCaddy(t, `http:// {
	rate_limit {
		zone per_key {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}
		zone global {
			key everyone
			events 6
			window 1h
		}
	}
	respond "ok"
}
`)
	if got := countStatuses(c.Send(20, withKey("A"))); got[200] != 3 || got[429] != 17 {
		t.Fatalf("key A: %v, want 3×200 17×429", got)
	}
	if got := c.Send(3, withKey("B")); fmt.Sprint(got) != "[200 200 200]" {
		t.Fatalf("key B after A's 17 denials: %v, want [200 200 200]: denied requests consumed the global zone", got)
	}
	// The global zone is live: its 6 are now spent (3 by A, 3 by B).
	res := c.Do(withKey("C"))
	if res.Status != 429 || !strings.Contains(res.Header.Get("RateLimit"), `"global";r=0`) {
		t.Fatalf("key C: status %d RateLimit %q, want 429 from the spent global zone", res.Status, res.Header.Get("RateLimit"))
	}
}

func TestZoneMatchCountsOnlyMatchingRequests(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone login {
			match {
				path /login
			}
			key {client_ip}
			events 3
			window 1h
		}
	}
	respond "ok"
}
`)
	for i := 0; i < 10; i++ {
		res := c.Do(request{Path: "/other"})
		if res.Status != 200 {
			t.Fatalf("/other request %d: status %d, want 200", i+1, res.Status)
		}
		if v := res.Header.Get("RateLimit"); v != "" {
			t.Fatalf("/other request %d: RateLimit = %q, want none (no zone applied)", i+1, v)
		}
	}
	if got := c.Send(5, request{Path: "/login"}); fmt.Sprint(got) != "[200 200 200 429 429]" {
		t.Fatalf("/login statuses = %v, want [200 200 200 429 429]", got)
	}
	if res := c.Do(request{Path: "/other"}); res.Status != 200 {
		t.Fatalf("/other after /login is spent: status %d, want 200", res.Status)
	}
}

func TestDryRunNeverDeniesButReportsExhaustion(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"handler", "zone"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			handlerOpt, zoneOpt := "dry_run", ""
			if where == "zone" {
				handlerOpt, zoneOpt = "", "dry_run"
			}
			c := startCaddy(t, fmt.Sprintf(`http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 2
			window 1h
			%s
		}
		%s
	}
	respond "ok"
}
`, zoneOpt, handlerOpt))
			for i := 1; i <= 6; i++ {
				res := c.Do(withKey("alice"))
				if res.Status != 200 {
					t.Fatalf("request %d: status %d, want 200 in dry run", i, res.Status)
				}
				m := ietfState.FindStringSubmatch(res.Header.Get("RateLimit"))
				if m == nil {
					t.Fatalf("request %d: RateLimit = %q", i, res.Header.Get("RateLimit"))
				}
				if want := strconv.Itoa(max(2-i, 0)); m[1] != want {
					t.Fatalf("request %d: r=%s, want %s", i, m[1], want)
				}
			}
		})
	}
}

func TestStatusAndHandleErrorsShapeTheDenial(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 1
			window 1h
		}
		status 503
	}
	respond "ok"
	handle_errors 503 {
		respond "{http.rate_limit.exceeded.key} limited by {http.rate_limit.exceeded.name}, retry in {http.response.header.Retry-After}s" 503
	}
}
`)
	if res := c.Do(withKey("alice")); res.Status != 200 {
		t.Fatalf("first request: %d, want 200", res.Status)
	}
	res := c.Do(withKey("alice"))
	if res.Status != 503 {
		t.Fatalf("second request: status %d, want 503 (status 503)", res.Status)
	}
	want := "alice limited by api, retry in " + res.Header.Get("Retry-After") + "s"
	if res.Header.Get("Retry-After") != "3600" || res.Body != want {
		t.Fatalf("denial: Retry-After %q body %q, want 3600 and %q", res.Header.Get("Retry-After"), res.Body, want)
	}
}

// Without handle_errors routes the denial is written directly: with the
// configured status all the same.
func TestStatusIsUsedWithoutHandleErrors(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, apiKeySite(1, "1h", "status 503"))
	if got := c.Send(2, withKey("alice")); got[0] != 200 || got[1] != 503 {
		t.Fatalf("alice: %v, want 200 then 503 (status 503, no handle_errors)", got)
	}
}

// max_keys reaches the zone's state through Caddy: 300 keys in a zone of at
// most 100 leave exactly 100 (the window is long, so none has expired).
func TestMaxKeysBoundsTheZonesKeysThroughCaddy(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, strings.Replace(apiKeySite(5, "1h", ""), "window 1h", "window 1h\n\t\t\tmax_keys 100", 1))
	for i := range 300 {
		if res := c.Do(withKey("k" + strconv.Itoa(i))); res.Status != 200 {
			t.Fatalf("key %d: %d, want 200", i, res.Status)
		}
	}
	var zones []adminZone
	c.adminJSON("/rate_limit/zones", &zones)
	if len(zones) != 1 || zones[0].LocalKeys != 100 {
		t.Fatalf("after 300 keys, zone api holds %+v, want exactly max_keys = 100", zones)
	}
}

func TestStateSurvivesAReloadWithTheSameZone(t *testing.T) {
	t.Parallel()
	site := func(body string) string {
		return `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 2
			window 1h
		}
	}
	respond "` + body + `"
}
`
	}
	c := startCaddy(t, site("v1"))
	if got := c.Send(3, withKey("alice")); fmt.Sprint(got) != "[200 200 429]" {
		t.Fatalf("before reload: %v, want [200 200 429]", got)
	}
	load(t, c, "", site("v2"))
	// The new config serves: bob gets the new body.
	waitFor(t, 5*time.Second, "the reloaded config to serve v2", func() bool {
		return c.Do(withKey("bob")).Body == "v2"
	})
	if res := c.Do(withKey("alice")); res.Status != 429 {
		t.Fatalf("alice after reload: %d %q, want 429: the reload lost the zone's state", res.Status, res.Body)
	}
}

func TestSameZoneWithDifferentLimitsIsRefused(t *testing.T) {
	t.Parallel()
	sites := `http:// {
	route /a {
		rate_limit {
			zone shared {
				key {client_ip}
				events 10
				window 1m
			}
		}
	}
	route /b {
		rate_limit {
			zone shared {
				key {client_ip}
				events 20
				window 1m
			}
		}
	}
	respond "ok"
}
`
	t.Run("caddy run", func(t *testing.T) {
		c := newCaddyInstance(t)
		err := c.startProcess(c.Caddyfile("", sites), "caddyfile")
		if err == nil {
			t.Fatal("caddy run accepted one zone name with two different limits")
		}
		if !strings.Contains(err.Error(), "zone shared is defined twice with different limits") {
			t.Fatalf("caddy run error does not name the conflict: %v", err)
		}
	})
	t.Run("POST /load", func(t *testing.T) {
		c := startCaddy(t, apiKeySite(1, "1h", ""))
		status, body := c.loadCaddyfile(c.Caddyfile("", sites))
		if status == http.StatusOK || !strings.Contains(body, "zone shared is defined twice with different limits") {
			t.Fatalf("POST /load: %d %s, want an error naming the conflict", status, body)
		}
		if res := c.Do(withKey("x")); res.Status != 200 || res.Body != "ok" {
			t.Fatalf("after a refused load: %d %q, want the old config serving", res.Status, res.Body)
		}
	})
	t.Run("same limits share", func(t *testing.T) {
		c := startCaddy(t, strings.ReplaceAll(sites, "events 20", "events 10"))
		// One zone, one state: 10 requests in all across /a and /b.
		var got statusCounts = statusCounts{}
		for i := 0; i < 6; i++ {
			got[c.Do(request{Path: "/a"}).Status]++
			got[c.Do(request{Path: "/b"}).Status]++
		}
		if got[200] != 10 || got[429] != 2 {
			t.Fatalf("12 requests over /a and /b sharing zone shared (10/min): %v, want 10×200 2×429", got)
		}
	})
}

func TestBadCaddyfileIsRejectedWithLineAndFix(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		handler string // the rate_limit block's body
		badLine string // a substring of the line the error must name
		want    string // a substring of the message
	}{
		{"unknown subdirective", "zone z {\n key {client_ip}\n events 1\n window 1m\n evnts 5\n}", "evnts",
			`zone z: unknown subdirective "evnts": expected key, events, window`},
		{"unknown handler subdirective", "zone z {\n key {client_ip}\n events 1\n window 1m\n}\nheader both", "header both",
			`unknown subdirective "header"`},
		{"repeated subdirective", "zone z {\n key {client_ip}\n events 1\n window 1m\n events 2\n}", "events 2",
			"zone z: events is given twice: keep one"},
		{"bad number", "zone z {\n key {client_ip}\n events ten\n window 1m\n}", "events ten",
			`zone z: events must be a whole number from 1 to`},
		{"bad duration", "zone z {\n key {client_ip}\n events 1\n window soon\n}", "window soon",
			`zone z: window must be a positive duration such as 500ms, 10s, 1m or 1h, not "soon"`},
		{"missing events", "zone z {\n key {client_ip}\n window 1m\n}", "",
			"zone z: events is missing: add e.g. events 100"},
		{"missing window", "zone z {\n key {client_ip}\n events 1\n}", "",
			"zone z: window is missing: add e.g. window 1m"},
		{"invalid zone name", "zone my.zone {\n key {client_ip}\n events 1\n window 1m\n}", "zone my.zone",
			`zone name "my.zone" is invalid: use letters, digits, '_' and '-' only`},
		{"bad fail policy", "zone z {\n key {client_ip}\n events 1\n window 1m\n fail_policy maybe\n}", "fail_policy maybe",
			"zone z: fail_policy must be one of open, closed, local"},
		{"limit that overflows", "zone z {\n key {client_ip}\n events 1\n window 8760h\n burst 1000\n}", "burst 1000",
			"zone z: burst 1000 at one request per 8760h0m0s takes longer to refill than the 100 years tally can represent: use a smaller burst"},
		{"finer than the clock", "zone z {\n key {client_ip}\n events 1\n window 1ns\n}", "window 1ns",
			"zone z: 1 events per 1ns is more than one per microsecond, finer than tally can enforce"},
		{"jitter NaN", "zone z {\n key {client_ip}\n events 1\n window 1m\n}\njitter NaN", "jitter NaN",
			`jitter must be a fraction between 0 and 1 (e.g. jitter 0.2), not "NaN"`},
		{"redis port out of range", "zone z {\n key {client_ip}\n events 1\n window 1m\n}\ndistributed {\n redis redis://127.0.0.1:70000\n}", "redis redis://",
			`distributed: redis: address redis://127.0.0.1:70000: port "70000" must be a number from 1 to 65535`},
		{"sync_interval in strict mode", "zone z {\n key {client_ip}\n events 1\n window 1m\n}\ndistributed {\n redis 127.0.0.1:6379\n sync_interval 1s\n}", "sync_interval 1s",
			"distributed: sync_interval only applies to mode async"},
		{"cost over the default burst", "zone z {\n key {client_ip}\n events 5\n window 1m\n cost 10\n}", "cost 10",
			"zone z: cost 10 is more than the burst (5): such requests could never pass; lower cost or raise burst"},
		{"cost over the burst", "zone z {\n key {client_ip}\n events 10\n window 1m\n burst 3\n cost {http.request.header.X-Cost} 4\n}", "cost {http",
			"zone z: cost 4 is more than the burst (3)"},
		{"charge in a concurrency zone", "zone z {\n key {client_ip}\n concurrency 4\n charge {http.response.header.X-Tokens}\n}", "charge {http",
			"zone z: charge does not apply to a concurrency zone, which counts requests in flight, not their cost: remove charge"},
		{"cost in a concurrency zone", "zone z {\n key {client_ip}\n cost 2\n concurrency 4\n}", "cost 2",
			"zone z: cost does not apply to a concurrency zone"},
	}
	c := startCaddy(t, apiKeySite(1, "1h", ""))
	t.Run("cases", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				caddyfile := c.Caddyfile("", "http:// {\n\trate_limit {\n"+tc.handler+"\n\t}\n\trespond \"ok\"\n}\n")
				var line int
				if tc.badLine != "" {
					line = lineOf(t, caddyfile, tc.badLine)
				}
				wantAt := fmt.Sprintf("Caddyfile:%d", line)

				_, stderr, err := adapt(t, caddyfile)
				stderr = unescapeJSON(stderr)
				if err == nil {
					t.Fatalf("caddy adapt accepted:\n%s", caddyfile)
				}
				if !strings.Contains(stderr, tc.want) {
					t.Errorf("caddy adapt error does not say %q:\n%s", tc.want, stderr)
				}
				if line > 0 && !strings.Contains(stderr, wantAt) {
					t.Errorf("caddy adapt error does not name %s:\n%s", wantAt, stderr)
				} else if line == 0 && !regexp.MustCompile(`Caddyfile:\d+`).MatchString(stderr) {
					t.Errorf("caddy adapt error names no line:\n%s", stderr)
				}
				if out, err := validate(t, caddyfile); err == nil {
					t.Errorf("caddy validate accepted:\n%s", caddyfile)
				} else if out = unescapeJSON(out); !strings.Contains(out, tc.want) || !regexp.MustCompile(`Caddyfile:\d+`).MatchString(out) {
					t.Errorf("caddy validate error does not say %q with a line:\n%s", tc.want, out)
				}

				status, body := c.loadCaddyfile(caddyfile)
				body = unescapeJSON(body)
				if status == http.StatusOK {
					t.Fatalf("POST /load accepted:\n%s", caddyfile)
				}
				if !strings.Contains(body, tc.want) || !regexp.MustCompile(`:\d+`).MatchString(body) {
					t.Errorf("POST /load: %d %s, want %q and a line number", status, body, tc.want)
				}
				if line > 0 && !strings.Contains(body, fmt.Sprintf(":%d", line)) {
					t.Errorf("POST /load error does not name line %d: %s", line, body)
				}
			})
		}
	})
	// The refused loads left the running config alone.
	if res := c.Do(withKey("x")); res.Status != 200 || res.Body != "ok" {
		t.Errorf("after refused loads: %d %q, want 200 ok", res.Status, res.Body)
	}
}

// validate runs `caddy validate` on caddyfile: what adapt checks, then
// every module's provisioning. It returns the combined output.
func validate(t *testing.T, caddyfile string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBinary(t), "validate", "--config", file, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("caddy validate did not finish in 30s: %s", out)
	}
	return string(out), err
}

func TestSeveralZonesEachGetAListMember(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone per_key {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}
		zone global {
			key everyone
			events 100
			window 1h
		}
	}
	respond "ok"
}
`)
	res := c.Do(withKey("alice"))
	// Tightest (lowest rate) first: global, 100 per hour, then per_key.
	if got, want := res.Header.Get("RateLimit-Policy"), `"global";q=100;w=3600, "per_key";q=3;w=60`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got, want := res.Header.Get("RateLimit"), `"global";r=99;t=36, "per_key";r=2;t=20`; got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	// The legacy trio reports the most restrictive zone: per_key.
	if l, r := res.Header.Get("RateLimit-Limit"), res.Header.Get("RateLimit-Remaining"); l != "3" || r != "2" {
		t.Errorf("RateLimit-Limit %q Remaining %q, want per_key's 3 and 2", l, r)
	}
}

func TestTwoHandlersOnOneRouteBothReportTheirZones(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit /api/* {
		zone per_key {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}
	}
	rate_limit {
		zone per_ip {
			key {client_ip}
			events 100
			window 1s
		}
	}
	respond "ok"
}
`)
	res := c.Do(request{Path: "/api/x", Header: map[string]string{"X-API-Key": "alice"}})
	if got, want := res.Header.Get("RateLimit"), `"per_key";r=2;t=20, "per_ip";r=99;t=1`; got != want {
		t.Errorf("RateLimit = %q, want both handlers' members %q", got, want)
	}
	if got, want := res.Header.Get("RateLimit-Policy"), `"per_key";q=3;w=60, "per_ip";q=100;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if l, r := res.Header.Get("RateLimit-Limit"), res.Header.Get("RateLimit-Remaining"); l != "3" || r != "2" {
		t.Errorf("RateLimit-Limit %q Remaining %q, want the most restrictive zone's (per_key: 3, 2)", l, r)
	}
}

func TestDeniedRequestReportsRefundedZonesAsUnspent(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone per_key {
			key {http.request.header.X-API-Key}
			events 1
			window 1m
		}
		zone global {
			key everyone
			events 10
			window 1h
		}
	}
	respond "ok"
}
`)
	start := time.Now()
	c.Do(withKey("alice")) // global: 9 left
	// Denied by per_key after global allowed it; global is refunded, so the
	// client must be told it still has 9, not 8.
	res := c.Do(withKey("alice"))
	if res.Status != 429 {
		t.Fatalf("second request: %d, want 429", res.Status)
	}
	// global still has quota, so it gives no t, which would only push
	// Retry-After later than the request could succeed; per_key's t is
	// Retry-After itself.
	if got, want := res.Header.Get("RateLimit"), `"global";r=9, "per_key";r=0;t=`+res.Header.Get("Retry-After"); got != want {
		t.Errorf("RateLimit on a denied request = %q, want %q: global refunded to r=9, per_key's t equal to Retry-After", got, want)
	}
	if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra > 60 || ra < 60-int(time.Since(start)/time.Second) {
		t.Errorf("Retry-After = %q, want 60 (one per minute, rounded up)", res.Header.Get("Retry-After"))
	}
	if next := c.Do(withKey("bob")); !strings.HasPrefix(next.Header.Get("RateLimit"), `"global";r=8;`) {
		t.Errorf("next allowed request: RateLimit = %q, want global r=8", next.Header.Get("RateLimit"))
	}
}

func TestLongKeysAreHashedButStayDistinct(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, apiKeySite(2, "1h", ""))
	prefix := strings.Repeat("k", 300)
	for _, key := range []string{prefix + "-a", prefix + "-b"} {
		if got := c.Send(3, withKey(key)); fmt.Sprint(got) != "[200 200 429]" {
			t.Errorf("a %d-byte key: %v, want [200 200 429] on its own limit", len(key), got)
		}
		// Stored under the SHA-256 of the whole key, not the raw key.
		sum := sha256.Sum256([]byte(key))
		var k adminKey
		c.adminJSON(keyPath("api", "sha256:"+hex.EncodeToString(sum[:])), &k)
		if k.Remaining != 0 {
			t.Errorf("the hashed key of a %d-byte key: %+v, want spent", len(key), k)
		}
		// The admin API reads the key given as the zone stores it.
		var raw adminKey
		c.adminJSON(keyPath("api", key), &raw)
		if want := "sha256:" + hex.EncodeToString(sum[:]); raw.StoredAs != want || raw.Remaining != 0 {
			t.Errorf("GET of the raw %d-byte key: %+v, want it read as stored, %s, spent", len(key), raw, want)
		}
	}
	// A short key spelled like a hash has its own bucket.
	sum := sha256.Sum256([]byte(prefix + "-a"))
	if got := c.Send(1, withKey("sha256:"+hex.EncodeToString(sum[:]))); got[0] != 200 {
		t.Errorf("the literal key sha256:<hex of a spent long key>: %v, want 200 (its own bucket)", got)
	}
}
