package tests

// Bans in strict mode (issue 24): written by the denying script step, seen
// by every instance from its next decision, answered locally after that,
// lifted everywhere by one reset, held through a Redis outage.

import (
	"net/http"
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
	before := evalCalls(t, rs)
	start := time.Now()
	counts := sendAcross(t, fleet, 300, 16, r, 5*time.Second)
	elapsed := time.Since(start)
	if counts[429] != 300 {
		t.Fatalf("flood of the banned key: %v, want 300×429", counts)
	}
	// The heartbeats are scripts too: each instance beats once a second.
	if d, allowance := evalCalls(t, rs)-before, int64(3*(int(elapsed/time.Second)+2)); d > allowance {
		t.Fatalf("a flood of 300 banned requests ran %d scripts in %v (heartbeats: at most %d): bans must be answered locally", d, elapsed, allowance)
	}
	rs.requireEveryKeyExpires(t, 1)
	if ttl := rs.Client().PTTL(t.Context(), "tally:login:mallory").Val(); ttl < 59*time.Minute {
		t.Errorf("the banned key's TTL is %v, want the ban's end (1h)", ttl)
	}

	if status, body := c.adminDo(http.MethodDelete, keyPath("login", "mallory")); status != http.StatusNoContent {
		t.Fatalf("DELETE on C: %d %s", status, body)
	}
	lifted := time.Now()
	for _, inst := range []*caddyInstance{a, b, c} {
		waitFor(t, time.Second-time.Since(lifted), "the ban lifted on "+inst.URL, func() bool { return inst.Do(withKey("mallory")).Status == 200 })
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
}
