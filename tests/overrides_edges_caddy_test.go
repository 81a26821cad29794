package tests

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// The edges of the override API: an unknown id, every CLI flag sent, and
// matches normalised or refused with the reason.

// DELETE of an id the zone does not hold is a 404 in strict and async
// zones, as in local ones, and changes nothing.
func TestOverrideDeleteOfAnUnknownIDIs404(t *testing.T) {
	rs := startRedis(t)
	for _, mode := range []string{"strict", "async"} {
		t.Run(mode, func(t *testing.T) {
			c := startCaddy(t, distributedSite(rs.Addr, strings.ReplaceAll(overridesZone, "zone api", "zone api_"+mode), "\t\t\tmode "+mode))
			path := "/rate_limit/zones/api_" + mode + "/overrides/"
			mustPutOverride(t, c, "api_"+mode, "kept", `{"match":{"key":"k"},"exempt":true}`)
			if status, body := c.adminDo(http.MethodDelete, path+"never-set"); status != http.StatusNotFound {
				t.Errorf("DELETE of an unknown id: %d %s, want 404", status, body)
			}
			if status, _ := c.adminDo(http.MethodDelete, path+"kept"); status != http.StatusNoContent {
				t.Fatalf("DELETE of a set id: %d, want 204", status)
			}
			if status, body := c.adminDo(http.MethodDelete, path+"kept"); status != http.StatusNotFound {
				t.Errorf("DELETE of an id already removed: %d %s, want 404", status, body)
			}
		})
	}
}

// `caddy rate-limit override set` sends every limit flag it takes.
func TestOverrideCLISendsEveryLimitFlag(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(overrideLocalSite, "both"))
	rateLimitCLI(t, c, "override", "set", "api", "vip", "--key", "vip", "--events", "50", "--window", "1m", "--burst", "10", "--reason", "pays").ok(t, "override set")
	_, body := c.adminDo(http.MethodGet, "/rate_limit/zones/api/overrides/vip")
	for _, want := range []string{`"events":50`, `"window":"1m"`, `"burst":10`, `"reason":"pays"`} {
		if !strings.Contains(body, want) {
			t.Errorf("GET after override set: %s, want %s", body, want)
		}
	}
}

const overrideIPSite = `http:// {
	rate_limit {
		zone ip {
			key {http.request.header.X-Client}
			ipv4_prefix 24
			ipv6_prefix 64
			events 3
			window 1m
		}
	}
	respond "ok"
}
`

// Override matches of IP keys: a mapped CIDR is stored as its IPv4 CIDR
// and covers the zone's keys, a CIDR narrower than the zone's prefix and a
// CIDR of every address are refused with the reason, an exact IPv6 key is
// stored in its canonical spelling.
func TestOverrideIPMatchesNormalisedOrRefused(t *testing.T) {
	c := startCaddy(t, overrideIPSite)
	from := func(ip string) request { return request{Header: map[string]string{"X-Client": ip}} }
	mustPutOverride(t, c, "ip", "mapped", `{"match":{"cidr":"::ffff:172.16.0.0/108"},"exempt":true}`)
	_, body := c.adminDo(http.MethodGet, "/rate_limit/zones/ip/overrides/mapped")
	if !strings.Contains(body, `"cidr":"172.16.0.0/12"`) {
		t.Errorf("a mapped CIDR stored as %s, want 172.16.0.0/12", body)
	}
	if n := admitted(c, from("172.17.1.2"), 6); n != 6 {
		t.Errorf("a key in the mapped CIDR admitted %d of 6 (exempt)", n)
	}
	for _, tc := range []struct{ cidr, want string }{
		{"10.1.2.3/32", "narrower than the zone's ipv4_prefix 24"},
		{"2001:db8::/96", "narrower than the zone's ipv6_prefix 64"},
		{"0.0.0.0/0", "covers every address"},
		{"::/0", "covers every address"},
	} {
		status, answer := putOverride(t, c, "ip", "bad", `{"match":{"cidr":"`+tc.cidr+`"},"exempt":true}`)
		if status != http.StatusBadRequest || !strings.Contains(answer, tc.want) {
			t.Errorf("PUT cidr %s: %d %s; want 400 saying %q", tc.cidr, status, answer, tc.want)
		}
	}
	if status, answer := putOverride(t, c, "ip", "empty", `{"match":{"prefix":""},"exempt":true}`); status != http.StatusBadRequest || !strings.Contains(answer, "every key") {
		t.Errorf("PUT an empty prefix: %d %s; want 400 as for a CIDR of every address", status, answer)
	}
	mustPutOverride(t, c, "ip", "one", `{"match":{"key":"2001:DB8::5"},"deny":true}`)
	if res := c.Do(from("2001:db8::77")); res.Status != http.StatusTooManyRequests {
		t.Errorf("a key of the denied /64, spelt in lower case: %d, want 429", res.Status)
	}
}

// A connection zone takes no overrides, and its override routes say so
// rather than that the zone is unknown.
func TestOverrideOnAConnectionZoneSaysItTakesNone(t *testing.T) {
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				zone conn_only {
					key {remote_ip}
					events 5
					window 10s
				}
			}
			tls`), "\trespond \"ok\"")
	status, answer := putOverride(t, e.caddyInstance, "conn_only", "x", `{"match":{"key":"127.0.0.1"},"exempt":true}`)
	if status != http.StatusNotFound || !strings.Contains(answer, "takes no overrides") {
		t.Errorf("PUT on a connection zone: %d %s; want 404 saying it takes no overrides", status, answer)
	}
}

// A prefix override matches the key as the request carries it, also when
// the zone stores it hashed (longer than 256 bytes): the request is decided
// under the override, and the admin key view shows the same override.
func TestOverrideOnALongKeyShowsInTheKeyView(t *testing.T) {
	c := startCaddy(t, prefixAndLongKeySite)
	mustPutOverride(t, c, "long", "bearers", `{"match":{"prefix":"Bearer x"},"events":5,"window":"1h"}`)
	long := "Bearer " + strings.Repeat("x", 403)
	if n := admitted(c, request{Path: "/long", Header: map[string]string{"Authorization": long}}, 20); n != 5 {
		t.Fatalf("the 410-byte key under the override of 5: %d admitted, want 5", n)
	}
	var k struct {
		adminKey
		Override *struct {
			ID string `json:"id"`
		} `json:"override"`
	}
	c.adminJSON("/rate_limit/zones/long/keys?key="+url.QueryEscape(long), &k)
	if !strings.HasPrefix(k.StoredAs, "sha256:") || k.Events != 5 || k.Remaining != 0 || k.Override == nil || k.Override.ID != "bearers" {
		t.Errorf("GET of the 410-byte key: stored_as %q, events %d, remaining %d, override %+v; want the hashed key at 0 of 5 under the override bearers",
			k.StoredAs, k.Events, k.Remaining, k.Override)
	}
}

// An exact key override of an IP address covers the address however a
// request spells it, in a zone that keeps keys as built (no ipv4_prefix or
// ipv6_prefix): the override is stored in the canonical spelling, and a
// request's "2001:DB8::5" or "::ffff:10.0.0.1" is that address too, for
// the decision, the admin key view and rate_limit_status alike.
func TestOverrideOfAnIPKeyCoversItsEverySpelling(t *testing.T) {
	c := startCaddy(t, `http:// {
	handle /rate_limit {
		rate_limit_status ip
	}
	handle {
		rate_limit {
			zone ip {
				key {http.request.header.X-Client}
				events 3
				window 1m
			}
		}
		respond "ok"
	}
}
`)
	from := func(ip string) request { return request{Header: map[string]string{"X-Client": ip}} }
	mustPutOverride(t, c, "ip", "v6", `{"match":{"key":"2001:DB8::5"},"deny":true}`)
	mustPutOverride(t, c, "ip", "mapped", `{"match":{"key":"::ffff:10.0.0.1"},"events":1,"window":"1m"}`)
	for _, ip := range []string{"2001:DB8::5", "2001:db8::5", "2001:0db8:0:0:0:0:0:5"} {
		if res := c.Do(from(ip)); res.Status != http.StatusTooManyRequests {
			t.Errorf("%s under a deny override of 2001:DB8::5: %d, want 429", ip, res.Status)
		}
		status, body := c.adminDo(http.MethodGet, "/rate_limit/zones/ip/keys?key="+url.QueryEscape(ip))
		if status != http.StatusOK || !strings.Contains(body, `"id":"v6"`) {
			t.Errorf("admin view of %s: %d %s, want the override v6", ip, status, body)
		}
		if res := c.Do(request{Path: "/rate_limit", Header: map[string]string{"X-Client": ip}}); !strings.Contains(res.Body, `"remaining":0`) {
			t.Errorf("rate_limit_status of %s: %s, want remaining 0 (denied)", ip, res.Body)
		}
	}
	for _, ip := range []string{"::ffff:10.0.0.1", "::FFFF:10.0.0.1"} {
		if n := admitted(c, from(ip), 5); n != 1 {
			t.Errorf("%s under an override of 1 per minute: %d admitted, want 1", ip, n)
		}
	}
}
