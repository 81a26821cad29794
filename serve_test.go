package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// A key read from a request header without the replacer is what the
// replacer gives: values joined by ",", "" when absent, whatever the case of
// the name in the template.
func TestHeaderKeyReadsLikeTheReplacer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tpl    string
		values []string
	}{
		{"one value", "{http.request.header.X-Api-Key}", []string{"alice"}},
		{"several values", "{http.request.header.X-Api-Key}", []string{"alice", "bob"}},
		{"absent", "{http.request.header.X-Api-Key}", nil},
		{"lower-case name", "{http.request.header.x-api-key}", []string{"carol"}},
		{"empty value", "{http.request.header.X-Api-Key}", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, v := range tc.values {
				r.Header.Add("X-Api-Key", v)
			}
			repl := caddyhttp.NewTestReplacer(r)
			keyVar := singlePlaceholder(tc.tpl)
			z := &zoneHandler{key: tc.tpl, keyVar: keyVar}
			want := (&zoneHandler{key: tc.tpl, keyVar: keyVar}).expandKey(r, repl) // replacer path
			z.keyHeader = headerPlaceholder(keyVar)
			if z.keyHeader == "" {
				t.Fatalf("%s is not read as a header", tc.tpl)
			}
			if got := z.expandKey(r, repl); got != want {
				t.Fatalf("key %q, the replacer gives %q", got, want)
			}
		})
	}
}

// Local decisions run on the monotonic clock (internal/monotime), never on
// the wall clock: a step of the wall clock must neither refill nor block a
// key. The TAT the request path stores is monotime-based: one emission
// interval ahead of monotime.Now(), not of time.Now().UnixNano().
func TestRequestPathKeepsLocalStateOnTheMonotonicClock(t *testing.T) {
	h := benchHandler(t, "off")
	// Re-provision the zone at 10 per hour: T = 6 min, so the TAT stays
	// ahead of now while the test reads it.
	_ = h.Cleanup()
	h.RateLimits["api"].MaxEvents, h.RateLimits["api"].Window = 10, caddy.Duration(time.Hour)
	h.zones = nil
	ctx, cancel := caddy.NewContext(caddy.ActiveContext())
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Api-Key", "k")
	caddyhttp.NewTestReplacer(r)
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	if err := h.ServeHTTP(&headerRecorder{h: http.Header{}}, r, next); err != nil {
		t.Fatal(err)
	}
	now := monotime.Now()
	tat, ok := h.zones[0].State().Local.Get("k", now)
	if !ok {
		t.Fatal("no state for the key after an allowed request")
	}
	// A fresh key's TAT is now + T (6 min); allow a second for a slow
	// machine.
	if ahead := time.Duration(tat - now); ahead > 6*time.Minute || ahead < 6*time.Minute-time.Second {
		t.Fatalf("the stored TAT is %v ahead of monotime.Now(), want 6m (one emission interval): the request path is not on the monotonic clock", ahead)
	}
}
