package config

import (
	"strconv"
	"strings"
	"testing"
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
