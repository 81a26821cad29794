package tests

// Bans in strict mode (issue 24): written by the denying script step, seen
// by every instance from its next decision, answered locally after that,
// lifted everywhere by one reset, held through a Redis outage.

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

const banZone = `		zone login {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
			ban 1h
			fail_policy open
		}`

func TestStrictBanIsFleetWideAndLiftedEverywhere(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	fleet := startFleet(t, 3, rs.Addr, banZone)
	a, b, c := fleet[0], fleet[1], fleet[2]
	r := withKey("mallory")
	if got := a.Send(4, r); got[2] != 200 || got[3] != 429 {
		t.Fatalf("on A: %v, want 3 allowed and the 4th denied", got)
	}
	for _, inst := range []*caddyInstance{a, b, c} {
		res := inst.Do(r)
		if ra := retryAfter(t, res); res.Status != 429 || ra < 3599 || ra > 3600 {
			t.Fatalf("%s: %d Retry-After %d, want the 1h ban at once", inst.URL, res.Status, ra)
		}
	}
	logEveryCommand(t, rs)
	counts := sendAcross(t, fleet, 300, 16, r, 5*time.Second)
	if counts[429] != 300 {
		t.Fatalf("flood of the banned key: %v, want 300×429", counts)
	}
	// Heartbeats and override polls are scripts too, about no key.
	if calls := scriptsLogged(t, rs, ":mallory"); len(calls) > 0 {
		t.Fatalf("a flood of 300 banned requests ran %d scripts about the key: bans must be answered locally:\n%s", len(calls), strings.Join(calls, "\n"))
	}
	if ttl := rs.Client().PTTL(t.Context(), "tally:login:mallory").Val(); ttl < 59*time.Minute {
		t.Errorf("the banned key's TTL is %v, want the ban's end (1h)", ttl)
	}

	// The admin API: the key's ban on an instance that did not start it,
	// the fleet's bans list, the CLI, the metric, top offenders.
	var k struct {
		BannedFor float64 `json:"banned_for"`
		BanLevel  int     `json:"ban_level"`
	}
	b.adminJSON(keyPath("login", "mallory"), &k)
	if k.BannedFor < 3590 || k.BanLevel != 1 {
		t.Errorf("GET of the key on B: banned_for %v level %d, want ~3600 and 1", k.BannedFor, k.BanLevel)
	}
	type bansList struct {
		View string `json:"view"`
		Bans []struct {
			Key       string  `json:"key"`
			BannedFor float64 `json:"banned_for"`
		} `json:"bans"`
	}
	listed := func(inst *caddyInstance) bansList {
		var l bansList
		inst.adminJSON("/rate_limit/zones/login/bans", &l)
		return l
	}
	waitFor(t, 2*time.Second, "the ban in C's list", func() bool {
		l := listed(c)
		return l.View == "fleet" && len(l.Bans) == 1 && l.Bans[0].Key == "mallory" && l.Bans[0].BannedFor > 3590
	})
	rs.requireEveryKeyExpires(t, 2) // the key and the bans list
	if out := rateLimitCLI(t, c, "bans", "login").ok(t, "bans"); len(out) != 2 || !strings.Contains(out[0], "1 banned fleet-wide") || !strings.Contains(out[1], `"mallory"`) {
		t.Errorf("caddy rate-limit bans login: %q", out)
	}
	if v, _ := metricValue(a.scrape(), "caddy_rate_limit_bans_total", map[string]string{"zone": "login"}); v != 1 {
		t.Errorf("caddy_rate_limit_bans_total on A = %v, want 1", v)
	}
	if v, _ := metricValue(b.scrape(), "caddy_rate_limit_banned_keys", map[string]string{"zone": "login"}); v != 1 {
		t.Errorf("caddy_rate_limit_banned_keys on B = %v, want 1", v)
	}
	var top struct {
		Keys []struct {
			Key       string  `json:"key"`
			BannedFor float64 `json:"banned_for"`
		} `json:"keys"`
	}
	a.adminJSON("/rate_limit/zones/login/top", &top)
	if len(top.Keys) == 0 || top.Keys[0].Key != "mallory" || top.Keys[0].BannedFor < 3590 {
		t.Errorf("top offenders on A: %+v, want mallory banned", top.Keys)
	}

	if status, body := c.adminDo(http.MethodDelete, keyPath("login", "mallory")); status != http.StatusNoContent {
		t.Fatalf("DELETE on C: %d %s", status, body)
	}
	lifted := time.Now()
	for _, inst := range []*caddyInstance{a, b, c} {
		waitFor(t, time.Second-time.Since(lifted), "the ban lifted on "+inst.URL, func() bool { return inst.Do(withKey("mallory")).Status == 200 })
	}
	if l := listed(a); len(l.Bans) != 0 {
		t.Errorf("bans list after the DELETE: %+v", l.Bans)
	}

	// A ban an instance knows holds through a Redis outage, even under
	// fail_policy open.
	for a.Do(r).Status == 200 {
	}
	if got := b.Do(r).Status; got != 429 { // B learns the ban from Redis
		t.Fatalf("B after the second ban: %d", got)
	}
	rs.Kill()
	for _, inst := range []*caddyInstance{a, b} {
		res := inst.Do(r)
		if res.Status != 429 {
			t.Fatalf("%s during the outage: %d, want the known ban to hold", inst.URL, res.Status)
		}
	}
	if got := a.Do(withKey("someone-else")).Status; got != 200 {
		t.Errorf("another key during the outage under fail_policy open: %d, want 200", got)
	}

	// And once Redis is back without its data: subscribing to resets again
	// drops the instances' deny caches (resets may have been missed), not
	// the bans they know, which Redis no longer holds.
	rs.Start()
	waitFor(t, 10*time.Second, "the fleet subscribed to resets again", func() bool {
		return rs.Client().PubSubNumSub(t.Context(), "tally:resets").Val()["tally:resets"] >= 3
	})
	for watch := time.Now().Add(time.Second); time.Now().Before(watch); {
		for _, inst := range []*caddyInstance{a, b} {
			if res := inst.Do(r); res.Status != 429 {
				t.Fatalf("%s after Redis came back empty: %d, want the known ban to hold", inst.URL, res.Status)
			}
		}
	}
}

// Async mode: the other instances learn a ban from the zone's bans list
// within one sync interval and two round trips (seen here in the admin API,
// without a request of the key there, which could start a ban of its own);
// one DELETE lifts it on every instance, and no instance learns it back.
func TestAsyncBanReachesTheFleetWithinASync(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	fleet := startAsyncFleet(t, 3, rs.Addr, "100ms", banZone)
	a, b, c := fleet[0], fleet[1], fleet[2]
	r := withKey("mallory")
	for a.Do(r).Status == 200 {
	}
	started := time.Now()
	bannedFor := func(inst *caddyInstance) (float64, int) {
		var k struct {
			BannedFor float64 `json:"banned_for"`
			BanLevel  int     `json:"ban_level"`
		}
		if status, body := inst.adminDo(http.MethodGet, keyPath("login", "mallory")); status == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &k); err != nil {
				t.Fatal(err)
			}
		}
		return k.BannedFor, k.BanLevel
	}
	// The bound: 100ms + two round trips; 1s leaves the race-built
	// binaries room on a loaded machine.
	for _, inst := range []*caddyInstance{b, c} {
		waitFor(t, time.Second-time.Since(started), "the ban known on "+inst.URL, func() bool {
			left, level := bannedFor(inst)
			return left > 3590 && level == 1
		})
	}
	t.Logf("the ban reached B and C %v after it started", time.Since(started).Round(time.Millisecond))
	if res := b.Do(r); res.Status != 429 || retryAfter(t, res) < 3590 {
		t.Fatalf("B: %d, want the ban", res.Status)
	}
	if status, body := c.adminDo(http.MethodDelete, keyPath("login", "mallory")); status != http.StatusNoContent {
		t.Fatalf("DELETE on C: %d %s", status, body)
	}
	lifted := time.Now()
	for _, inst := range []*caddyInstance{a, b, c} {
		waitFor(t, time.Second-time.Since(lifted), "the ban lifted on "+inst.URL, func() bool { left, _ := bannedFor(inst); return left == 0 })
	}
	time.Sleep(300 * time.Millisecond) // three reads of the list
	for _, inst := range []*caddyInstance{a, b, c} {
		if left, _ := bannedFor(inst); left != 0 {
			t.Errorf("%s banned again after the lift", inst.URL)
		}
		if got := inst.Do(r).Status; got != 200 {
			t.Errorf("%s after the lift: %d", inst.URL, got)
		}
	}
	rs.requireEveryKeyExpires(t, 1)
}
