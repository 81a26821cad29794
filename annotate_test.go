package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// annotateHandler provisions a handler with a real zone "api" (1,000,000/s)
// and a dry-run zone "shadow" of events per hour, both keyed by X-Api-Key.
func annotateHandler(tb testing.TB, events int64) *Handler {
	tb.Helper()
	return provisioned(tb, &Handler{
		RateLimits: map[string]*Zone{
			"api": {Key: "{http.request.header.X-Api-Key}", MaxEvents: 1_000_000, Window: caddy.Duration(time.Second)},
			"shadow": {Key: "{http.request.header.X-Api-Key}", MaxEvents: events, Window: caddy.Duration(time.Hour),
				DryRun: true},
		},
		Headers: "off",
	})
}

// TestLimitedNamesOnlyTheZonesThatLimited: a dry-run zone is named once
// it would deny, never before, and the real zone that allowed is never
// named.
func TestLimitedNamesOnlyTheZonesThatLimited(t *testing.T) {
	h := annotateHandler(t, 1)
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	for i, want := range []string{"", "shadow", "shadow"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Api-Key", "k")
		repl := caddyhttp.NewTestReplacer(r)
		if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
			t.Fatal(err)
		}
		got, known := repl.GetString(limitedPlaceholder)
		if !known || got != want {
			t.Errorf("request %d: {%s} = %q (known %v), want %q", i+1, limitedPlaceholder, got, known, want)
		}
	}
}

// TestLimitedJoinsTheHandlersOfARequest: a second rate_limit handler's
// denial is named after the first handler's annotation, whether that one
// named nothing (its provider must not hide the denial) or a dry-run zone.
func TestLimitedJoinsTheHandlersOfARequest(t *testing.T) {
	first := annotateHandler(t, 2)
	second := provisioned(t, &Handler{RateLimits: map[string]*Zone{
		"strict": {Key: "{http.request.header.X-Api-Key}", MaxEvents: 1, Window: caddy.Duration(time.Hour)},
	}, Headers: "off"})
	serveBoth := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return second.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	})
	for i, want := range []string{"", "strict", "shadow,strict"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Api-Key", "k")
		repl := caddyhttp.NewTestReplacer(r)
		_ = first.ServeHTTP(httptest.NewRecorder(), r, serveBoth) // the second's denial is its error
		if got, _ := repl.GetString(limitedPlaceholder); got != want {
			t.Errorf("request %d: {%s} = %q, want %q", i+1, limitedPlaceholder, got, want)
		}
	}
}

// BenchmarkServeHTTPAnnotate measures an allowed request of a handler with
// a dry-run zone, a fresh replacer each as in Caddy: "quiet", no zone
// would deny (the static provider: target 0 handler-allocs/op, as the same
// handler without its dry-run zone); "would-deny", the dry-run zone would
// (the names are Set: the rare case).
func BenchmarkServeHTTPAnnotate(b *testing.B) {
	for _, c := range []struct {
		name   string
		events int64
	}{{"quiet", 1_000_000_000}, {"would-deny", 1}} {
		b.Run(c.name, func(b *testing.B) {
			h := annotateHandler(b, c.events)
			base := httptest.NewRequest(http.MethodGet, "/", nil)
			base.Header.Set("X-Api-Key", "key-000000000001")
			fresh := func() *http.Request {
				r := base.WithContext(base.Context())
				caddyhttp.NewTestReplacer(r)
				return r
			}
			w := &headerRecorder{h: http.Header{}}
			next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
			if err := h.ServeHTTP(w, fresh(), next); err != nil {
				b.Fatal(err)
			}
			harnessAllocs, harnessBytes := allocsOf(func() { _ = fresh() })
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ReportAllocs()
			for b.Loop() {
				if err := h.ServeHTTP(w, fresh(), next); err != nil {
					b.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			n := float64(b.N)
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n-harnessAllocs, "handler-allocs/op")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n-harnessBytes, "handler-B/op")
		})
	}
}
