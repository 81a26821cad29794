package tests

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// putOverride PUTs body as zone's override id and returns the status and
// answer.
func putOverride(t testing.TB, c *caddyInstance, zone, id, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, c.AdminURL+"/rate_limit/zones/"+zone+"/overrides/"+id, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return c.admin(req)
}

func mustPutOverride(t testing.TB, c *caddyInstance, zone, id, body string) {
	t.Helper()
	if status, answer := putOverride(t, c, zone, id, body); status/100 != 2 {
		t.Fatalf("PUT override %s: %d %s", id, status, answer)
	}
}

type overrideList struct {
	Zone      string `json:"zone"`
	View      string `json:"view"`
	Overrides []struct {
		ID    string `json:"id"`
		Match struct {
			Key    string `json:"key"`
			Prefix string `json:"prefix"`
			CIDR   string `json:"cidr"`
		} `json:"match"`
		Events  int64  `json:"events"`
		Window  string `json:"window"`
		Exempt  bool   `json:"exempt"`
		Deny    bool   `json:"deny"`
		Expires string `json:"expires"`
		Reason  string `json:"reason"`
		SetBy   string `json:"set_by"`
		SetAt   string `json:"set_at"`
	} `json:"overrides"`
}

func listOverrides(t testing.TB, c *caddyInstance, zone string) overrideList {
	t.Helper()
	var l overrideList
	c.adminJSON("/rate_limit/zones/"+zone+"/overrides", &l)
	return l
}

// admitted sends up to n requests with r and counts the allowed ones
// before the first denial.
func admitted(c *caddyInstance, r request, n int) int {
	for i := range n {
		if c.Do(r).Status != http.StatusOK {
			return i
		}
	}
	return n
}

const overrideLocalSite = `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}
		headers %s
	}
	respond "ok"
}
`

// A local zone's override is enforced at once, shown by the admin API and
// the headers, survives a reload that changes an unrelated setting and a
// `caddy stop` then start, and its removal puts the zone's limit back.
func TestOverrideLocalZoneSurvivesReloadAndRestart(t *testing.T) {
	c := newCaddyInstance(t)
	c.Start(c.Caddyfile("metrics", fmt.Sprintf(overrideLocalSite, "both")), "caddyfile")
	if n := admitted(c, withKey("vip"), 10); n != 3 {
		t.Fatalf("before the override: %d admitted, want 3", n)
	}
	mustPutOverride(t, c, "api", "vip", `{"match":{"key":"vip"},"events":20,"window":"1m","reason":"pays more"}`)
	mustPutOverride(t, c, "api", "partners", `{"match":{"prefix":"partner-"},"exempt":true}`)
	mustPutOverride(t, c, "api", "abuser", `{"match":{"key":"bad"},"deny":true,"expires":"1h"}`)

	// vip spent 3 of 3: 0 of 20 at once, and (20/min) one more per 3s.
	r := c.Do(withKey("vip"))
	if r.Status != http.StatusTooManyRequests || !strings.Contains(r.Header.Get("RateLimit-Policy"), "q=20") {
		t.Fatalf("vip after its raise: %d, policy %q; want 429 (its debt carried) under q=20", r.Status, r.Header.Get("RateLimit-Policy"))
	}
	if n := admitted(c, withKey("partner-1"), 50); n != 50 {
		t.Errorf("an exempt partner: %d of 50 admitted", n)
	}
	r = c.Do(withKey("bad"))
	if ra := r.Header.Get("Retry-After"); r.Status != http.StatusTooManyRequests || ra < "3500" || len(ra) != 4 {
		t.Errorf("denied key: %d, Retry-After %q; want 429 until its override expires (~3600)", r.Status, ra)
	}
	var k struct {
		Events   int64 `json:"events"`
		Override *struct {
			ID string `json:"id"`
		} `json:"override"`
	}
	c.adminJSON("/rate_limit/zones/api/keys/vip", &k)
	if k.Events != 20 || k.Override == nil || k.Override.ID != "vip" {
		t.Errorf("GET key vip: events %d, override %+v; want 20 and the override vip", k.Events, k.Override)
	}
	l := listOverrides(t, c, "api")
	if len(l.Overrides) != 3 || l.View != "instance" || l.Overrides[2].ID != "vip" || l.Overrides[2].Reason != "pays more" ||
		!strings.HasPrefix(l.Overrides[2].SetBy, "127.0.0.1:") || l.Overrides[2].SetAt == "" {
		t.Fatalf("list: %+v", l)
	}
	if v, ok := metricValue(c.scrape(), "caddy_rate_limit_overrides", map[string]string{"zone": "api"}); !ok || v != 3 {
		t.Errorf("caddy_rate_limit_overrides{zone=api} = %v (%v), want 3", v, ok)
	}
	if !strings.Contains(c.Output(), "rate limit override set") {
		t.Error("no INFO line for the change")
	}

	// A reload changing an unrelated setting keeps the overrides.
	load(t, c, "metrics", fmt.Sprintf(overrideLocalSite, "ietf"))
	if n := len(listOverrides(t, c, "api").Overrides); n != 3 {
		t.Fatalf("after a reload: %d overrides, want 3", n)
	}
	if n := admitted(c, withKey("partner-2"), 20); n != 20 {
		t.Errorf("after a reload an exempt partner: %d of 20 admitted", n)
	}
	// And so does a stop and start.
	c.stopWith("stop", syscall.SIGTERM)
	c.Start(c.Caddyfile("metrics", fmt.Sprintf(overrideLocalSite, "ietf")), "caddyfile")
	l = listOverrides(t, c, "api")
	if len(l.Overrides) != 3 {
		t.Fatalf("after a restart: %+v, want the 3 overrides", l)
	}
	if n := admitted(c, withKey("fresh-vip"), 30); n != 3 {
		t.Fatalf("an unrelated key: %d admitted, want the zone's 3", n)
	}
	if n := admitted(c, withKey("partner-3"), 20); n != 20 {
		t.Errorf("after a restart an exempt partner: %d of 20 admitted", n)
	}
	if c.Do(withKey("bad")).Status != http.StatusTooManyRequests {
		t.Error("after a restart the denied key is admitted")
	}
	if status, _ := c.adminDo(http.MethodDelete, "/rate_limit/zones/api/overrides/abuser"); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d", status)
	}
	if c.Do(withKey("bad")).Status != http.StatusOK {
		t.Error("after its override went the key is still denied")
	}
	if status, _ := c.adminDo(http.MethodDelete, "/rate_limit/zones/api/overrides/abuser"); status != http.StatusNotFound {
		t.Errorf("DELETE of a removed override: %d, want 404", status)
	}

	if out := rateLimitCLI(t, c, "key", "api", "vip").ok(t, "key"); !strings.Contains(strings.Join(out, "\n"), "under override vip (20/1m)") {
		t.Errorf("caddy rate-limit key under an override printed %q", out)
	}

	// The CLI sets, lists and removes the same.
	out := rateLimitCLI(t, c, "override", "set", "api", "cli-vip", "--prefix", "cli-", "--events", "9", "--window", "1m", "--expires", "2h", "--reason", "from the CLI").ok(t, "override set")
	if !strings.Contains(strings.Join(out, "\n"), `override cli-vip set: prefix "cli-" 9/1m, expires 20`) {
		t.Errorf("override set printed %q", out)
	}
	if n := admitted(c, withKey("cli-1"), 20); n != 9 {
		t.Errorf("under the CLI's override: %d admitted, want 9", n)
	}
	out = rateLimitCLI(t, c, "override", "list", "api").ok(t, "override list")
	if len(out) != 5 || !strings.Contains(out[0], "3 override(s) on this instance") || !strings.Contains(strings.Join(out, "\n"), `"from the CLI"`) {
		t.Errorf("override list printed %q", out)
	}
	rateLimitCLI(t, c, "override", "rm", "api", "cli-vip").ok(t, "override rm")
	if run := rateLimitCLI(t, c, "override", "set", "api", "x", "--key", "k", "--events", "-1", "--window", "1m"); run.code != 1 || !strings.Contains(run.stderr, "events") {
		t.Errorf("a bad override: exit %d, %q; want 1 naming events", run.code, run.stderr)
	}
	if n := len(listOverrides(t, c, "api").Overrides); n != 2 {
		t.Errorf("after override rm: %d overrides, want 2", n)
	}
}

// Hostile or malformed bodies are each a clear 4xx that names the field,
// and change nothing.
func TestOverrideHostileBodiesChangeNothing(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(overrideLocalSite, "both"))
	mustPutOverride(t, c, "api", "keep", `{"match":{"key":"k"},"events":5,"window":"1m"}`)
	for _, tc := range []struct {
		name, id, body, want string
	}{
		{"huge", "a", `{"match":{"key":"` + strings.Repeat("x", 20_000) + `"},"exempt":true}`, "body"},
		{"binary", "a", "\x00\x01\xff\xfe", "body"},
		// Go's mux cleans the path: the PUT reaches no override.
		{"traversal id", "..", `{"match":{"key":"k"},"exempt":true}`, "unknown path"},
		{"escaped traversal id", "..%2Fx", `{"match":{"key":"k"},"exempt":true}`, "id"},
		{"negative events", "a", `{"match":{"key":"k"},"events":-5,"window":"1m"}`, "events"},
		{"bad window", "a", `{"match":{"key":"k"},"events":5,"window":"soon"}`, "window"},
		{"control key", "a", `{"match":{"key":"a\u0007b"},"exempt":true}`, "match.key"},
		// JSON's decoder reads bytes that are not UTF-8, and a lone surrogate,
		// as U+FFFD: such an override would cover no key a request carries.
		{"non-UTF-8 key", "a", "{\"match\":{\"key\":\"\xff\xfe\"},\"exempt\":true}", "match.key"},
		{"non-UTF-8 prefix", "a", "{\"match\":{\"prefix\":\"a\xff\"},\"exempt\":true}", "match.prefix"},
		{"lone surrogate key", "a", `{"match":{"key":"\ud800"},"exempt":true}`, "match.key"},
		{"replacement character key", "a", `{"match":{"key":"\ufffd\ufffd"},"exempt":true}`, "match.key"},
		{"two matches", "a", `{"match":{"key":"k","prefix":"p"},"exempt":true}`, "match"},
		{"bad cidr", "a", `{"match":{"cidr":"10.0.0.0/99"},"exempt":true}`, "match.cidr"},
		{"exempt and deny", "a", `{"match":{"key":"k"},"exempt":true,"deny":true}`, "exempt"},
		{"past expiry", "a", `{"match":{"key":"k"},"deny":true,"expires":"2001-01-01T00:00:00Z"}`, "expires"},
		{"unknown field", "a", `{"match":{"key":"k"},"exempt":true,"admin":true}`, "body"},
		{"quota field on a rate zone", "a", `{"match":{"key":"k"},"limit":5}`, "events"},
	} {
		status, answer := putOverride(t, c, "api", tc.id, tc.body)
		if status < 400 || status > 499 || !strings.Contains(answer, tc.want) {
			t.Errorf("%s: %d %s; want a 4xx naming %s", tc.name, status, answer, tc.want)
		}
	}
	l := listOverrides(t, c, "api")
	if len(l.Overrides) != 1 || l.Overrides[0].ID != "keep" {
		t.Errorf("after the bad bodies: %+v, want only keep", l.Overrides)
	}
}

// remainingOf is a response's RateLimit-Remaining.
func remainingOf(t testing.TB, r response) int64 {
	t.Helper()
	n, err := strconv.ParseInt(r.Header.Get("RateLimit-Remaining"), 10, 64)
	if err != nil {
		t.Fatalf("RateLimit-Remaining %q: %v", r.Header.Get("RateLimit-Remaining"), err)
	}
	return n
}

// untilStatus sends r to c until it answers status, and returns when it
// did (failing after limit).
func untilStatus(t testing.TB, c *caddyInstance, r request, status int, limit time.Duration) (response, time.Time) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		res := c.Do(r)
		if res.Status == status {
			return res, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %d after %v, want %d", c.URL, res.Status, limit, status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// untilOverrides polls c's list of zone's overrides until it holds n, and
// returns when it did (failing after limit).
func untilOverrides(t testing.TB, c *caddyInstance, zone string, n int, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		l := listOverrides(t, c, zone)
		if len(l.Overrides) == n {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d overrides after %v, want %d", c.URL, len(l.Overrides), limit, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An override PUT on one of three strict instances is enforced by all
// three within 1 s, with the key's debt carried (a key that spent 5/min
// and waited 5 s has about 4 of 50/min); a deny override denies everywhere
// and lapses everywhere; DELETE restores the zone's limit with the debt.
func TestOverrideStrictFleetWithinOneSecond(t *testing.T) {
	rs := startRedis(t)
	fleet := startFleet(t, 3, rs.Addr, `		zone api {
			key {http.request.header.X-API-Key}
			events 5
			window 1m
		}`)
	// Every instance enforces a change within 1 s: it hears of it on the
	// resets channel at once (the poll, every 250 ms, is the backstop).
	const bound = time.Second
	k := withKey("grow")
	// Under 50/min a key that spent its 5/min at t0 has one more every
	// 1.2 s from t0 (the time it owes, carried): between start and spent.
	start := time.Now()
	if n := admitted(fleet[0], k, 10); n != 5 {
		t.Fatalf("the zone's limit: %d admitted, want 5", n)
	}
	spent := time.Now()
	earned := func(from, to time.Time) int { return int(to.Sub(from) / (1200 * time.Millisecond)) }
	for _, c := range fleet {
		if c.Do(k).Status != http.StatusTooManyRequests {
			t.Fatal("a spent key admitted")
		}
	}
	time.Sleep(5 * time.Second) // the scenario: the key waits 5 s
	put := time.Now()
	mustPutOverride(t, fleet[1], "api", "grow", `{"match":{"key":"grow"},"events":50,"window":"1m"}`)
	total := 0
	for i, c := range fleet {
		res, at := untilStatus(t, c, k, http.StatusOK, bound)
		total++
		if took := at.Sub(put); took > bound {
			t.Errorf("instance %d admitted the raised key %v after the PUT", i, took)
		}
		if i == 0 {
			// 5 s at one per 1.2 s: 4 (a fifth by 6 s), this one taken.
			if rem, lo, hi := remainingOf(t, res), earned(spent, put)-1, earned(start, at)-1; rem < int64(lo) || rem > int64(hi) {
				t.Errorf("first admission under 50/min: remaining %d, want %d to %d (about 3: the debt carried, not a fresh 49)", rem, lo, hi)
			}
		}
	}
	total += admitted(fleet[0], k, 60)
	if lo, hi := earned(spent, put), earned(start, time.Now()); total < lo || total > hi {
		t.Errorf("%d admitted under the raise, want %d to %d (about 4: 5 s / 1.2 s), not a fresh bucket", total, lo, hi)
	}

	// DELETE: back to 5/min, the debt of the raised key carried.
	if status, body := fleet[2].adminDo(http.MethodDelete, "/rate_limit/zones/api/overrides/grow"); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	for _, c := range fleet { // every instance has dropped it
		untilOverrides(t, c, "api", 0, bound)
	}
	after := 0
	for _, c := range fleet {
		after += admitted(c, k, 6)
	}
	if after > 1 {
		t.Errorf("after DELETE: %d admitted, want at most 1 (the debt carried, not a fresh 5)", after)
	}

	// A deny override with expiry 3 s denies everywhere, then lapses
	// everywhere.
	d := withKey("shut")
	put = time.Now()
	mustPutOverride(t, fleet[0], "api", "shut", `{"match":{"key":"shut"},"deny":true,"expires":"3s"}`)
	for i, c := range fleet {
		// Polled through the admin API: a request admitted meanwhile
		// would consume.
		if took := untilOverrides(t, c, "api", 1, bound).Sub(put); took > bound {
			t.Errorf("instance %d denied %v after the PUT", i, took)
		}
		res := c.Do(d)
		if res.Status != http.StatusTooManyRequests {
			t.Errorf("instance %d: %d under a deny override", i, res.Status)
		}
		if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 1 || ra > 3 {
			t.Errorf("deny override: Retry-After %q, want until it expires (≤ 3 s)", res.Header.Get("Retry-After"))
		}
	}
	for i, c := range fleet {
		_, at := untilStatus(t, c, d, http.StatusOK, 3*time.Second+bound)
		if lapsed := at.Sub(put); lapsed < 3*time.Second-100*time.Millisecond || lapsed > 3*time.Second+bound {
			t.Errorf("instance %d lapsed the deny %v after the PUT, want 3 s", i, lapsed)
		}
	}
	var l overrideList
	fleet[2].adminJSON("/rate_limit/zones/api/overrides", &l)
	if len(l.Overrides) != 0 || l.View != "fleet" {
		t.Errorf("after the lapse: %+v, want none, the fleet's view", l)
	}
	rs.requireEveryKeyExpires(t, 1)
}

// CIDR overrides on an ipv4_prefix 24 zone, prefix overrides on an API-key
// zone, and an override's precedence over a plan placeholder.
func TestOverrideCIDRPrefixAndPlanPrecedence(t *testing.T) {
	rs := startRedis(t)
	c := startCaddy(t, distributedSite(rs.Addr, `		zone ip {
			key {remote_host}
			ipv4_prefix 24
			events 2
			window 1m
			match path /ip
		}
		zone api {
			key {http.request.header.X-API-Key}
			events {http.request.header.X-Plan} 2 at_most 100
			window 1m
			match path /api
		}`, ""))
	mustPutOverride(t, c, "ip", "lab", `{"match":{"cidr":"127.0.0.0/16"},"events":7,"window":"1m"}`)
	mustPutOverride(t, c, "ip", "lab-narrow", `{"match":{"cidr":"127.0.9.0/24"},"events":4,"window":"1m"}`)
	if n := admitted(c, request{Path: "/ip", Client: clientFrom(t, "127.0.0.5")}, 20); n != 7 {
		t.Errorf("127.0.0.5 under the /16: %d admitted, want 7", n)
	}
	if n := admitted(c, request{Path: "/ip", Client: clientFrom(t, "127.0.9.5")}, 20); n != 4 {
		t.Errorf("127.0.9.5 under the narrower /24: %d admitted, want 4", n)
	}
	mustPutOverride(t, c, "api", "tenant", `{"match":{"prefix":"tenant-a-"},"events":6,"window":"1m"}`)
	mustPutOverride(t, c, "api", "one", `{"match":{"key":"tenant-a-1"},"events":3,"window":"1m"}`)
	plan := func(key, p string) request {
		return request{Path: "/api", Header: map[string]string{"X-API-Key": key, "X-Plan": p}}
	}
	for _, tc := range []struct {
		key, plan string
		want      int
	}{
		{"tenant-a-9", "10", 6}, // the prefix over the plan placeholder
		{"tenant-a-1", "10", 3}, // the exact key over the prefix
		{"tenant-b-1", "10", 10},
		{"tenant-b-2", "", 2},
	} {
		if n := admitted(c, plan(tc.key, tc.plan), 30); n != tc.want {
			t.Errorf("%s with plan %q: %d admitted, want %d", tc.key, tc.plan, n, tc.want)
		}
	}
}

// An async zone's override reaches every instance within 1 s, as a strict
// zone's does.
func TestOverrideAsyncFleet(t *testing.T) {
	rs := startRedis(t)
	fleet := startAsyncFleet(t, 2, rs.Addr, "100ms", `		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}`)
	put := time.Now()
	mustPutOverride(t, fleet[0], "api", "vip", `{"match":{"key":"vip"},"events":12,"window":"1m"}`)
	mustPutOverride(t, fleet[0], "api", "gone", `{"match":{"key":"gone"},"deny":true}`)
	for i, c := range fleet {
		if took := untilOverrides(t, c, "api", 2, time.Second).Sub(put); took > time.Second {
			t.Errorf("instance %d took %v to hear of the overrides", i, took)
		}
		if c.Do(withKey("gone")).Status != http.StatusTooManyRequests {
			t.Errorf("instance %d admits a denied key", i)
		}
	}
	total := 0
	for range 2 {
		for _, c := range fleet {
			total += admitted(c, withKey("vip"), 20)
		}
	}
	// 12, and at most the async bound's (N−1)·max(1, ⌊B/N⌋) = 6 beyond.
	if total < 12 || total > 18 {
		t.Errorf("async fleet under a 12/min override: %d admitted, want 12 to 18", total)
	}
}

// A zone holds at most 10,000 overrides: the 10,001st is a 409 and
// changes nothing.
func TestOverrideBoundIsTenThousand(t *testing.T) {
	rs := startRedis(t)
	// A PUT on a full zone scans its 10,000 overrides for lapsed ones (a
	// few ms); the 50ms default timeout is a latency bound a loaded
	// machine can miss, and latency is not what this test is about.
	c := startCaddy(t, distributedSite(rs.Addr, `		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}`, "\t\t\ttimeout 1s"))
	rc := rs.Client()
	ctx := context.Background()
	pipe := rc.Pipeline()
	for i := range 10_000 {
		rec := fmt.Sprintf(`{"id":"o%d","match":{"prefix":"t%05d-"},"exempt":true,"set_by":"test","set_at":"2026-01-01T00:00:00Z"}`, i, i)
		pipe.HSet(ctx, "tally:api.overrides", fmt.Sprint("o:o", i), "0|1|"+rec)
	}
	pipe.HSet(ctx, "tally:api.overrides", "e", 1, "v", 1, "n", 10_000)
	pipe.Expire(ctx, "tally:api.overrides", time.Hour)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	untilOverrides(t, c, "api", 10_000, 2*time.Second)
	if n := admitted(c, withKey("t00042-x"), 10); n != 10 {
		t.Errorf("an exempt prefix among 10,000: %d of 10 admitted", n)
	}
	status, answer := putOverride(t, c, "api", "one-more", `{"match":{"key":"k"},"exempt":true}`)
	if status != http.StatusConflict || !strings.Contains(answer, "10000") {
		t.Fatalf("the 10,001st: %d %s; want 409 saying the bound", status, answer)
	}
	if n := rc.HGet(ctx, "tally:api.overrides", "n").Val(); n != "10000" {
		t.Errorf("the hash counts %s overrides after the refused PUT, want 10,000", n)
	}
	mustPutOverride(t, c, "api", "o0", `{"match":{"key":"k"},"deny":true}`)
	// The PUT's instance reads back the one change.
	waitFor(t, 2e9, "the replaced override in the instance's view", func() bool {
		_, body := c.adminDo(http.MethodGet, "/rate_limit/zones/api/overrides/o0")
		return strings.Contains(body, `"deny":true`)
	})
	if c.Do(withKey("k")).Status != http.StatusTooManyRequests {
		t.Error("replacing an override of a full zone is not enforced")
	}
}

// Each change emits rate_limit_override_changed and logs one INFO line.
func TestOverrideChangeEmitsTheEventAndOneLogLine(t *testing.T) {
	c := startCaddyWith(t, "\tlog {\n\t\tlevel DEBUG\n\t}", fmt.Sprintf(overrideLocalSite, "both"))
	mustPutOverride(t, c, "api", "vip", `{"match":{"key":"vip"},"events":20,"window":"1m","reason":"pays more"}`)
	if status, _ := c.adminDo(http.MethodDelete, "/rate_limit/zones/api/overrides/vip"); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d", status)
	}
	var events, sets, removals int
	waitFor(t, 10e9, "two rate_limit_override_changed events in Caddy's debug log", func() bool {
		out := c.Output()
		events = strings.Count(out, `"name":"rate_limit_override_changed"`)
		sets = strings.Count(out, `"msg":"rate limit override set"`)
		removals = strings.Count(out, `"msg":"rate limit override removed"`)
		return events >= 2
	})
	if events != 2 || sets != 1 || removals != 1 {
		t.Errorf("%d events, %d set lines, %d removed lines; want 2, 1, 1", events, sets, removals)
	}
	if !strings.Contains(c.Output(), `"reason":"pays more"`) {
		t.Error("the log line does not give the reason")
	}
}
