package tests

// What a config accepts but that cannot do what it says: warned about when
// it loads, or, for keys that expand to nothing, counted and logged once.

import (
	"strings"
	"testing"
)

// warnLines are the WARN lines of Caddy's output whose message contains
// msg and that name zone.
func warnLines(c *caddyInstance, msg, zone string) int {
	n := 0
	for _, line := range strings.Split(c.Output(), "\n") {
		if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, msg) && strings.Contains(line, `"zone":"`+zone+`"`) {
			n++
		}
	}
	return n
}

func TestLoadWarnsAboutZonesThatCannotDoWhatTheySay(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", `http:// {
	rate_limit {
		zone typo {
			match {
				path /typo
			}
			key client_ip
			events 5
			window 1m
		}
		zone one_bucket {
			match {
				path /one
			}
			key static
			events 5
			window 1m
		}
		zone closed_local {
			match {
				path /closed
			}
			key {client_ip}
			events 5
			window 1m
			fail_policy closed
		}
		zone misspelt {
			match {
				path /api
			}
			key {http.request.heder.X-API-Key}
			events 100
			window 1m
		}
	}
	respond "ok"
}
`)
	const noPlaceholder = "key has no placeholder: every request shares one bucket; did you mean key {client_ip}? (for one bucket on purpose, write key static)"
	if n := warnLines(c, noPlaceholder, "typo"); n != 1 {
		t.Errorf("%d WARN lines %q for key client_ip, want 1", n, noPlaceholder)
	}
	if n := warnLines(c, "key has no placeholder", "one_bucket"); n != 0 {
		t.Errorf("%d WARN lines for key static, want none: it is the spelling of one bucket on purpose", n)
	}
	if n := warnLines(c, "fail_policy has no effect without distributed", "closed_local"); n != 1 {
		t.Errorf("%d WARN lines for fail_policy closed without distributed, want 1", n)
	}

	// A key that expands to nothing: counted per request, logged once.
	c.Send(3, request{Path: "/api", Header: map[string]string{"X-API-Key": "alice"}})
	samples := c.scrape()
	if v, ok := metricValue(samples, "caddy_rate_limit_empty_keys_total", map[string]string{"zone": "misspelt"}); !ok || v != 3 {
		t.Errorf("caddy_rate_limit_empty_keys_total{zone=misspelt} = %v (present %v), want 3", v, ok)
	}
	for _, zone := range []string{"typo", "one_bucket"} {
		if _, ok := metricValue(samples, "caddy_rate_limit_empty_keys_total", map[string]string{"zone": zone}); ok {
			t.Errorf("zone %s, whose key is never empty, has a caddy_rate_limit_empty_keys_total series", zone)
		}
	}
	if n := warnLines(c, "a request's key is empty", "misspelt"); n != 1 {
		t.Errorf("%d WARN lines for the empty key of zone misspelt after 3 requests, want 1", n)
	}
}
