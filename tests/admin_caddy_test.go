package tests

// The admin API admin.api.rate_limit, under /rate_limit/ on Caddy's admin
// address.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

const adminSite = `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1h
		}
		zone login {
			match {
				path /login
			}
			key {client_ip}
			events 5
			window 1m
			burst 2
			fail_policy closed
			dry_run
		}
	}
	respond "ok"
}
`

func TestAdminListsZonesWithTheirLimits(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	var zones []adminZone
	c.adminJSON("/rate_limit/zones", &zones)
	if len(zones) != 2 {
		t.Fatalf("GET /rate_limit/zones: %+v, want zones api and login", zones)
	}
	api, login := zones[0], zones[1]
	if api.Name != "api" || api.Events != 3 || api.Window != "1h" || api.WindowSeconds != 3600 || api.Burst != 3 ||
		api.Mode != "local" || api.FailPolicy != "local" || api.DryRun || api.Store != nil {
		t.Errorf("zone api listed as %+v", api)
	}
	if login.Name != "login" || login.Events != 5 || login.Window != "1m" || login.WindowSeconds != 60 || login.Burst != 2 ||
		login.Mode != "local" || login.FailPolicy != "closed" || !login.DryRun {
		t.Errorf("zone login listed as %+v", login)
	}

	c.Send(2, withKey("alice"))
	c.adminJSON("/rate_limit/zones", &zones)
	if zones[0].LocalKeys != 1 {
		t.Errorf("after one key was used, zone api has local_keys %d, want 1", zones[0].LocalKeys)
	}
}

func TestAdminShowsAUsedKey(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	// A key with a space and a slash, path-escaped in the URL.
	key := "team a/1"
	c.Send(2, withKey(key))

	var k adminKey
	c.adminJSON(keyPath("api", key), &k)
	// 2 of 3 used, at one per 20 minutes: one left, full again in 40m.
	if k.Zone != "api" || k.Key != key || k.Remaining != 1 || k.RetryAfter != 0 || k.Source != "local" ||
		k.ResetAfter < 2390 || k.ResetAfter > 2400 {
		t.Fatalf("GET %s: %+v, want remaining 1, retry_after 0, reset_after about 2400", keyPath("api", key), k)
	}

	c.Send(2, withKey(key)) // the third is allowed, the fourth denied
	c.adminJSON(keyPath("api", key), &k)
	if k.Remaining != 0 || k.RetryAfter < 1190 || k.RetryAfter > 1200 || k.ResetAfter < 3590 || k.ResetAfter > 3600 {
		t.Fatalf("exhausted key: %+v, want remaining 0, retry_after about 1200, reset_after about 3600", k)
	}
}

func TestAdminAnswersUnknownZoneAndUnusedKeyWith404(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	for _, path := range []string{keyPath("nope", "alice"), keyPath("api", "never-seen"), "/rate_limit/nothing"} {
		for _, method := range []string{http.MethodGet, http.MethodDelete} {
			status, body := c.adminDo(method, path)
			var e struct {
				Error string `json:"error"`
			}
			if status != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s: %d %s, want 404 with a JSON error", method, path, status, body)
			}
		}
	}
}

func TestAdminDeleteResetsABlockedKey(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	if got := c.Send(4, withKey("alice")); got[3] != 429 {
		t.Fatalf("alice: %v, want the fourth denied", got)
	}
	c.Send(1, withKey("bob"))

	status, body := c.adminDo(http.MethodDelete, keyPath("api", "alice"))
	if status != http.StatusNoContent {
		t.Fatalf("DELETE %s: %d %s, want 204", keyPath("api", "alice"), status, body)
	}
	if got := c.Send(4, withKey("alice")); len(got) != 4 || got[0] != 200 || got[2] != 200 || got[3] != 429 {
		t.Fatalf("alice after DELETE: %v, want a full limit again: 3×200 then 429", got)
	}
	// Other keys keep their state.
	if got := c.Send(3, withKey("bob")); got[2] != 429 {
		t.Fatalf("bob after alice's reset: %v, want 2 more allowed, then 429", got)
	}
}

func TestAdminRejectsOtherMethods(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	c.Send(1, withKey("alice"))
	cases := []struct{ method, path, allow string }{
		{http.MethodPost, keyPath("api", "alice"), "GET, DELETE"},
		{http.MethodPut, keyPath("api", "alice"), "GET, DELETE"},
		{http.MethodDelete, "/rate_limit/zones", "GET"},
		{http.MethodPost, "/rate_limit/zones", "GET"},
	}
	for _, tc := range cases {
		req, err := http.NewRequest(tc.method, c.AdminURL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.EqualFold(resp.Header.Get("Allow"), tc.allow) {
			t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
		}
	}
	// A refused method changed nothing.
	var k adminKey
	c.adminJSON(keyPath("api", "alice"), &k)
	if k.Remaining != 2 {
		t.Errorf("alice after refused requests: remaining %d, want 2", k.Remaining)
	}
}

// loadJSON POSTs a JSON config to /load and returns the status and body.
func (c *caddyInstance) loadJSON(config string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.AdminURL+"/load", strings.NewReader(config))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return c.admin(req)
}

// zoneNames lists the zones GET /rate_limit/zones shows.
func (c *caddyInstance) zoneNames() []string {
	c.t.Helper()
	var zones []adminZone
	c.adminJSON("/rate_limit/zones", &zones)
	names := make([]string, len(zones))
	for i, z := range zones {
		names[i] = z.Name
	}
	return names
}

func TestAdminAndMetricsShowTheRunningZonesThroughFailedLoads(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", adminSite)
	c.Send(2, withKey("alice"))
	_, running := c.adminDo(http.MethodGet, "/config/")
	if !strings.Contains(running, `"handler":"rate_limit"`) || !strings.Contains(running, `"handler":"static_response"`) {
		t.Fatalf("GET /config/ has no rate_limit or static_response handler: %s", running)
	}

	// Each of these is refused at a different point: Validate of the
	// rate_limit handler, provisioning of a later handler, and provisioning
	// half-way through a rate_limit handler (the second definition of api).
	redefined := strings.Replace(adminSite, "rate_limit {", `rate_limit {
		zone extra {
			key {client_ip}
			events 1
			window 1s
		}`, 1) + `
http://localhost {
	rate_limit {
		zone api {
			key {client_ip}
			events 7
			window 1m
		}
	}
}
`
	failed := []struct {
		what string
		load func() (int, string)
	}{
		{"jitter 2", func() (int, string) {
			return c.loadJSON(strings.Replace(running, `"handler":"rate_limit",`, `"handler":"rate_limit","jitter":2,`, 1))
		}},
		{"a typo in another handler", func() (int, string) {
			return c.loadJSON(strings.Replace(running, `"handler":"static_response"`, `"handler":"static_respons"`, 1))
		}},
		{"zone api redefined with other limits", func() (int, string) {
			return c.loadCaddyfile(c.Caddyfile("metrics", redefined))
		}},
	}
	for _, f := range failed {
		if status, body := f.load(); status != http.StatusBadRequest {
			t.Fatalf("loading a config with %s: %d %s, want 400", f.what, status, body)
		}
		if got := strings.Join(c.zoneNames(), ","); got != "api,login" {
			t.Errorf("after a refused load (%s), GET /rate_limit/zones lists [%s], want the running api,login", f.what, got)
		}
		var k adminKey
		if status, body := c.adminDo(http.MethodGet, keyPath("api", "alice")); status != http.StatusOK ||
			json.Unmarshal([]byte(body), &k) != nil || k.Remaining != 1 {
			t.Errorf("after a refused load (%s), GET %s: %d %s, want alice with 1 remaining", f.what, keyPath("api", "alice"), status, body)
		}
		if v, ok := metricValue(c.scrape(), "caddy_rate_limit_keys", map[string]string{"zone": "api"}); !ok || v != 1 {
			t.Errorf("after a refused load (%s), caddy_rate_limit_keys{zone=\"api\"} = %v (present %v), want 1", f.what, v, ok)
		}
	}
	// The running config still limits: alice has one request left.
	if got := c.Send(2, withKey("alice")); got[0] != 200 || got[1] != 429 {
		t.Fatalf("alice after the refused loads: %v, want 200 then 429", got)
	}

	// A reload that drops login and adds other: the lists follow, and
	// login's series go with it.
	c.Send(1, request{Path: "/login", Header: map[string]string{"X-API-Key": "bob"}})
	if _, ok := metricValue(c.scrape(), "caddy_rate_limit_requests_total", map[string]string{"zone": "login"}); !ok {
		t.Fatal("no caddy_rate_limit_requests_total series for zone login before the reload")
	}
	load(t, c, "metrics", `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1h
		}
		zone other {
			key {client_ip}
			events 9
			window 1m
		}
	}
	respond "reloaded"
}
`)
	if got := strings.Join(c.zoneNames(), ","); got != "api,other" {
		t.Errorf("after a reload to api and other, GET /rate_limit/zones lists [%s]", got)
	}
	for _, s := range c.scrape() {
		if strings.HasPrefix(s.name, "caddy_rate_limit_") && s.labels["zone"] == "login" {
			t.Errorf("series of the removed zone login left behind: %s%v", s.name, s.labels)
		}
	}
	if got := c.Send(1, withKey("alice")); got[0] != 429 {
		t.Errorf("alice after a reload that kept api unchanged: %v, want still denied", got)
	}
}

// Keys a URL path cannot hold as they are have an address too: the empty key
// (requests without the key's header share it), "." and "..". The JSON is
// plain (no HTML escaping), and the 404 for an unused key, which Caddy logs
// at ERROR, does not log the key.
func TestAdminAddressesEveryKey(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	c.Send(2, request{})             // no X-API-Key: the empty key
	c.Send(1, withKey("."))          // keys a path cleaner would eat
	c.Send(1, withKey("<b>&co</b>")) // HTML in a key
	for key, remaining := range map[string]int64{"": 1, ".": 2, "<b>&co</b>": 2} {
		path := "/rate_limit/zones/api/keys?key=" + url.QueryEscape(key)
		status, body := c.adminDo(http.MethodGet, path)
		var k adminKey
		if status != http.StatusOK || json.Unmarshal([]byte(body), &k) != nil || k.Key != key || k.Remaining != remaining {
			t.Errorf("GET %s: %d %s, want key %q with %d remaining", path, status, body, key, remaining)
		}
		if strings.Contains(body, `\u003c`) || strings.Contains(body, `\u0026`) {
			t.Errorf("GET %s: HTML-escaped JSON %s", path, body)
		}
	}
	// The empty key is reset through its address, and only it.
	if status, body := c.adminDo(http.MethodDelete, "/rate_limit/zones/api/keys?key="); status != http.StatusNoContent {
		t.Fatalf("DELETE the empty key: %d %s, want 204", status, body)
	}
	if status, _ := c.adminDo(http.MethodGet, "/rate_limit/zones/api/keys?key="); status != http.StatusNotFound {
		t.Errorf("the empty key after its reset: %d, want 404 (full again)", status)
	}
	if status, _ := c.adminDo(http.MethodGet, "/rate_limit/zones/api/keys?key=."); status != http.StatusOK {
		t.Errorf("key . after the empty key's reset: %d, want it untouched", status)
	}
	// The path form still works for ordinary keys and %2E.
	if status, body := c.adminDo(http.MethodGet, "/rate_limit/zones/api/keys/%2E"); status != http.StatusOK {
		t.Errorf("GET .../keys/%%2E: %d %s", status, body)
	}

	const secret = "never-seen-sk-8d1e"
	if status, _ := c.adminDo(http.MethodGet, keyPath("api", secret)); status != http.StatusNotFound {
		t.Fatalf("unused key: %d, want 404", status)
	}
	waitFor(t, 5*time.Second, "Caddy to log the admin error", func() bool {
		return strings.Contains(c.Output(), "key not tracked")
	})
	for _, line := range strings.Split(c.Output(), "\n") {
		if strings.Contains(line, `"level":"error"`) && strings.Contains(line, secret) {
			t.Errorf("the key appears in an error log line: %s", line)
		}
	}
}

// The admin API reads and resets keys where every instance keeps them: in
// Redis, in strict and async mode. A DELETE that cannot reach Redis says what
// it reset (this instance's state) and what it did not (Redis's).
func TestAdminReadsAndResetsKeysInRedis(t *testing.T) {
	for _, mode := range []string{"strict", "async"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			r := startRedis(t)
			c := startCaddy(t, `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1h
		}
		distributed {
			redis redis://`+r.Addr+`
			mode `+mode+`
			timeout 500ms
		}
	}
	respond "ok"
}
`)
			rc := r.Client()
			ctx := context.Background()
			rkey := "tally:api:alice" // the key schema of docs/distributed.md
			if mode == "async" {
				rkey = "tally:api.async:alice"
			}
			if got := c.Send(4, withKey("alice")); got[2] != 200 || got[3] != 429 {
				t.Fatalf("alice: %v, want 3×200 then 429", got)
			}
			// Async mode reports to Redis at its next sync; its read
			// answers from this instance's lease, Redis's view beside it.
			var k adminKey
			waitFor(t, 5*time.Second, "alice's state in Redis", func() bool {
				n, _ := rc.Exists(ctx, rkey).Result()
				status, body := c.adminDo(http.MethodGet, keyPath("api", "alice"))
				return n == 1 && status == http.StatusOK && json.Unmarshal([]byte(body), &k) == nil && k.Remaining == 0
			})
			wantSource := "redis"
			if mode == "async" {
				wantSource = "instance"
			}
			if k.Source != wantSource || k.RetryAfter <= 0 || k.RetryAfter > 1200 {
				t.Errorf("GET alice: %+v, want source %s, remaining 0, retry_after within 1200s", k, wantSource)
			}
			// The key's TTL in Redis is its reset time (rounded up to a
			// millisecond), not just any positive TTL.
			before := time.Now()
			pttl, err := rc.PTTL(ctx, rkey).Result()
			if err != nil {
				t.Fatal(err)
			}
			_, body := c.adminDo(http.MethodGet, keyPath("api", "alice"))
			if err := json.Unmarshal([]byte(body), &k); err != nil {
				t.Fatal(err)
			}
			if mode == "async" {
				var f struct {
					Fleet adminKey `json:"fleet"`
				}
				if err := json.Unmarshal([]byte(body), &f); err != nil {
					t.Fatal(err)
				}
				k.ResetAfter = f.Fleet.ResetAfter // Redis's view, whose TTL this is
			}
			elapsed := time.Since(before)
			reset := time.Duration(k.ResetAfter * float64(time.Second))
			// A strict key whose denial is cached is read from the deny
			// cache, which timed the denial from the request's start: it
			// may run ahead of Redis by that decision's latency, within
			// the store's timeout (50 ms), never behind.
			const cacheLead = 50 * time.Millisecond
			if pttl < reset-time.Millisecond || pttl > reset+elapsed+time.Millisecond+cacheLead {
				t.Errorf("PTTL of %s = %v, want alice's reset_after %v (+%v between the reads, ±1ms, up to %v ahead from the deny cache)", rkey, pttl, reset, elapsed, cacheLead)
			}

			if status, body := c.adminDo(http.MethodDelete, keyPath("api", "alice")); status != http.StatusNoContent {
				t.Fatalf("DELETE alice: %d %s, want 204", status, body)
			}
			if n, err := rc.Exists(ctx, rkey).Result(); err != nil || n != 0 {
				t.Fatalf("after DELETE, %s exists (%d, %v): Redis was not reset", rkey, n, err)
			}
			if got := c.Send(4, withKey("alice")); got[0] != 200 || got[2] != 200 || got[3] != 429 {
				t.Fatalf("alice after DELETE: %v, want a full limit again", got)
			}

			// Redis frozen: this instance's state is reset, Redis's is not,
			// and the answer says exactly that.
			waitFor(t, 5*time.Second, "alice's new state in Redis", func() bool {
				n, _ := rc.Exists(ctx, rkey).Result()
				return n == 1
			})
			r.Pause()
			defer r.Resume()
			status, body := c.adminDo(http.MethodDelete, keyPath("api", "alice"))
			var partial struct {
				Error       string   `json:"error"`
				Reset       []string `json:"reset"`
				Unconfirmed []string `json:"unconfirmed"`
			}
			if status != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &partial) != nil ||
				strings.Join(partial.Reset, ",") != "local" || strings.Join(partial.Unconfirmed, ",") != "redis" ||
				!strings.Contains(partial.Error, "Redis did not confirm its reset") {
				t.Errorf("DELETE while Redis is frozen: %d %s, want 503 saying local was reset and redis is unconfirmed", status, body)
			}
			// Once Redis answers, the DELETE can be repeated (the frozen one
			// may or may not have run meanwhile: a command that timed out
			// can still be executed) and leaves no key behind.
			r.Resume()
			waitFor(t, 10*time.Second, "a DELETE to succeed once Redis answers", func() bool {
				status, _ := c.adminDo(http.MethodDelete, keyPath("api", "alice"))
				return status == http.StatusNoContent || status == http.StatusNotFound
			})
			if n, err := rc.Exists(ctx, rkey).Result(); err != nil || n != 0 {
				t.Errorf("after a DELETE once Redis answers, %s exists = %d (%v)", rkey, n, err)
			}
		})
	}
}

// docs/operations.md says a DELETE lets the key through on every instance at once.
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

// The admin API's errors are plain JSON, as its answers are: a zone or key
// with <, > or & reads as written, not \u003c (docs/operations.md), and so
// does `caddy rate-limit --json`.
func TestAdminErrorsAndCLIJSONAreNotHTMLEscaped(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	status, body := c.adminDo(http.MethodGet, "/rate_limit/zones/"+url.PathEscape("<z>&")+"/keys/alice")
	if status != http.StatusNotFound || !strings.Contains(body, `unknown zone \"<z>&\"`) || strings.Contains(body, `\u00`) {
		t.Errorf("GET of zone <z>&: %d %s, want a 404 naming \"<z>&\" as written", status, body)
	}
	out := rateLimitCLI(t, c, "key", "api", "<b>&", "--json")
	if !strings.Contains(out.stdout, `"key": "<b>&"`) || strings.Contains(out.stdout, `\u00`) {
		t.Errorf("caddy rate-limit key api '<b>&' --json: exit %d, stdout %q, stderr %q; want the key as written", out.code, out.stdout, out.stderr)
	}
}

// GET /rate_limit/zones gives each zone the fields its kind has: a
// concurrency or quota zone no events, window or burst (not 0 and "0s"), a
// connection zone no fail_policy; `caddy rate-limit zones` shows "-" as
// the connection zone's fail policy.
func TestAdminListsOnlyTheFieldsOfEachZonesKind(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, `	servers {
		listener_wrappers {
			rate_limit {
				zone conns {
					key {remote_ip}
					events 50
					window 10s
				}
			}
			tls
		}
	}`, `http:// {
	rate_limit {
		zone rate {
			key {http.request.header.X-API-Key}
			events 3
			window 1h
		}
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 2
		}
		zone monthly {
			key {http.request.header.X-API-Key}
			quota 100 per month
		}
	}
	respond "ok"
}
`)
	_, body := c.adminDo(http.MethodGet, "/rate_limit/zones")
	var zones []map[string]any
	if err := json.Unmarshal([]byte(body), &zones); err != nil {
		t.Fatalf("GET /rate_limit/zones: %v in %s", err, body)
	}
	byName := map[string]map[string]any{}
	for _, z := range zones {
		byName[z["name"].(string)] = z
	}
	for _, tc := range []struct {
		zone          string
		want, without []string
	}{
		{"rate", []string{"events", "window", "window_seconds", "burst", "fail_policy"}, nil},
		{"uploads", []string{"concurrency", "fail_policy"}, []string{"events", "window", "window_seconds", "burst"}},
		{"monthly", []string{"quota", "fail_policy"}, []string{"events", "window", "window_seconds", "burst"}},
		{"conns", []string{"events", "window", "burst", "layer"}, []string{"fail_policy"}},
	} {
		z, ok := byName[tc.zone]
		if !ok {
			t.Errorf("zone %s not listed in %s", tc.zone, body)
			continue
		}
		for _, f := range tc.want {
			if _, ok := z[f]; !ok {
				t.Errorf("zone %s has no %q: %v", tc.zone, f, z)
			}
		}
		for _, f := range tc.without {
			if v, ok := z[f]; ok {
				t.Errorf("zone %s has %q: %v, which means nothing for its kind", tc.zone, f, v)
			}
		}
	}
	lines := rateLimitCLI(t, c, "zones").ok(t, "zones")
	if got := strings.Join(row(lines, "conns"), " "); !strings.HasPrefix(got, "conns 50/10s connections 50 local - ") {
		t.Errorf("caddy rate-limit zones row %q, want the fail policy shown as -\n%s", got, strings.Join(lines, "\n"))
	}
}

// prefixAndLongKeySite keys zone net by the client's address masked to its
// /24, and zone long by the Authorization header, which a long token makes
// longer than the 256 bytes a zone stores as they are.
const prefixAndLongKeySite = `http:// {
	rate_limit {
		zone net {
			match {
				path /net
			}
			key {remote_host}
			events 2
			window 1h
			ipv4_prefix 24
		}
		zone long {
			match {
				path /long
			}
			key {http.request.header.Authorization}
			events 2
			window 1h
		}
	}
	respond "ok"
}
`

// A key is read and reset as a request carries it: the admin API and the
// CLI transform it as the zone does (masked to the prefix, hashed when
// long), and also take it as stored ("sha256:<hex>", as top shows it). A key
// with no state is "not tracked", and resetting it is an error.
func TestAdminReadsAndResetsKeysAsTheZoneStoresThem(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, prefixAndLongKeySite)

	if got := c.Send(3, request{Path: "/net"}); got[1] != 200 || got[2] != 429 {
		t.Fatalf("/net from 127.0.0.1: %v, want 2 allowed then 429", got)
	}
	var k struct {
		adminKey
		StoredAs string `json:"stored_as"`
	}
	c.adminJSON(keyPath("net", "127.0.0.1"), &k)
	if k.Key != "127.0.0.1" || k.StoredAs != "127.0.0.0/24" || k.Remaining != 0 || k.RetryAfter <= 0 {
		t.Errorf("GET net/127.0.0.1: %+v, want the limited 127.0.0.0/24", k)
	}
	if out := rateLimitCLI(t, c, "key", "net", "127.0.0.1").ok(t, "key net 127.0.0.1")[0]; !strings.HasPrefix(out, `zone net, key "127.0.0.1" (stored as "127.0.0.0/24"): LIMITED`) {
		t.Errorf("key net 127.0.0.1: %q", out)
	}
	rateLimitCLI(t, c, "reset", "net", "127.0.0.1").ok(t, "reset net 127.0.0.1")
	if got := c.Send(1, request{Path: "/net"}); got[0] != 200 {
		t.Errorf("/net after the reset of 127.0.0.1: %v, want 200", got)
	}

	long := "Bearer " + strings.Repeat("x", 403)
	auth := request{Path: "/long", Header: map[string]string{"Authorization": long}}
	if got := c.Send(3, auth); got[1] != 200 || got[2] != 429 {
		t.Fatalf("/long with a 410-byte key: %v, want 2 allowed then 429", got)
	}
	c.adminJSON("/rate_limit/zones/long/keys?key="+url.QueryEscape(long), &k)
	if !strings.HasPrefix(k.StoredAs, "sha256:") || k.Remaining != 0 || k.RetryAfter <= 0 {
		t.Fatalf("GET of the 410-byte key: stored_as %q, remaining %d, retry_after %v; want the limited sha256: key", k.StoredAs, k.Remaining, k.RetryAfter)
	}
	hashed := k.StoredAs
	var top adminTop
	c.adminJSON("/rate_limit/zones/long/top", &top)
	if len(top.Keys) != 1 || top.Keys[0].Key != hashed {
		t.Errorf("top of zone long: %+v, want the key as stored, %s", top.Keys, hashed)
	}
	// As top shows it: the stored key itself.
	c.adminJSON(keyPath("long", hashed), &k)
	if k.Remaining != 0 || k.RetryAfter <= 0 {
		t.Errorf("GET of %s: %+v, want the limited key", hashed, k)
	}
	if status, body := c.adminDo(http.MethodDelete, "/rate_limit/zones/long/keys?key="+url.QueryEscape(long)); status != http.StatusNoContent {
		t.Fatalf("DELETE of the 410-byte key: %d %s, want 204", status, body)
	}
	if got := c.Send(1, auth); got[0] != 200 {
		t.Errorf("/long after the reset of the 410-byte key: %v, want 200", got)
	}

	// Nothing tracked: a 404 that says so, and a reset that fails.
	status, body := c.adminDo(http.MethodGet, keyPath("net", "10.9.9.9"))
	if status != http.StatusNotFound || !strings.Contains(body, "key not tracked") || strings.Contains(body, "at its full limit") {
		t.Errorf("GET of a key never seen: %d %s, want 404 not tracked", status, body)
	}
	if r := rateLimitCLI(t, c, "reset", "net", "10.9.9.9"); r.code != 1 || !strings.Contains(r.stderr, "key not tracked, nothing to reset") || strings.Contains(r.stdout, "reset to its full limit") {
		t.Errorf("reset of a key never seen: exit %d, stdout %q, stderr %q; want exit 1, not tracked", r.code, r.stdout, r.stderr)
	}
}

// An async zone's key read (GET …/keys/<key>, `caddy rate-limit key`) says
// what the key's next request on this instance gets: the lease this
// instance decides from, not Redis's view, in which the lease counts as
// spent (one instance, example 13 of the docs: a client at r=96 was shown
// "LIMITED, 0 remaining"). Redis's view is given beside it, as the fleet's.
func TestAsyncKeyReadSaysWhatTheNextRequestGets(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	// A unit comes back every 36s: the read, the CLI and the next request
	// see the same state however long a loaded machine takes between them
	// (at 100 per minute, 0.6s between them was one unit back).
	c := startCaddy(t, `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 100
			window 1h
		}
		distributed {
			redis redis://`+r.Addr+`
			mode async
			sync_interval 100ms
			timeout 500ms
		}
		headers legacy
	}
	respond "ok"
}
`)
	var last response
	for range 4 {
		if last = c.Do(withKey("alice")); last.Status != http.StatusOK {
			t.Fatalf("alice: %d, want 200", last.Status)
		}
	}
	left, err := strconv.ParseInt(last.Header.Get("RateLimit-Remaining"), 10, 64)
	if err != nil {
		t.Fatalf("RateLimit-Remaining %q: %v", last.Header.Get("RateLimit-Remaining"), err)
	}
	// Once a sync has taken the key's lease, Redis counts the lease as
	// spent: the read must still answer from the lease.
	rc := r.Client()
	waitFor(t, 10*time.Second, "alice's lease in Redis", func() bool {
		n, _ := rc.Exists(context.Background(), "tally:api.async:alice").Result()
		return n == 1
	})
	var k struct {
		adminKey
		Fleet *struct {
			Remaining  int64   `json:"remaining"`
			RetryAfter float64 `json:"retry_after"`
		} `json:"fleet"`
	}
	status, body := c.adminDo(http.MethodGet, keyPath("api", "alice"))
	if status != http.StatusOK || json.Unmarshal([]byte(body), &k) != nil {
		t.Fatalf("GET alice: %d %s", status, body)
	}
	if k.Remaining != left || k.RetryAfter != 0 || k.Source != "instance" {
		t.Errorf("GET alice: %s\nwant remaining %d (the client's last RateLimit-Remaining), retry_after 0, source instance", body, left)
	}
	if k.Fleet == nil || k.Fleet.Remaining > left {
		t.Errorf("GET alice: %s\nwant the fleet's view (Redis, the lease counted as spent) beside it", body)
	}
	out := strings.Join(rateLimitCLI(t, c, "key", "api", "alice").ok(t, "caddy rate-limit key"), "\n")
	if want := fmt.Sprintf("not limited, %d remaining", left); !strings.Contains(out, want) || strings.Contains(out, "LIMITED") {
		t.Errorf("caddy rate-limit key api alice printed:\n%s\nwant %q", out, want)
	}
	if next := c.Do(withKey("alice")); next.Status != http.StatusOK || next.Header.Get("RateLimit-Remaining") != strconv.FormatInt(left-1, 10) {
		t.Errorf("alice's next request: %d, RateLimit-Remaining %q, want 200 and %d as the read said", next.Status, next.Header.Get("RateLimit-Remaining"), left-1)
	}
}
