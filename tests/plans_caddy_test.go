package tests

// Limits per plan (events/window/burst from placeholders) through a real
// Caddy: each plan's exact limit, locally and across three strict-mode
// instances; upgrades and downgrades; the fallback for unusable values.

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// planZone limits each X-API-Key to the events of its X-Plan, through map.
const planZone = `
		zone per_customer {
			key    {http.request.header.X-API-Key}
			events {plan_events} 3
			window 1h
		}`

// planMap maps X-Plan to {plan_events}: free 3, pro 10, enterprise 25.
const planMap = `
	map {http.request.header.X-Plan} {plan_events} {
		free       3
		pro        10
		enterprise 25
		default    3
	}`

var planEvents = map[string]int{"free": 3, "pro": 10, "enterprise": 25}

func planRequest(key, plan string) request {
	return request{Header: map[string]string{"X-API-Key": key, "X-Plan": plan}}
}

var policyQ = regexp.MustCompile(`^"per_customer";q=(\d+);w=3600$`)

// checkPlans sends, for every plan, events+3 requests one by one and then
// 4×events from 64 goroutines for a fresh key, spread over fleet, and wants
// exactly events allowed each time, with the plan's q in RateLimit-Policy.
func checkPlans(t *testing.T, fleet []*caddyInstance, tag string) {
	for plan, events := range planEvents {
		key := tag + "-seq-" + plan
		for i := 0; i < events+3; i++ {
			res := fleet[i%len(fleet)].Do(planRequest(key, plan))
			want := 200
			if i >= events {
				want = 429
			}
			if res.Status != want {
				t.Fatalf("%s plan %s, sequential request %d: %d, want %d", tag, plan, i+1, res.Status, want)
			}
			m := policyQ.FindStringSubmatch(res.Header.Get("RateLimit-Policy"))
			if m == nil || m[1] != fmt.Sprint(events) {
				t.Fatalf("%s plan %s: RateLimit-Policy %q, want q=%d;w=3600", tag, plan, res.Header.Get("RateLimit-Policy"), events)
			}
			if res.Status == 200 && res.Header.Get("RateLimit-Limit") != fmt.Sprint(events) {
				t.Fatalf("%s plan %s: RateLimit-Limit %q, want %d", tag, plan, res.Header.Get("RateLimit-Limit"), events)
			}
		}
	}
	var wg sync.WaitGroup
	results := map[string]statusCounts{}
	var mu sync.Mutex
	for plan, events := range planEvents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := sendAcross(t, fleet, 4*events, 64, planRequest(tag+"-conc-"+plan, plan), 10*time.Second)
			mu.Lock()
			results[plan] = got
			mu.Unlock()
		}()
	}
	wg.Wait()
	for plan, events := range planEvents {
		if got := results[plan]; got[200] != events || got[429] != 3*events {
			t.Errorf("%s plan %s, %d requests from 64 goroutines: %v, want exactly %d×200", tag, plan, 4*events, got, events)
		}
	}
}

func TestEachPlanGetsExactlyItsLimitLocally(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {`+planMap+`
	rate_limit {`+planZone+`
	}
	respond "ok"
}
`)
	checkPlans(t, []*caddyInstance{c}, "local")
}

func TestEachPlanGetsExactlyItsLimitAcrossThreeStrictInstances(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	site := `http:// {` + planMap + `
	rate_limit {` + planZone + `
		distributed {
			redis redis://` + rs.Addr + `
			timeout 2s
		}
	}
	respond "ok"
}
`
	fleet := []*caddyInstance{startCaddy(t, site), startCaddy(t, site), startCaddy(t, site)}
	checkPlans(t, fleet, "strict")
	rs.requireEveryKeyExpires(t, 6)
}

// A key's state is a point in time (its TAT), read under whichever plan the
// next request carries: a key that used half of free's hour has half of
// pro's hour left, and a downgrade keeps the debt.
func TestUpgradeAndDowngradeMidWindow(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", `http:// {
	map {http.request.header.X-Plan} {plan_events} {
		free 10
		pro  100
	}
	rate_limit {
		zone per_customer {
			key    {http.request.header.X-API-Key}
			events {plan_events} 10
			window 1h
		}
	}
	respond "ok"
}
`)
	// Upgrade: 5 of free's 10 is half the hour; pro then has 50 of 100.
	if got := countStatuses(c.Send(5, planRequest("upgrader", "free"))); got[200] != 5 {
		t.Fatalf("5 requests on free: %v", got)
	}
	var k adminKey
	c.adminJSON(keyPath("per_customer", "upgrader"), &k)
	if k.Events != 10 || k.Remaining != 5 {
		t.Fatalf("admin API after 5 on free: %+v, want events 10 remaining 5", k)
	}
	if got := countStatuses(c.Send(60, planRequest("upgrader", "pro"))); got[200] != 50 || got[429] != 10 {
		t.Fatalf("after upgrading to pro: %v, want exactly 50×200 (pro's 100 minus the half hour used)", got)
	}
	c.adminJSON(keyPath("per_customer", "upgrader"), &k)
	if k.Events != 100 || k.Window != "1h" || k.Burst != 100 || k.Remaining != 0 {
		t.Fatalf("admin API after the upgrade: %+v, want the pro plan (events 100, window 1h, burst 100), remaining 0", k)
	}

	// Downgrade: 60 of pro's 100 is 36 minutes; free then has (60-36)/6 = 4.
	if got := countStatuses(c.Send(60, planRequest("downgrader", "pro"))); got[200] != 60 {
		t.Fatalf("60 requests on pro: %v", got)
	}
	if got := countStatuses(c.Send(10, planRequest("downgrader", "free"))); got[200] != 4 || got[429] != 6 {
		t.Fatalf("after downgrading to free: %v, want exactly 4×200: the debt is kept", got)
	}
	if v, ok := metricValue(c.scrape(), "caddy_rate_limit_plan_fallbacks_total", map[string]string{"zone": "per_customer"}); !ok || v != 0 {
		t.Errorf("plan_fallbacks_total = %v (present %v), want 0: every value was valid", v, ok)
	}
}

// Unusable values fall back to the zone's literal limit, are counted and
// logged, and never become a 500 or an unlimited key.
func TestUnusablePlanValuesFallBackToTheLiteralLimit(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", `http:// {
	rate_limit {
		zone per_customer {
			key    {http.request.header.X-API-Key}
			events {http.request.header.X-Events} 3
			window {http.request.header.X-Window} 1h
		}
	}
	respond "ok"
}
`)
	cases := []struct {
		name           string
		events, window string // "-" = header not sent
	}{
		{"missing", "-", "-"},
		{"empty", "", "1h"},
		{"non-numeric", "lots", "1h"},
		{"negative", "-5", "1h"},
		{"zero", "0", "1h"},
		{"huge", "99999999999999999999", "1h"},
		{"over 2^40", "1099511627777", "1h"},
		{"fractional", "2.5", "1h"},
		{"bad window", "3", "soon"},
		{"zero window", "3", "0s"},
		{"negative window", "3", "-1h"},
		{"more than one per ns", "1000", "1ns"},
	}
	sent := 0
	for _, tc := range cases {
		r := request{Header: map[string]string{"X-API-Key": "key-" + tc.name}}
		if tc.events != "-" {
			r.Header["X-Events"] = tc.events
		}
		if tc.window != "-" {
			r.Header["X-Window"] = tc.window
		}
		got := c.Send(6, r)
		sent += len(got)
		if fmt.Sprint(got) != "[200 200 200 429 429 429]" {
			t.Errorf("%s (events %q, window %q): %v, want the literal 3 per hour", tc.name, tc.events, tc.window, got)
		}
	}
	// A valid value from the same headers does apply.
	if got := countStatuses(c.Send(8, request{Header: map[string]string{"X-API-Key": "valid", "X-Events": "5", "X-Window": "1h"}})); got[200] != 5 {
		t.Errorf("valid events 5: %v, want 5×200", got)
	}
	v, ok := metricValue(c.scrape(), "caddy_rate_limit_plan_fallbacks_total", map[string]string{"zone": "per_customer"})
	if !ok || int(v) != sent {
		t.Errorf("plan_fallbacks_total = %v (present %v), want %d: one per request with an unusable value", v, ok, sent)
	}
	waitFor(t, 5*time.Second, "the fallback to be logged", func() bool {
		return strings.Contains(c.Output(), "per-request limit is empty or invalid")
	})
}

// A client that sets its own plan (here X-Events and X-Window, request
// headers) would pick 2^40 per 100 years, or 5 per 5µs: the zone's bounds
// make such values fall back, counted and logged like unusable ones, and a
// zone that reads its limit from the request without a bound is warned about
// when it loads.
func TestPlanBoundsMakeOutOfBoundValuesFallBack(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", `http:// {
	handle /burst {
		rate_limit {
			zone burst_bounded {
				key   {http.request.header.X-API-Key}
				events 10
				window 1h
				burst {http.request.header.X-Burst} at_most 4
			}
		}
		respond "ok"
	}
	handle /unbounded {
		rate_limit {
			zone unbounded {
				key    {http.request.header.X-API-Key}
				events {http.request.header.X-Events} 3
				window 1h
			}
		}
		respond "ok"
	}
	handle {
		rate_limit {
			zone bounded {
				key    {http.request.header.X-API-Key}
				events {http.request.header.X-Events} 3 at_most 10
				window {http.request.header.X-Window} 1h at_least 1m
			}
		}
		respond "ok"
	}
}
`)
	cases := []struct {
		name, path, events, window, burst string // "" = header not sent
		allowed                           int    // of 12 sent one after the other
	}{
		{"5 per 5µs", "/", "5", "5us", "", 5},
		{"2^40 per 100 years", "/", "1099511627776", "876000h", "", 3},
		{"events over at_most", "/", "11", "1h", "", 3},
		{"events at at_most", "/", "10", "1h", "", 10},
		{"window at at_least", "/", "3", "1m", "", 3},
		{"burst over at_most", "/burst", "", "", "5", 10}, // falls back to the events
		{"burst at at_most", "/burst", "", "", "4", 4},
	}
	for _, tc := range cases {
		r := request{Path: tc.path, Header: map[string]string{"X-API-Key": tc.name}}
		for h, v := range map[string]string{"X-Events": tc.events, "X-Window": tc.window, "X-Burst": tc.burst} {
			if v != "" {
				r.Header[h] = v
			}
		}
		if got := countStatuses(c.Send(12, r)); got[200] != tc.allowed || got[429] != 12-tc.allowed {
			t.Errorf("%s (events %q, window %q, burst %q): %v, want %d×200", tc.name, tc.events, tc.window, tc.burst, got, tc.allowed)
		}
	}
	samples := c.scrape()
	for zone, want := range map[string]float64{"bounded": 36, "burst_bounded": 12} {
		if v, _ := metricValue(samples, "caddy_rate_limit_plan_fallbacks_total", map[string]string{"zone": zone}); v != want {
			t.Errorf("zone %s: plan_fallbacks_total = %v, want %v: one per request with a value beyond its bound", zone, v, want)
		}
	}
	// Logged as unusable values are, sampled: the first case's lines at
	// least.
	waitFor(t, 5*time.Second, "the fallback below at_least to be logged", func() bool {
		return strings.Contains(c.Output(), `"setting":"window","value":"5us","error":"below the zone's at_least"`)
	})
	// The zone with no bound was warned about when it loaded; the bounded
	// ones were not.
	warning := regexp.MustCompile(`"msg":"a zone's limit comes from the request, which the client sets, with no bound[^"]*","zone":"([a-z_]+)"`)
	if m := warning.FindAllStringSubmatch(c.Output(), -1); len(m) != 1 || m[0][1] != "unbounded" {
		t.Errorf("warnings for client-set plans without a bound: %q, want one, for zone unbounded", m)
	}
}

// The headers of a response are rendered once and cached by the numbers
// they carry, the plan's window among them: two plans that differ only in
// their window (q=10 per 1h and per 2h) each show their own w, also when
// everything else about the two responses is the same (cost 0 on a fresh
// key: full, no t, RateLimit-Reset 0).
func TestPlansThatDifferOnlyInWindowEachShowTheirOwnW(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone per_window {
			key    {http.request.header.X-API-Key}
			events 10
			window {http.request.header.X-Window} 1h
			cost   {http.request.header.X-Cost}
		}
	}
	respond "ok"
}
`)
	for _, w := range []string{"1h", "2h", "1h", "2h"} {
		res := c.Do(request{Header: map[string]string{"X-API-Key": "probe", "X-Window": w, "X-Cost": "0"}})
		want := `"per_window";q=10;w=3600;tally-cost`
		if w == "2h" {
			want = `"per_window";q=10;w=7200;tally-cost`
		}
		if got := res.Header.Get("RateLimit-Policy"); res.Status != 200 || got != want {
			t.Errorf("window %s: %d RateLimit-Policy %q, want 200 and %q", w, res.Status, got, want)
		}
	}
}

// burst and window read from placeholders decide, not only parse: a request
// giving burst 2 gets 200, 200, 429 where the fallback (the events, 10)
// would allow all three, and a valid window changes the answer (one per
// microsecond never waits; the fallback hour does).
func TestBurstAndWindowPlaceholdersChangeTheDecision(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone per_plan {
			key    {http.request.header.X-API-Key}
			events 10
			window {http.request.header.X-Window} 1h
			burst  {http.request.header.X-Burst}
		}
	}
	respond "ok"
}
`)
	send := func(key, burst, window string, n int) string {
		r := request{Header: map[string]string{"X-API-Key": key}}
		if burst != "" {
			r.Header["X-Burst"] = burst
		}
		if window != "" {
			r.Header["X-Window"] = window
		}
		return fmt.Sprint(c.Send(n, r))
	}
	if got := send("two", "2", "", 3); got != "[200 200 429]" {
		t.Errorf("burst 2: %v, want [200 200 429]", got)
	}
	if got := send("fallback", "", "", 3); got != "[200 200 200]" {
		t.Errorf("no burst (fallback: the events, 10): %v, want [200 200 200]", got)
	}
	if got := send("hourly", "1", "", 2); got != "[200 429]" {
		t.Errorf("burst 1 per the fallback hour: %v, want [200 429]", got)
	}
	if got := send("fast", "1", "10us", 5); got != "[200 200 200 200 200]" {
		t.Errorf("burst 1 at 10 per 10µs (one request per microsecond): %v, want every request allowed", got)
	}
}
