package ratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// A request one zone admits for later and a later zone denies consumes
// nothing: the reservation is given back, with its queue place, and the
// key's next turn is the one the denied request had.
func TestDelayReservationIsRefundedWhenALaterZoneDenies(t *testing.T) {
	h := provisioned(t, &Handler{RateLimits: map[string]*Zone{
		// 1/s: decided first (tightest).
		"smooth": {Key: "{http.request.header.X-A}", MaxEvents: 1, Window: caddy.Duration(time.Second), Burst: 1, Delay: caddy.Duration(3 * time.Second)},
		// 100/s, burst 5: a request costing 10 never passes.
		"weighted": {Key: "{http.request.header.X-A}", MaxEvents: 100, Window: caddy.Duration(time.Second), Burst: 5, CostPlaceholder: "{http.request.header.X-Cost}", Cost: 1},
	}})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(200); return nil })
	serve := func(cost string) int {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-A", "a")
		r.Header.Set("X-Cost", cost)
		caddyhttp.NewTestReplacer(r)
		w := &headerRecorder{h: http.Header{}}
		if err := h.ServeHTTP(w, r, next); err != nil {
			if he, ok := err.(caddyhttp.HandlerError); ok {
				return he.StatusCode
			}
			t.Fatal(err)
		}
		return w.status
	}
	start := monotime.Now()
	if got := serve("1"); got != 200 {
		t.Fatalf("first request: %d", got)
	}
	if got := serve("10"); got != 429 { // smooth reserves the next second, weighted denies
		t.Fatalf("a request weighted denies: %d, want 429", got)
	}
	smooth := h.zones[0]
	if smooth.Name != "smooth" {
		t.Fatalf("zones in order %s, %s: want smooth first", h.zones[0].Name, h.zones[1].Name)
	}
	if n := smooth.Waiting(); n != 0 {
		t.Errorf("%d waiting after the denial, want 0 (its queue place given back)", n)
	}
	// The first request's turn came at or after start: the next is one
	// second after it (two if the denied request kept its reservation),
	// however long the requests took on a loaded machine.
	now := monotime.Now()
	elapsed := time.Duration(now - start)
	d := smooth.Decide(context.Background(), "a", now)
	if d.Delay > time.Second || d.Delay < time.Second-elapsed {
		t.Errorf("the next turn is %v away, %v after the first request, want 1s less what passed since (2s less it if the denied request kept its reservation)", d.Delay, elapsed)
	}
	smooth.EndWait()
}

// A request that waits for its turn takes its concurrency slots after the
// wait, not during it: a slot held while waiting would deny others for
// nothing.
func TestDelayWaitsBeforeTakingAConcurrencySlot(t *testing.T) {
	h := provisioned(t, &Handler{RateLimits: map[string]*Zone{
		"smooth": {Key: "{http.request.header.X-A}", MaxEvents: 5, Window: caddy.Duration(time.Second), Burst: 1, Delay: caddy.Duration(3 * time.Second)},
		"one":    {Key: "{http.request.header.X-A}", Concurrency: 1},
	}})
	conc := h.zones[1]
	var inFlightAtNext int64 = -1
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		inFlightAtNext = conc.InFlight()
		w.WriteHeader(200)
		return nil
	})
	serve := func() {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-A", "a")
		caddyhttp.NewTestReplacer(r)
		if err := h.ServeHTTP(&headerRecorder{h: http.Header{}}, r, next); err != nil {
			t.Error(err)
		}
	}
	serve() // at once; the next turn is 200ms away
	done := make(chan struct{})
	go func() { defer close(done); serve() }()
	for deadline := time.Now().Add(5 * time.Second); h.zones[0].Waiting() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second request did not wait for its turn")
		}
	}
	if n := conc.InFlight(); n != 0 {
		t.Errorf("%d slots in use while the request waits for its turn, want 0", n)
	}
	<-done
	if inFlightAtNext != 1 {
		t.Errorf("the request held %d slots while served, want 1", inFlightAtNext)
	}
}
