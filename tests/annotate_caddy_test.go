package tests

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// echoLimitedUpstream answers with the X-Limited header it was sent,
// quoted, and whether it was sent at all.
func echoLimitedUpstream(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, sent := r.Header["X-Limited"]
		fmt.Fprintf(w, "sent=%v limited=%q", sent, strings.Join(v, ","))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestAnnotateNamesTheZonesThatLimitedUpstream: a dry-run zone annotates
// instead of refusing. header_up passes {http.rate_limit.limited} to the
// upstream: "" while no zone would deny, the dry-run zone's name once it
// would (the real zone, which still allows, is not named), and on the real
// zone's denial handle_errors reads both, tightest first.
func TestAnnotateNamesTheZonesThatLimitedUpstream(t *testing.T) {
	c := startCaddy(t, `http:// {
	rate_limit {
		zone shadow {
			key    {http.request.header.X-API-Key}
			events 2
			window 1m
			dry_run
		}
		zone guard {
			key    {http.request.header.X-API-Key}
			events 4
			window 1m
		}
	}
	reverse_proxy `+echoLimitedUpstream(t)+` {
		header_up X-Limited {http.rate_limit.limited}
	}
	handle_errors {
		respond "denied limited={http.rate_limit.limited}" {err.status_code}
	}
}`)
	for i, want := range []string{
		`sent=true limited=""`, // within both zones
		`sent=true limited=""`,
		`sent=true limited="shadow"`, // shadow would deny; guard allows
		`sent=true limited="shadow"`,
	} {
		res := c.Do(withKey("alice"))
		if res.Status != http.StatusOK || res.Body != want {
			t.Fatalf("request %d of alice: %d %q, want 200 %q", i+1, res.Status, res.Body, want)
		}
	}
	if res := c.Do(withKey("alice")); res.Status != http.StatusTooManyRequests || res.Body != "denied limited=shadow,guard" {
		t.Fatalf("request 5 of alice: %d %q, want 429 %q (guard denies, shadow would have)", res.Status, res.Body, "denied limited=shadow,guard")
	}
	if res := c.Do(withKey("bob")); res.Status != http.StatusOK || res.Body != `sent=true limited=""` {
		t.Fatalf("bob, another key: %d %q, want 200 with nothing limited", res.Status, res.Body)
	}
}
