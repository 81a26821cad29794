package tests

// What a config accepts but that cannot do what it says: warned about when
// it loads, or, for keys that expand to nothing, counted and logged once.

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
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

// basicAuthHash is "secret" in bcrypt at cost 4, cheap for tests.
const basicAuthHash = "$2a$04$5698DtfTX1i8zNCAr5z8EezXNo4cI06zpmkh0MKGw.jhRHYNU5rZG"

// perUserSite keys zone per_user by the user basic_auth authenticates;
// global is the global options (e.g. the order that makes it work).
const perUserSite = `http:// {
	basic_auth {
		alice ` + basicAuthHash + `
		bob ` + basicAuthHash + `
	}
	rate_limit {
		zone per_user {
			key {http.auth.user.id}
			events 2
			window 1h
		}
	}
	respond "ok"
}
`

func asUser(user string) request {
	return request{Header: map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":secret"))}}
}

// rate_limit is ordered before basic_auth: a key that reads {http.auth.*}
// is empty for everyone unless the handler runs after authentication. The
// load says so with the fixes, and the first request that shows it (an
// authenticated user reaching rate_limit without the placeholder) again.
// With the fix (order rate_limit after basic_auth) each user has a bucket.
func TestZoneKeyedByAuthenticationSaysItMustRunAfterIt(t *testing.T) {
	t.Parallel()
	const atLoad = "a zone reads a placeholder that authentication sets: rate_limit must run after authentication"
	const fixes = "put both in route { basic_auth … rate_limit … }, or add the global option order rate_limit after basic_auth"

	before := startCaddy(t, perUserSite)
	if n := warnLines(before, atLoad, "per_user"); n != 1 || !strings.Contains(before.Output(), fixes) {
		t.Errorf("%d WARN lines %q with the fixes at load, want 1", n, atLoad)
	}
	before.Send(2, asUser("alice"))
	before.Send(1, asUser("bob"))
	waitFor(t, 5*time.Second, "the WARN line of an authenticated request reaching rate_limit without its user", func() bool {
		return warnLines(before, "this request reached rate_limit without it", "per_user") == 1
	})

	after := startCaddyWith(t, "\torder rate_limit after basic_auth", perUserSite)
	if got := after.Send(3, asUser("alice")); got[1] != 200 || got[2] != 429 {
		t.Errorf("alice after basic_auth: %v, want 2 allowed then 429", got)
	}
	if got := after.Send(1, asUser("bob")); got[0] != 200 {
		t.Errorf("bob after alice's limit: %v, want 200: a bucket of his own", got)
	}
	if got := after.Send(1, request{}); got[0] != 401 {
		t.Errorf("a request without credentials: %v, want 401", got)
	}
	if n := warnLines(after, "a request's key is empty", "per_user"); n != 0 {
		t.Errorf("%d empty-key WARN lines with rate_limit after basic_auth, want none", n)
	}
}
