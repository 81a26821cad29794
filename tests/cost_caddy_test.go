package tests

// What a request costs, through a real Caddy in front of a real upstream
// (an HTTP server in the test process, on loopback): post-charged zones that
// count only some responses (`count`), charge what the upstream reports
// (`charge`), and weighted zones (`cost`).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// loginUpstream answers 401 to a request with X-Password: wrong and 200
// otherwise, counting the requests that reach it.
func loginUpstream(t *testing.T) (addr string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("X-Password") == "wrong" {
			http.Error(w, "bad password", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("welcome"))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), hits
}

// tokenUpstream answers with X-Tokens-Used set to the request's X-Use.
func tokenUpstream(t *testing.T) (addr string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Tokens-Used", r.Header.Get("X-Use"))
		_, _ = w.Write([]byte("completion"))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), hits
}

// failedLoginZone counts only 401s: 5 per 15 minutes per user.
const failedLoginZone = `
		zone failed_logins {
			key    {http.request.header.X-User}
			events 5
			window 15m
			count {
				status 401
			}
		}`

func loginSite(upstream, zones, distributed string) string {
	return `http:// {
	rate_limit {` + zones + distributed + `
	}
	reverse_proxy ` + upstream + `
}
`
}

// checkFailedLogins sends 20 logins for one user over fleet, alternating a
// wrong and a right password: the 5 wrong ones are let through and answered
// 401, the right ones in between are 200 and consume nothing, and once the
// fifth failure is charged the user is denied, right password or not,
// before reaching the upstream.
//
// With several instances, each failure's charge must be visible through the
// next instance (it reaches Redis a round trip after the response) before
// the next login is sent there.
func checkFailedLogins(t *testing.T, fleet []*caddyInstance, user string, hits *atomic.Int64) {
	t.Helper()
	before := hits.Load()
	var got []int
	failures := 0
	for i := range 20 {
		pw := "right"
		if i%2 == 0 {
			pw = "wrong"
		}
		res := fleet[i%len(fleet)].Do(request{Path: "/login", Header: map[string]string{"X-User": user, "X-Password": pw}})
		got = append(got, res.Status)
		if res.Status == 401 && len(fleet) > 1 {
			failures++
			waitCharged(t, fleet[(i+1)%len(fleet)], "failed_logins", user, int64(5-failures))
		}
	}
	want := "[401 200 401 200 401 200 401 200 401 429 429 429 429 429 429 429 429 429 429 429]"
	if fmt.Sprint(got) != want {
		t.Errorf("20 logins alternating wrong and right passwords: %v, want %s", got, want)
	}
	if n := hits.Load() - before; n != 9 {
		t.Errorf("%d requests reached the upstream, want 9: a denied request must not", n)
	}
}

// waitCharged polls c's admin API until key in zone has remaining left: a
// charge made on another instance has reached Redis.
func waitCharged(t *testing.T, c *caddyInstance, zone, key string, remaining int64) {
	t.Helper()
	var k adminKey
	waitFor(t, 5*time.Second, fmt.Sprintf("%s's charge in zone %s to reach Redis (remaining %d)", key, zone, remaining), func() bool {
		code, body := c.adminDo(http.MethodGet, keyPath(zone, key))
		return code == http.StatusOK && json.Unmarshal([]byte(body), &k) == nil && k.Remaining == remaining
	})
}

func TestFailedLoginLimiterCountsOnlyFailures(t *testing.T) {
	t.Parallel()
	up, hits := loginUpstream(t)
	c := startCaddyWith(t, "metrics", loginSite(up, failedLoginZone, ""))
	// Successful logins never consume: 30 in a row all pass.
	if got := countStatuses(c.Send(30, request{Path: "/login", Header: map[string]string{"X-User": "carol"}})); got[200] != 30 {
		t.Fatalf("30 successful logins: %v, want 30×200", got)
	}
	checkFailedLogins(t, []*caddyInstance{c}, "mallory", hits)
	res := c.Do(request{Path: "/login", Header: map[string]string{"X-User": "mallory"}})
	if !strings.Contains(res.Header.Get("RateLimit-Policy"), `"failed_logins";q=5;w=900;tally-post-charged`) {
		t.Errorf("RateLimit-Policy %q does not describe the post-charged zone", res.Header.Get("RateLimit-Policy"))
	}
	if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 170 || ra > 181 {
		t.Errorf("Retry-After %q, want about 180 s (one failure's share of 15 minutes)", res.Header.Get("Retry-After"))
	}
	v, ok := metricValue(c.scrape(), "caddy_rate_limit_cost_total", map[string]string{"zone": "failed_logins"})
	if !ok || v != 5 {
		t.Errorf("cost_total = %v (present %v), want the 5 failures charged", v, ok)
	}
}

// tokenZone limits each Authorization to 100 tokens per 100 s (one token a
// second), charged from the upstream's X-Tokens-Used.
const tokenZone = `
		zone tokens {
			key    {http.request.header.Authorization}
			events 100
			window 100s
			charge {http.response.header.X-Tokens-Used}
		}`

func tokenRequest(key string, tokens string) request {
	return request{Header: map[string]string{"Authorization": key, "X-Use": tokens}}
}

// checkTokenDebt spends 30 tokens 4 times: the fourth passes (90 < 100 were
// spent) and runs 20 past the limit; the key is then denied with a
// Retry-After of the 21 s the debt and one token take to clear.
func checkTokenDebt(t *testing.T, fleet []*caddyInstance, key string, hits *atomic.Int64) {
	t.Helper()
	before := hits.Load()
	for i := range 4 {
		if res := fleet[i%len(fleet)].Do(tokenRequest(key, "30")); res.Status != 200 {
			t.Fatalf("request %d spending 30 tokens: %d, want 200", i+1, res.Status)
		}
		if len(fleet) > 1 {
			waitCharged(t, fleet[(i+1)%len(fleet)], "tokens", key, max(0, 100-30*int64(i+1)))
		}
	}
	for i := range len(fleet) {
		res := fleet[i].Do(tokenRequest(key, "1"))
		if res.Status != 429 {
			t.Fatalf("after 120 of 100 tokens, instance %d: %d, want 429", i, res.Status)
		}
		if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 20 || ra > 22 {
			t.Errorf("Retry-After %q, want 21 ± 1 s: the 20-token debt plus one token at 1 token/s", res.Header.Get("Retry-After"))
		}
	}
	if n := hits.Load() - before; n != 4 {
		t.Errorf("%d requests reached the upstream, want 4", n)
	}
}

func TestChargeFromTheResponseDeniesOnceTheSumPassesTheLimit(t *testing.T) {
	t.Parallel()
	up, hits := tokenUpstream(t)
	c := startCaddyWith(t, "metrics", loginSite(up, tokenZone, ""))
	checkTokenDebt(t, []*caddyInstance{c}, "Bearer alice", hits)

	// Unreadable values charge the default (1), are counted, and are not
	// a 500; 0 charges nothing; a huge value is capped at one burst, and
	// counted.
	for _, v := range []string{"", "lots", "-7", "2.5"} {
		if res := c.Do(tokenRequest("Bearer bob", v)); res.Status != 200 {
			t.Fatalf("X-Tokens-Used %q: %d, want 200", v, res.Status)
		}
	}
	if res := c.Do(tokenRequest("Bearer bob", "0")); res.Status != 200 {
		t.Fatalf("X-Tokens-Used 0: %d", res.Status)
	}
	var k adminKey
	c.adminJSON(keyPath("tokens", "Bearer bob"), &k)
	if k.Remaining != 96 {
		t.Errorf("after 4 unreadable charges and one of 0: remaining %d, want 96", k.Remaining)
	}
	samples := c.scrape()
	if v, _ := metricValue(samples, "caddy_rate_limit_cost_fallbacks_total", map[string]string{"zone": "tokens"}); v != 4 {
		t.Errorf("cost_fallbacks_total = %v, want 4", v)
	}
	if v, _ := metricValue(samples, "caddy_rate_limit_cost_total", map[string]string{"zone": "tokens"}); v != 124 {
		t.Errorf("cost_total = %v, want 124 (120 for alice, 4 for bob)", v)
	}
	if res := c.Do(tokenRequest("Bearer eve", "99999999999999999999")); res.Status != 200 {
		t.Fatalf("a huge charge: %d, want 200 (the check passed; the charge is capped)", res.Status)
	}
	res := c.Do(tokenRequest("Bearer eve", "1"))
	if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); res.Status != 429 || ra < 1 || ra > 2 {
		t.Errorf("after a huge charge: %d Retry-After %q, want 429 after 1 s (capped at one burst: the key empty, no debt)", res.Status, res.Header.Get("Retry-After"))
	}
	if v, _ := metricValue(c.scrape(), "caddy_rate_limit_cost_fallbacks_total", map[string]string{"zone": "tokens"}); v != 5 {
		t.Errorf("cost_fallbacks_total = %v, want 5: the capped charge counts", v)
	}
}

// weightedSite decides a weighted zone (cost from X-Cost, 10 per hour)
// before a gate zone (20 per hour per X-Gate), which can deny after it.
const weightedSite = `http:// {
	rate_limit {
		zone weighted {
			key    {http.request.header.X-API-Key}
			events 10
			window 1h
			cost   {http.request.header.X-Cost}
		}
		zone gate {
			key    {http.request.header.X-Gate}
			events 20
			window 1h
		}
	}
	respond "ok"
}
`

func weighted(key, cost, gate string) request {
	r := request{Header: map[string]string{"X-API-Key": key, "X-Gate": gate}}
	if cost != "-" {
		r.Header["X-Cost"] = cost
	}
	return r
}

func TestWeightedCostIsRefundedAtItsCostWhenALaterZoneDenies(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", weightedSite)
	// Close gate g1 with 20 free requests (cost 0 consumes nothing).
	if got := countStatuses(c.Send(20, weighted("alice", "0", "g1"))); got[200] != 20 {
		t.Fatalf("20 requests of cost 0: %v", got)
	}
	res := c.Do(weighted("alice", "4", "g1"))
	if res.Status != 429 {
		t.Fatalf("cost 4 through a closed gate: %d, want 429", res.Status)
	}
	if !strings.Contains(res.Header.Get("RateLimit"), `"weighted";r=10`) {
		t.Errorf("RateLimit %q: the weighted zone should report its cost refunded (r=10)", res.Header.Get("RateLimit"))
	}
	if !strings.Contains(res.Header.Get("RateLimit-Policy"), `"weighted";q=10;w=3600;tally-cost`) {
		t.Errorf("RateLimit-Policy %q does not mark the weighted zone", res.Header.Get("RateLimit-Policy"))
	}
	// The refund gave back all 4: a cost of 10 still passes, then nothing.
	if got := c.Send(2, weighted("alice", "10", "g2")); fmt.Sprint(got) != "[200 429]" {
		t.Fatalf("cost 10 then 10 after the refund: %v, want [200 429]", got)
	}
	if got := c.Send(4, weighted("bob", "3", "g3")); fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("cost 3 four times at events 10: %v, want [200 200 200 429]", got)
	}
}

func TestUnusableCostsHaveTheirDocumentedOutcome(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", weightedSite)
	// Missing, non-numeric, negative, fractional: cost 1 (the literal
	// default), counted.
	for i, v := range []string{"-", "", "lots", "-3", "1.5"} {
		key := "fallback-" + strconv.Itoa(i)
		if got := countStatuses(c.Send(11, weighted(key, v, key))); got[200] != 10 || got[429] != 1 {
			t.Errorf("X-Cost %q: %v, want 10×200 (cost 1 each)", v, got)
		}
	}
	// Over the burst, representable or not: denied at once, consuming
	// nothing, with the window as Retry-After; never a 500.
	for _, v := range []string{"11", "99999999999999999999"} {
		res := c.Do(weighted("huge", v, "huge"))
		if res.Status != 429 || res.Header.Get("Retry-After") != "3600" {
			t.Errorf("X-Cost %q: %d Retry-After %q, want 429 with Retry-After 3600", v, res.Status, res.Header.Get("Retry-After"))
		}
	}
	if got := countStatuses(c.Send(11, weighted("huge", "1", "huge"))); got[200] != 10 {
		t.Errorf("after two costs over the burst: %v, want the whole 10 left", got)
	}
	if !strings.Contains(c.Output(), "request cost exceeds the zone's burst") {
		t.Error("a cost over the burst was not logged")
	}
	samples := c.scrape()
	if v, _ := metricValue(samples, "caddy_rate_limit_cost_fallbacks_total", map[string]string{"zone": "weighted"}); v != 55 {
		t.Errorf("cost_fallbacks_total = %v, want 55 (11 requests × 5 unusable values)", v)
	}
	if v, _ := metricValue(samples, "caddy_rate_limit_cost_total", map[string]string{"zone": "weighted"}); v != 60 {
		t.Errorf("cost_total = %v, want 60 (6 keys × 10)", v)
	}
}

// checkCostOverBurstReportsTheKeysReset spends 4 of alice's 10 per hour
// (1440 s of debt at 360 s a unit), then sends a cost of 11, which can never
// pass: it is denied, consuming nothing, and its RateLimit-Reset is alice's
// time to full, 1440 s, as any denial of the key reports it, not 0.
func checkCostOverBurstReportsTheKeysReset(t *testing.T, c *caddyInstance) {
	t.Helper()
	if got := c.Send(1, weighted("alice", "4", "g")); got[0] != 200 {
		t.Fatalf("cost 4: %v, want 200", got)
	}
	res := c.Do(weighted("alice", "11", "g"))
	reset, _ := strconv.Atoi(res.Header.Get("RateLimit-Reset"))
	if res.Status != 429 || res.Header.Get("Retry-After") != "3600" || reset < 1438 || reset > 1440 ||
		res.Header.Get("RateLimit-Remaining") != "0" || !strings.HasPrefix(res.Header.Get("RateLimit"), `"weighted";r=0;t=3600`) {
		t.Errorf("cost 11 over the burst after 4 spent: %d, RateLimit-Reset %q, Retry-After %q, RateLimit %q; want 429, Reset 1440 (the key's time to full), Retry-After 3600, r=0",
			res.Status, res.Header.Get("RateLimit-Reset"), res.Header.Get("Retry-After"), res.Header.Get("RateLimit"))
	}
	// A fresh key's cost over the burst: full, so Reset 0.
	if res := c.Do(weighted("bob", "11", "g")); res.Status != 429 || res.Header.Get("RateLimit-Reset") != "0" {
		t.Errorf("cost 11 for a fresh key: %d RateLimit-Reset %q, want 429 and 0", res.Status, res.Header.Get("RateLimit-Reset"))
	}
	if got := c.Send(2, weighted("alice", "6", "g")); fmt.Sprint(got) != "[200 429]" {
		t.Errorf("cost 6 twice after the denial: %v, want [200 429]: the denial consumed nothing", got)
	}
}

func TestCostOverTheBurstReportsTheKeysTimeToFull(t *testing.T) {
	t.Parallel()
	checkCostOverBurstReportsTheKeysReset(t, startCaddy(t, weightedSite))
}

// A streaming response is charged once, when it ends, and reaches the
// client as it is written.
func TestStreamingResponseIsChargedOnceWhenItEnds(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Tokens-Used", "7")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
		<-release
		fmt.Fprint(w, "data: done\n\n")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	c := startCaddy(t, loginSite(strings.TrimPrefix(srv.URL, "http://"), tokenZone, ""))

	req, _ := http.NewRequest(http.MethodGet, c.URL+"/", nil)
	req.Header.Set("Authorization", "Bearer streamer")
	resp, err := c.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	got := ""
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(got, "data: 2") {
		if time.Now().After(deadline) {
			t.Fatalf("the first events did not reach the client while the stream was open (got %q): the response is buffered", got)
		}
		n, err := resp.Body.Read(buf)
		got += string(buf[:n])
		if err != nil {
			t.Fatalf("reading the stream: %v (got %q)", err, got)
		}
	}
	if code, body := c.adminDo(http.MethodGet, keyPath("tokens", "Bearer streamer")); code != http.StatusNotFound {
		t.Fatalf("the open stream was charged already: admin API %d %s", code, body)
	}
	close(release)
	for {
		n, err := resp.Body.Read(buf)
		got += string(buf[:n])
		if err != nil {
			break
		}
	}
	if !strings.HasSuffix(got, "data: done\n\n") {
		t.Fatalf("stream %q did not end with its last event", got)
	}
	var k adminKey
	waitFor(t, 5*time.Second, "the stream to be charged", func() bool {
		code, _ := c.adminDo(http.MethodGet, keyPath("tokens", "Bearer streamer"))
		return code == http.StatusOK
	})
	c.adminJSON(keyPath("tokens", "Bearer streamer"), &k)
	if k.Remaining != 93 {
		t.Errorf("after a stream charging 7: remaining %d, want 93 (charged exactly once)", k.Remaining)
	}
}

// inFlightChargeSite counts every successful response of a key against 20
// per hour (T = 3 min), after the response; /held/* goes to the upstream
// (held at its gate, or for its hold), everything else is answered at once.
func inFlightChargeSite(u *countingUpstream) string {
	return `http:// {
	rate_limit {
		zone counted {
			key    {http.request.header.X-API-Key}
			events 20
			window 1h
			count {
				status 2xx
			}
		}
	}
	handle /held/* {
		reverse_proxy ` + u.Addr + `
	}
	respond "ok"
}
`
}

// A post-charged zone checks before and charges after: requests in flight
// when the quota runs out have all passed their check. The documented bound
// is burst + (requests in flight − 1): with 19 held and a 20th client
// sending one request after another, 39 of a burst of 20 pass, the 40th is
// denied, and every one of the 39 is charged once the held ones end.
func TestPostChargedZoneAdmitsAtMostInFlightMinusOneOverTheBurst(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	c := startCaddy(t, inFlightChargeSite(u))
	held := make([]<-chan response, 19)
	for i := range held {
		held[i] = inBackground(c, keyRequest("alice", "/held/x?gate=g"))
	}
	u.waitInFlight(19)
	if got := c.Send(21, withKey("alice")); countStatuses(got)[200] != 20 || got[20] != 429 {
		t.Fatalf("a 20th client while 19 are in flight: %v, want 20×200 then 429 (19 + 20 = 39 = burst + in flight − 1)", got)
	}
	u.open("g")
	for i, ch := range held {
		if res := <-ch; res.Status != 200 {
			t.Fatalf("held request %d: %d, want 200", i, res.Status)
		}
	}
	// All 39 charged: 39 × 3 min of debt, under the cap of two bursts.
	var k adminKey
	waitFor(t, 5*time.Second, "the held requests' charges", func() bool {
		c.adminJSON(keyPath("counted", "alice"), &k)
		return k.ResetAfter > 39*180-30
	})
	// The next request passes once 20 of the 39 intervals are paid.
	if k.ResetAfter > 39*180 || k.Remaining != 0 || k.RetryAfter > 20*180 || k.RetryAfter < 20*180-30 {
		t.Errorf("alice after 39 charges: %+v, want reset_after 7020 s (39 × 180), remaining 0, retry_after 3600 s (20 × 180)", k)
	}
}

// 20 clients at once, each sending one request after another: whatever the
// interleaving, at least the burst and at most burst + in flight − 1 pass,
// and every request that passed is charged, none lost or counted twice
// (the race-built Caddy checks the zone's shared state meanwhile).
func TestPostChargedZoneUnderTwentyConcurrentClientsStaysWithinTheInFlightBound(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	c := startCaddy(t, inFlightChargeSite(u))
	got := c.SendConcurrently(400, 20, keyRequest("bob", "/held/x?hold=5ms"), nil)
	if got[200] < 20 || got[200] > 39 || got[200]+got[429] != 400 {
		t.Fatalf("400 requests from 20 clients at burst 20: %v, want 20 to 39 ×200 (burst + in flight − 1), the rest 429", got)
	}
	var k adminKey
	c.adminJSON(keyPath("counted", "bob"), &k)
	if want := float64(got[200] * 180); k.ResetAfter > want || k.ResetAfter < want-30 {
		t.Errorf("bob after %d admitted: reset_after %.0f s, want %.0f (each admitted request charged once, 180 s each)", got[200], k.ResetAfter, want)
	}
	t.Logf("20 concurrent clients admitted %d of a burst of 20", got[200])
}

// A cost the client sets is bounded as plans are: a value below at_least
// costs at_least (X-Cost: 0 is not free), one above at_most costs at_most,
// each counted; a missing header costs the fallback, counted, with no
// warning per request; the unbounded zone is warned about once, at load.
func TestClientSetCostIsBoundedByAtLeastAndAtMost(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", `http:// {
	rate_limit {
		zone bounded {
			key    {http.request.header.X-API-Key}
			events 10
			window 1h
			cost   {http.request.header.X-Cost} 2 at_least 1 at_most 4
		}
		zone unbounded {
			key    {http.request.header.X-Other}
			events 10
			window 1h
			cost   {http.request.header.X-Other-Cost}
		}
	}
	respond "ok"
}
`)
	bounded := func(key, cost string) request {
		r := request{Header: map[string]string{"X-API-Key": key, "X-Other": key}}
		if cost != "-" {
			r.Header["X-Cost"] = cost
		}
		return r
	}
	if got := countStatuses(c.Send(11, bounded("zero", "0"))); got[200] != 10 || got[429] != 1 {
		t.Errorf("X-Cost 0 at_least 1, 10 per hour: %v, want 10×200 then 429 (cost 1 each, not free)", got)
	}
	if got := countStatuses(c.Send(3, bounded("huge", "9"))); got[200] != 2 || got[429] != 1 {
		t.Errorf("X-Cost 9 at_most 4, 10 per hour: %v, want 2×200 then 429 (cost 4 each)", got)
	}
	if got := countStatuses(c.Send(6, bounded("missing", "-"))); got[200] != 5 || got[429] != 1 {
		t.Errorf("no X-Cost, fallback 2, 10 per hour: %v, want 5×200 then 429", got)
	}
	samples := c.scrape()
	if v, _ := metricValue(samples, "caddy_rate_limit_cost_fallbacks_total", map[string]string{"zone": "bounded"}); v != 11+3+6 {
		t.Errorf("cost_fallbacks_total = %v, want 20 (11 below at_least, 3 above at_most, 6 missing)", v)
	}
	out := c.Output()
	if strings.Contains(out, "request cost is empty or invalid") {
		t.Errorf("a missing cost header was logged per request; the counter is enough:\n%s", tail(out, 20))
	}
	var warned []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "with no floor") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], `"zone":"unbounded"`) {
		t.Errorf("want one warning at load for zone unbounded's cost with no floor, got %q", warned)
	}
}
