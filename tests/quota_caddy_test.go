package tests

// Calendar quotas through a real Caddy: `quota 3 per minute` across a
// minute's boundary (local, strict and async), exact across three strict
// instances, async within its bound, Redis killed under each fail policy,
// a token quota charged from an upstream header, and the admin API's and
// CLI's view of a key.
//
// Tests that cross a boundary wait for one by polling the clock (the
// machine's, which Caddy and redis-server share): they start a few seconds
// before a minute ends, so that each takes at most a minute and usually
// half of one, and run in parallel.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// toNextMinute is the time left in the current minute.
func toNextMinute() time.Duration {
	now := time.Now()
	return now.Truncate(time.Minute).Add(time.Minute).Sub(now)
}

// waitForMinuteEnd waits until the current minute has between lo and hi
// left, polling the clock.
func waitForMinuteEnd(t *testing.T, lo, hi time.Duration) {
	t.Helper()
	waitFor(t, 70*time.Second, fmt.Sprintf("a minute with %v to %v left", lo, hi), func() bool {
		left := toNextMinute()
		return left >= lo && left <= hi
	})
}

// waitForNextMinute waits until the minute that was current at from has
// ended.
func waitForNextMinute(t *testing.T, from time.Time) {
	t.Helper()
	end := from.Truncate(time.Minute).Add(time.Minute)
	waitFor(t, 70*time.Second, "the minute's end", func() bool { return !time.Now().Before(end) })
}

// checkRetryAfterIsTheMinutesEnd requires a 429 whose Retry-After is the
// seconds to the next minute (±1) at some instant of the request (a loaded
// machine takes a while to answer it) and whose RateLimit field says the
// same.
func checkRetryAfterIsTheMinutesEnd(t *testing.T, res response, zone string) {
	t.Helper()
	left := toNextMinute()
	if res.Status != 429 {
		t.Fatalf("status %d, want 429 (headers %v)", res.Status, res.Header)
	}
	ra, err := strconv.Atoi(res.Header.Get("Retry-After"))
	lo, hi := int(math.Ceil(left.Seconds()))-1, int(math.Ceil((left+res.Elapsed).Seconds()))+1
	if err != nil || ra < lo || ra > hi {
		t.Fatalf("Retry-After %q with %v left in the minute after a request of %v, want %d to %d", res.Header.Get("Retry-After"), left, res.Elapsed, lo, hi)
	}
	if got, want := res.Header.Get("RateLimit"), fmt.Sprintf(`"%s";r=0;t=%d`, zone, ra); got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if got := res.Header.Get("RateLimit-Policy"); got != fmt.Sprintf(`"%s";q=3;w=60`, zone) {
		t.Errorf("RateLimit-Policy %q", got)
	}
}

// checkThreePerMinute sends 3 requests for a fresh key a few seconds before
// a minute ends (allowed), a 4th (denied until the minute's end), then,
// after the boundary, 3 more (allowed) and a 4th (denied).
func checkThreePerMinute(t *testing.T, send func(i int) response, zone string) {
	t.Helper()
	waitForMinuteEnd(t, 4*time.Second, 12*time.Second)
	start := time.Now()
	for i := range 3 {
		res := send(i)
		if res.Status != 200 {
			t.Fatalf("request %d: %d, want 200", i+1, res.Status)
		}
		if got, want := res.Header.Get("RateLimit-Remaining"), strconv.Itoa(2-i); got != want {
			t.Errorf("request %d: RateLimit-Remaining %q, want %s", i+1, got, want)
		}
	}
	checkRetryAfterIsTheMinutesEnd(t, send(3), zone)
	if time.Now().Truncate(time.Minute) != start.Truncate(time.Minute) {
		t.Fatal("the minute ended during the first four requests: the machine is too slow for this test")
	}
	waitForNextMinute(t, start)
	for i := range 3 {
		if res := send(4 + i); res.Status != 200 {
			t.Fatalf("next minute, request %d: %d, want 200", i+1, res.Status)
		}
	}
	checkRetryAfterIsTheMinutesEnd(t, send(7), zone)
}

const threePerMinute = `
		zone calls {
			key    {http.request.header.X-API-Key}
			quota  3 per minute
		}`

func TestQuotaThreePerMinuteAcrossTheBoundary(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	for _, mode := range []struct{ name, distributed string }{
		{"local", ""},
		// A timeout of 2s: the default 50ms (an async view stale after
		// 300ms) is a loaded machine's Redis round trip, and the fail
		// policy's answer is not what is tested.
		{"strict", "\n\t\tdistributed {\n\t\t\tredis redis://" + srv.Addr + "\n\t\t\ttimeout 2s\n\t\t}"},
		{"async", "\n\t\tdistributed {\n\t\t\tredis redis://" + srv.Addr + "\n\t\t\tmode async\n\t\t\tsync_interval 100ms\n\t\t\ttimeout 2s\n\t\t}"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			c := startCaddy(t, `http:// {
	rate_limit {`+threePerMinute+mode.distributed+`
	}
	respond "ok"
}
`)
			key := "alice-" + mode.name
			checkThreePerMinute(t, func(int) response { return c.Do(withKey(key)) }, "calls")
		})
	}
}

// quotaKey is a quota zone's key as the admin API shows it.
type quotaKey struct {
	Zone        string  `json:"zone"`
	Used        int64   `json:"used"`
	Quota       int64   `json:"quota"`
	Remaining   int64   `json:"remaining"`
	Per         string  `json:"per"`
	TimeZone    string  `json:"time_zone"`
	PeriodStart string  `json:"period_start"`
	PeriodEnd   string  `json:"period_end"`
	RetryAfter  float64 `json:"retry_after"`
	ResetAfter  float64 `json:"reset_after"`
	Source      string  `json:"source"`
}

// Three strict instances, 64 concurrent clients, one key: exactly the
// quota is admitted; every instance's admin API reads the same use and the
// month's end in Berlin time; every Redis key expires by its period's end.
func TestQuotaIsExactAcrossStrictInstances(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	const quota = 200
	// The timeout is raised from its 20ms default, as in
	// TestStrictModeIsExactAcrossThreeInstances: on a loaded 2-core machine a
	// race-built Caddy can wait longer than 20ms for a reply whose script did
	// run, and the fail policy's 429 for a counted request is not what this
	// test is about.
	fleet := startFleet(t, 3, srv.Addr+`
			timeout 2s`, `
		zone monthly {
			key    {http.request.header.X-API-Key}
			quota  `+strconv.Itoa(quota)+` per month Europe/Berlin
		}`)
	counts := sendAcross(t, fleet, 3*quota, 64, withKey("shared"), 5*time.Second)
	if counts[200] != quota || counts[429] != 2*quota {
		t.Fatalf("statuses %v, want exactly %d×200 and %d×429", counts, quota, 2*quota)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	now := time.Now().In(berlin)
	wantEnd := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, berlin).Format(time.RFC3339)
	for i, c := range fleet {
		var k quotaKey
		c.adminJSON(keyPath("monthly", "shared"), &k)
		if k.Used != quota || k.Remaining != 0 || k.Quota != quota || k.PeriodEnd != wantEnd || k.Source != "redis" || k.RetryAfter <= 0 {
			t.Errorf("instance %d: key %+v, want %d used, none left, period end %s", i, k, quota, wantEnd)
		}
		if !strings.HasSuffix(k.PeriodEnd, "+01:00") && !strings.HasSuffix(k.PeriodEnd, "+02:00") {
			t.Errorf("period_end %q is not in Berlin's offset", k.PeriodEnd)
		}
	}
	// The CLI prints it.
	out := strings.Join(rateLimitCLI(t, fleet[0], "key", "monthly", "shared").ok(t, "caddy rate-limit key"), "\n")
	if want := fmt.Sprintf(`zone monthly, key "shared": LIMITED, %d of %d used, 0 remaining until %s`, quota, quota, wantEnd); !strings.Contains(out, want) {
		t.Errorf("caddy rate-limit key printed %q, want %q", out, want)
	}
	// The denials are the instance's top offenders.
	var top struct {
		Keys []struct {
			Key     string `json:"key"`
			Denials uint64 `json:"denials"`
			Limited bool   `json:"limited"`
		} `json:"keys"`
	}
	fleet[0].adminJSON("/rate_limit/zones/monthly/top", &top)
	if len(top.Keys) != 1 || top.Keys[0].Key != "shared" || top.Keys[0].Denials == 0 || !top.Keys[0].Limited {
		t.Errorf("top offenders %+v, want the shared key, limited", top.Keys)
	}
	srv.requireEveryKeyExpires(t, 1)
	// A reset on one instance gives the key its quota back on all.
	if code, body := fleet[1].adminDo("DELETE", keyPath("monthly", "shared")); code != 204 {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	for i, c := range fleet {
		waitFor(t, 5*time.Second, fmt.Sprintf("instance %d to admit the reset key", i), func() bool { return c.Do(withKey("shared")).Status == 200 })
	}
}

// Three async instances, 64 concurrent clients, one key: leases are taken
// from the period's count before they are spent, so the fleet admits at
// most the quota, exactly (docs/async.md's bound: n per period, every
// admission out of a lease Redis counted), and at most a lease per instance
// (⌈quota/(16·3)⌉ beyond the request) less while the instances still hold
// leases. A request whose lease call times out goes to the fail policy,
// which the bound leaves out: with the default timeout (50 ms) a loaded
// machine timed out 1 to 4 lease calls in some runs, and each run's
// overshoot (201 to 204) was exactly its fail-policy decisions. The timeout
// is 2 s, as in the strict fleet's test, and the test says so if the fail
// policy still decided.
func TestQuotaAsyncFleetStaysWithinItsBound(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	const quota, instances = 200, 3
	fleet := startAsyncFleet(t, instances, srv.Addr+`
			timeout 2s`, "100ms", `
		zone monthly {
			key    {http.request.header.X-API-Key}
			quota  `+strconv.Itoa(quota)+` per month
		}`)
	for _, c := range fleet {
		waitFor(t, 10*time.Second, "each instance to see the fleet", func() bool {
			_, n := asyncZoneStore(t, c, "monthly")
			return n == instances
		})
	}
	counts := sendAcross(t, fleet, 3*quota, 64, withKey("shared"), 5*time.Second)
	t.Logf("statuses %v", counts)
	for i, c := range fleet {
		if n, _ := metricValue(c.scrape(), "caddy_rate_limit_fail_policy_total", map[string]string{"zone": "monthly"}); n != 0 {
			t.Errorf("instance %d: the fail policy decided %v requests (a lease call failed or took over 2 s): the bound below leaves them out", i, n)
		}
	}
	lease := (quota + quotaLeaseDivisor*instances - 1) / (quotaLeaseDivisor * instances) // ⌈n/(16·N)⌉
	atMost, atLeast := quota, quota-instances*(lease+1)
	if counts[200] > atMost || counts[200] < atLeast || counts[200]+counts[429] != 3*quota {
		t.Fatalf("statuses %v, want at most %d×200 (and at least %d) and the rest 429", counts, atMost, atLeast)
	}
	srv.requireEveryKeyExpires(t, 1)
}

// quotaLeaseDivisor is distributed's: a lease is at most ⌈n/(16·N)⌉ units
// beyond the request that took it (docs/async.md).
const quotaLeaseDivisor = 16

// A token quota: each response says what it used, charged after it; the
// key is let through while units remain, so it ends the minute in debt by
// at most one charge, is denied until the boundary, and starts afresh then.
func TestQuotaOfTokensChargedFromTheUpstream(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	for _, mode := range []struct{ name, distributed string }{
		{"local", ""},
		{"strict", "\n\t\tdistributed {\n\t\t\tredis redis://" + srv.Addr + "\n\t\t}"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			upstream, hits := tokenUpstream(t)
			c := startCaddy(t, loginSite(upstream, `
		zone tokens {
			key    {http.request.header.X-API-Key}
			quota  1000 per minute
			charge {http.response.header.X-Tokens-Used} 1
		}`, mode.distributed))
			key := "llm-" + mode.name
			use := func(tokens int) response {
				return c.Do(request{Header: map[string]string{"X-API-Key": key, "X-Use": strconv.Itoa(tokens)}})
			}
			waitForMinuteEnd(t, 4*time.Second, 12*time.Second)
			start := time.Now()
			before := hits.Load()
			for i, tokens := range []int{400, 400, 300} {
				if res := use(tokens); res.Status != 200 {
					t.Fatalf("request %d (%d tokens): %d, want 200", i+1, tokens, res.Status)
				}
			}
			// 1100 used: denied until the minute's end without reaching
			// the upstream. The charge lands a round trip after the
			// response in strict mode: poll for it.
			var res response
			waitFor(t, 2*time.Second, "the last charge to count", func() bool {
				res = use(1)
				return res.Status == 429
			})
			if hits.Load()-before > 4 {
				t.Errorf("%d requests reached the upstream, want the 3 charged (and at most one before the last charge landed)", hits.Load()-before)
			}
			left := toNextMinute()
			if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); math.Abs(float64(ra)-math.Ceil(left.Seconds())) > 1 {
				t.Errorf("Retry-After %q with %v left in the minute", res.Header.Get("Retry-After"), left)
			}
			var k quotaKey
			c.adminJSON(keyPath("tokens", key), &k)
			if k.Used != 1100 || k.Remaining != 0 {
				t.Errorf("key %+v, want 1100 used (the quota and one charge)", k)
			}
			waitForNextMinute(t, start)
			res = use(999)
			if res.Status != 200 {
				t.Fatalf("after the boundary: %d, want 200", res.Status)
			}
			if got := res.Header.Get("RateLimit-Policy"); got != `"tokens";q=1000;w=60;tally-cost;tally-post-charged` {
				t.Errorf("RateLimit-Policy %q", got)
			}
		})
	}
}

// Redis killed under each fail policy: open admits, closed denies with a
// short Retry-After, local enforces this instance's share starting from
// what the key had used in Redis. Never a 5xx, never slower than the
// timeout.
func TestQuotaFailPoliciesWhenRedisDies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy       string
		after        int // requests allowed of 10 once Redis is gone
		retryAfter   string
		denialStatus int
	}{
		{"open", 10, "", 0},
		{"closed", 0, "1", 429},
		{"local", 6, "", 429}, // quota 10, 4 used through Redis, one instance
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			srv := startRedis(t)
			c := startCaddy(t, distributedSite(srv.Addr, `
		zone daily {
			key         {http.request.header.X-API-Key}
			quota       10 per day
			fail_policy `+tc.policy+`
		}`, "\t\t\ttimeout 100ms"))
			for i := range 4 {
				if res := c.Do(withKey("k")); res.Status != 200 {
					t.Fatalf("request %d with Redis up: %d", i+1, res.Status)
				}
			}
			srv.Kill()
			allowed := 0
			for i := range 10 {
				res := c.Do(withKey("k"))
				switch {
				case res.Status == 200:
					allowed++
				case res.Status != 429:
					t.Fatalf("request %d with Redis down: %d, want 200 or 429", i+1, res.Status)
				case tc.retryAfter != "" && res.Header.Get("Retry-After") != tc.retryAfter:
					t.Errorf("Retry-After %q, want %q", res.Header.Get("Retry-After"), tc.retryAfter)
				}
				if res.Elapsed > 2*time.Second {
					t.Errorf("request %d took %v with Redis down", i+1, res.Elapsed)
				}
			}
			if allowed != tc.after {
				t.Fatalf("%d of 10 allowed with Redis down, want %d", allowed, tc.after)
			}
		})
	}
}

// Quotas per plan: a map of the customer's plan sets each request's
// quota; a quota the client sends is bounded by at_most, beyond which it
// falls back; the admin API reads the key under the plan it last had.
func TestQuotaPerPlan(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	map {http.request.header.X-Plan} {plan_quota} {
		pro 5
		default 2
	}
	@bounded path /bounded
	rate_limit @bounded {
		zone bounded {
			key   {http.request.header.X-API-Key}
			quota {http.request.header.X-Quota} 3 at_most 4 per month
		}
	}
	rate_limit {
		zone monthly {
			key   {http.request.header.X-API-Key}
			quota {plan_quota} 2 per month
		}
	}
	respond "ok"
}
`)
	send := func(path, key string, hdr map[string]string) []int {
		h := map[string]string{"X-API-Key": key}
		for k, v := range hdr {
			h[k] = v
		}
		return c.Send(7, request{Path: path, Header: h})
	}
	count := func(statuses []int) int {
		n := 0
		for _, s := range statuses {
			if s == 200 {
				n++
			}
		}
		return n
	}
	if n := count(send("/", "pro-key", map[string]string{"X-Plan": "pro"})); n != 5 {
		t.Errorf("pro plan: %d of 7 allowed, want 5", n)
	}
	if n := count(send("/", "free-key", nil)); n != 2 {
		t.Errorf("default plan: %d of 7 allowed, want 2", n)
	}
	var k quotaKey
	c.adminJSON(keyPath("monthly", "pro-key"), &k)
	if k.Quota != 5 || k.Used != 5 || k.Remaining != 0 {
		t.Errorf("pro key %+v, want 5 of 5 used", k)
	}
	// The bounded zone: 4 is within at_most, 100 is not and falls back to 3.
	if n := count(send("/bounded", "b-within", map[string]string{"X-Quota": "4", "X-Plan": "pro"})); n != 4 {
		t.Errorf("X-Quota 4: %d of 7 allowed, want 4", n)
	}
	if n := count(send("/bounded", "b-beyond", map[string]string{"X-Quota": "100", "X-Plan": "pro"})); n != 3 {
		t.Errorf("X-Quota 100 (at_most 4): %d of 7 allowed, want the fallback 3", n)
	}
}
