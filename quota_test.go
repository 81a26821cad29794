package ratelimit

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

func testQuotaZone(name string, n int64) *httpZone {
	cfg := zones.Config{Name: name, Quota: n, Period: algorithms.Day}
	return &httpZone{Zone: mustZone(cfg, nil, nil)}
}

// A quota zone's fields: q the quota, w the period it was counted in (a
// 23-hour day too), r what is left, t the seconds to the boundary only
// once nothing is left; RateLimit-Reset and Retry-After the boundary.
func TestHeadersOfAQuotaZone(t *testing.T) {
	daily := testQuotaZone("daily", 1000)
	perMin := testZone("z", 10, time.Minute, 0)
	day, short := 24*time.Hour, 23*time.Hour
	tests := []struct {
		name    string
		tickets []ticket
		denied  bool
		policy  string
		state   string
		legacy  [3]string
		retry   string
	}{
		{"quota left: no t, Reset at the boundary",
			[]ticket{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 990, ResetAfter: 3*time.Hour + time.Millisecond, Period: day}}}, false,
			`"daily";q=1000;w=86400`, `"daily";r=990`, [3]string{"1000", "990", "10801"}, ""},
		{"the last unit: t is the boundary",
			[]ticket{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 0, ResetAfter: 3 * time.Hour, Period: day}}}, false,
			`"daily";q=1000;w=86400`, `"daily";r=0;t=10800`, [3]string{"1000", "0", "10800"}, ""},
		{"denied: t and Retry-After are the boundary",
			[]ticket{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{RetryAfter: 90 * time.Second, ResetAfter: 90 * time.Second, Period: short}}}, true,
			`"daily";q=1000;w=82800`, `"daily";r=0;t=90`, [3]string{"1000", "0", "90"}, "90"},
		{"a weighted request denied with units left: r=0, t and Retry-After the boundary",
			[]ticket{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{RetryAfter: 90 * time.Second, ResetAfter: 90 * time.Second, Period: day}}}, true,
			`"daily";q=1000;w=86400`, `"daily";r=0;t=90`, [3]string{"1000", "0", "90"}, "90"},
		{"a rate zone denies beside a quota with units left",
			[]ticket{
				{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{RetryAfter: 2 * time.Second, ResetAfter: 56 * time.Second}},
				{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 990, ResetAfter: 3 * time.Hour, Period: day}},
			}, true,
			`"z";q=10;w=60, "daily";q=1000;w=86400`, `"z";r=0;t=2, "daily";r=990`, [3]string{"10", "0", "56"}, "2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range []*Handler{{}, {rendered: new(renderCache), values: newValueCache()}} {
				hdr := http.Header{}
				h.setHeaders(hdr, tc.tickets, tc.denied, tc.tickets[0].Decision.RetryAfter)
				if got := hdr.Get("RateLimit-Policy"); got != tc.policy {
					t.Errorf("RateLimit-Policy = %q, want %q", got, tc.policy)
				}
				if got := hdr.Get("RateLimit"); got != tc.state {
					t.Errorf("RateLimit = %q, want %q", got, tc.state)
				}
				if got := [3]string{hdr.Get("RateLimit-Limit"), hdr.Get("RateLimit-Remaining"), hdr.Get("RateLimit-Reset")}; got != tc.legacy {
					t.Errorf("legacy trio = %v, want %v", got, tc.legacy)
				}
				if got := hdr.Get("Retry-After"); got != tc.retry {
					t.Errorf("Retry-After = %q, want %q", got, tc.retry)
				}
			}
		})
	}
	// The render cache tells a 23-hour day from a 24-hour one.
	h := &Handler{rendered: new(renderCache), values: newValueCache()}
	for _, p := range []time.Duration{day, short, day} {
		hdr := http.Header{}
		h.setHeaders(hdr, []ticket{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 5, ResetAfter: time.Hour, Period: p}}}, false, 0)
		if want := `"daily";q=1000;w=` + strconv.Itoa(int(p/time.Second)); hdr.Get("RateLimit-Policy") != want {
			t.Errorf("RateLimit-Policy = %q, want %q", hdr.Get("RateLimit-Policy"), want)
		}
	}
}
