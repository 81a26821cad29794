package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// benchHandler provisions a handler with one literal-limit zone keyed by a
// request header, in the given headers mode, as Caddy would.
func benchHandler(tb testing.TB, headers string) *Handler {
	return benchHandlerWith(tb, headers, 1_000_000, time.Second)
}

// benchHandlerWith is benchHandler with another limit.
func benchHandlerWith(tb testing.TB, headers string, events int, window time.Duration) *Handler {
	tb.Helper()
	// A running (empty) config gives the context its apps: the events app
	// the handler emits to is provisioned on first use, as in Caddy.
	if err := caddy.Load([]byte(`{"admin":{"disabled":true,"config":{"persist":false}}}`), true); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = caddy.Stop() })
	ctx, cancel := caddy.NewContext(caddy.ActiveContext())
	tb.Cleanup(cancel)
	h := &Handler{
		RateLimits: map[string]*Zone{"api": {
			Key:       "{http.request.header.X-Api-Key}",
			MaxEvents: int64(events),
			Window:    caddy.Duration(window),
		}},
		Headers: headers,
	}
	if err := h.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// headerRecorder is a ResponseWriter that only keeps headers, cleared by
// the benchmark between requests as a new response's would be.
type headerRecorder struct {
	h      http.Header
	status int
}

func (w *headerRecorder) Header() http.Header         { return w.h }
func (w *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerRecorder) WriteHeader(status int)      { w.status = status }

// BenchmarkServeHTTPAllowedExistingKey measures the whole request path of an
// allowed request on a key the zone already tracks, per headers mode: key
// from the replacer, decision, metrics, headers. The allocations it reports
// are all the handler adds to a request. Target: 0 allocs/op with headers
// off, one (the header values' backing array) with headers on.
func BenchmarkServeHTTPAllowedExistingKey(b *testing.B) {
	for _, mode := range []string{"off", "both", "ietf", "legacy"} {
		b.Run("headers="+mode, func(b *testing.B) {
			h := benchHandler(b, mode)
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("X-Api-Key", "")
			caddyhttp.NewTestReplacer(r)
			w := &headerRecorder{h: http.Header{}}
			next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
			// Keys of 16 bytes, each far below its limit: every request is
			// allowed with the same remaining quota, as on a busy site.
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = fmt.Sprintf("key-%012d", i)
				r.Header["X-Api-Key"][0] = keys[i]
				if err := h.ServeHTTP(w, r, next); err != nil {
					b.Fatal(err)
				}
			}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				r.Header["X-Api-Key"][0] = keys[i]
				if err := h.ServeHTTP(w, r, next); err != nil {
					b.Fatal(err)
				}
				i = (i + 1) % len(keys)
			}
		})
	}
}

// BenchmarkServeHTTPDeniedFlood measures a request from a key that is over
// its limit (the flood case): decision, headers with Retry-After,
// placeholders, offenders, the direct 429 of a server without error routes.
// Each request has a fresh replacer, as in Caddy, whose own allocations
// handler-allocs/op and handler-B/op leave out: they are what the handler
// adds to a request.
func BenchmarkServeHTTPDeniedFlood(b *testing.B) {
	h := benchHandlerWith(b, "both", 1, time.Hour)
	base := httptest.NewRequest(http.MethodGet, "/", nil)
	base.Header.Set("X-Api-Key", "flooder-00000001")
	base = base.WithContext(context.WithValue(base.Context(), caddyhttp.ServerCtxKey, &caddyhttp.Server{}))
	fresh := func() *http.Request {
		r := base.WithContext(base.Context())
		caddyhttp.NewTestReplacer(r) // what Caddy's server gives a request
		return r
	}
	w := &headerRecorder{h: http.Header{}}
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	if err := h.ServeHTTP(w, fresh(), next); err != nil { // the burst of one
		b.Fatal(err)
	}
	harnessAllocs, harnessBytes := allocsOf(func() { _ = fresh() })

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		w.status = 0
		if err := h.ServeHTTP(w, fresh(), next); err != nil || w.status != http.StatusTooManyRequests {
			b.Fatalf("status %d, error %v: the key is meant to be over its limit", w.status, err)
		}
	}
	runtime.ReadMemStats(&after)
	n := float64(b.N)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n-harnessAllocs, "handler-allocs/op")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n-harnessBytes, "handler-B/op")
}

// allocsOf is how many allocations, and bytes, one call of f makes.
func allocsOf(f func()) (allocs, bytes float64) {
	const runs = 1000
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / runs, float64(after.TotalAlloc-before.TotalAlloc) / runs
}
