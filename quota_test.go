package ratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// The syntax, as written.
func TestCaddyfileQuotaSyntax(t *testing.T) {
	// (Caddy takes the matcher, /v1/*, off the line before the handler sees it.)
	h, err := parse(t, `rate_limit {
	zone monthly_calls {
		key {http.request.header.X-API-Key}
		quota {plan_quota} 100000 per month Europe/Berlin   # placeholder + fallback, or a literal
	}
	zone daily_tokens {
		key {http.request.header.X-API-Key}
		quota 1000000 per day                               # UTC by default
		charge {http.response.header.X-Tokens-Used} 1000
	}
	zone per_plan {
		key {http.request.header.X-API-Key}
		quota {plan_quota} per week
		cost 2
	}
	zone bounded {
		key {http.request.header.X-API-Key}
		quota {http.request.header.X-Quota} 100 at_most 5000 per hour America/New_York
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]Quota{
		"monthly_calls": {Limit: 100000, LimitPlaceholder: "{plan_quota}", Per: "month", TimeZone: "Europe/Berlin"},
		"daily_tokens":  {Limit: 1000000, Per: "day"},
		"per_plan":      {LimitPlaceholder: "{plan_quota}", Per: "week"},
		"bounded":       {Limit: 100, LimitPlaceholder: "{http.request.header.X-Quota}", LimitAtMost: 5000, Per: "hour", TimeZone: "America/New_York"},
	} {
		z := h.RateLimits[name]
		if z == nil || z.Quota == nil || *z.Quota != want {
			t.Errorf("zone %s: quota %+v, want %+v", name, z.Quota, want)
		}
	}
	if z := h.RateLimits["daily_tokens"]; z.Charge != "{http.response.header.X-Tokens-Used}" || z.Cost != 1000 {
		t.Errorf("daily_tokens: charge %q fallback %d", z.Charge, z.Cost)
	}
}

func TestCaddyfileQuotaErrorsNameTheLineAndTheFix(t *testing.T) {
	zone := func(body string) string {
		return "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n" + body + "\n\t}\n}"
	}
	tests := []struct {
		name, input string
		line        int
		want        string
	}{
		{"quota and events", zone("\t\tquota 5 per day\n\t\tevents 5"), 5, "a zone has either a quota or a rate: remove events, window and burst, or put the rate in a zone of its own"},
		{"events and quota", zone("\t\twindow 1m\n\t\tquota 5 per day"), 5, "a zone has either a quota or a rate"},
		{"quota and concurrency", zone("\t\tquota 5 per day\n\t\tconcurrency 2"), 5, "a zone has either a quota or a concurrency limit"},
		{"no period", zone("\t\tquota 5"), 4, "quota needs a number and a period: quota <n> per minute|hour|day|week|month [<time zone>]"},
		{"unknown period", zone("\t\tquota 5 per year"), 4, `unknown period "year": use minute, hour, day, week or month`},
		{"unknown time zone", zone("\t\tquota 5 per day Europe/Atlantis"), 4, `unknown time zone "Europe/Atlantis": use an IANA name such as Europe/Berlin`},
		{"Local time zone", zone("\t\tquota 5 per day Local"), 4, "differs from machine to machine"},
		{"zero quota", zone("\t\tquota 0 per day"), 4, "quota must be a whole number from 1 to 1099511627776"},
		{"quota over 2^40", zone("\t\tquota 1099511627777 per day"), 4, "quota must be a whole number from 1 to 1099511627776"},
		{"bad fallback", zone("\t\tquota {plan} lots per day"), 4, `quota must be a whole number from 1 to 1099511627776, not "lots"`},
		{"fallback of a literal", zone("\t\tquota 5 6 per day"), 4, "only a placeholder takes a fallback"},
		{"two placeholders", zone("\t\tquota {a}{b} per day"), 4, "quota takes a number or one placeholder"},
		{"extra words", zone("\t\tquota 5 per day UTC please"), 4, "quota needs a number and a period"},
		{"quota twice", zone("\t\tquota 5 per day\n\t\tquota 6 per day"), 5, "quota is given twice"},
		{"cost over the quota", zone("\t\tquota 5 per day\n\t\tcost 6"), 5, "cost 6 is more than the quota (5)"},
		{"lease on a quota", zone("\t\tquota 5 per day\n\t\tlease 5s"), 5, "a zone has either a quota or a concurrency limit"},
		{"at_most on a literal", zone("\t\tquota 5 at_most 10 per day"), 4, "quota at_most bounds the values of a placeholder"},
		{"fallback beyond at_most", zone("\t\tquota {plan} 50 at_most 10 per day"), 4, "quota at_most 10 is less than the fallback, 50"},
		{"bad at_most", zone("\t\tquota {plan} 5 at_most many per day"), 4, `quota at_most must be a whole number from 1 to 1099511627776, not "many"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.input)
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.input)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not say %q", msg, tc.want)
			}
			if want := "Testfile:" + strconv.Itoa(tc.line); !strings.Contains(msg, want) {
				t.Errorf("error %q does not name line %d", msg, tc.line)
			}
		})
	}
}

func testQuotaZone(name string, n int64) *zoneHandler {
	cfg := zones.Config{Name: name, Quota: n, Period: algorithms.Day}
	return &zoneHandler{Zone: mustZone(cfg, nil, nil)}
}

// A quota zone's fields: q the quota, w the period it was counted in (a
// 23-hour day too), r what is left, t the seconds to the boundary only
// once nothing is left; RateLimit-Reset and Retry-After the boundary.
func TestHeadersOfAQuotaZone(t *testing.T) {
	daily := testQuotaZone("daily", 1000)
	perMin := testZone("z", 10, time.Minute, 0)
	day, short := 24*time.Hour, 23*time.Hour
	tests := []struct {
		name     string
		verdicts []verdict
		denied   bool
		policy   string
		state    string
		legacy   [3]string
		retry    string
	}{
		{"quota left: no t, Reset at the boundary",
			[]verdict{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 990, ResetAfter: 3*time.Hour + time.Millisecond, Period: day}}}, false,
			`"daily";q=1000;w=86400`, `"daily";r=990`, [3]string{"1000", "990", "10801"}, ""},
		{"the last unit: t is the boundary",
			[]verdict{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 0, ResetAfter: 3 * time.Hour, Period: day}}}, false,
			`"daily";q=1000;w=86400`, `"daily";r=0;t=10800`, [3]string{"1000", "0", "10800"}, ""},
		{"denied: t and Retry-After are the boundary",
			[]verdict{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{RetryAfter: 90 * time.Second, ResetAfter: 90 * time.Second, Period: short}}}, true,
			`"daily";q=1000;w=82800`, `"daily";r=0;t=90`, [3]string{"1000", "0", "90"}, "90"},
		{"a weighted request denied with units left: r=0, t and Retry-After the boundary",
			[]verdict{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{RetryAfter: 90 * time.Second, ResetAfter: 90 * time.Second, Period: day}}}, true,
			`"daily";q=1000;w=86400`, `"daily";r=0;t=90`, [3]string{"1000", "0", "90"}, "90"},
		{"a rate zone denies beside a quota with units left",
			[]verdict{
				{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{RetryAfter: 2 * time.Second, ResetAfter: 56 * time.Second}},
				{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 990, ResetAfter: 3 * time.Hour, Period: day}},
			}, true,
			`"z";q=10;w=60, "daily";q=1000;w=86400`, `"z";r=0;t=2, "daily";r=990`, [3]string{"10", "0", "56"}, "2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range []*Handler{{}, {rendered: new(renderCache), values: newValueCache()}} {
				hdr := http.Header{}
				h.setHeaders(hdr, tc.verdicts, tc.denied, tc.verdicts[0].Decision.RetryAfter)
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
		h.setHeaders(hdr, []verdict{{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 5, ResetAfter: time.Hour, Period: p}}}, false, 0)
		if want := `"daily";q=1000;w=` + strconv.Itoa(int(p/time.Second)); hdr.Get("RateLimit-Policy") != want {
			t.Errorf("RateLimit-Policy = %q, want %q", hdr.Get("RateLimit-Policy"), want)
		}
	}
}
