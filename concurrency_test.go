package ratelimit

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/zones"
)

func TestCaddyfileConcurrencyZone(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone uploads {
			key {client_ip}
			concurrency 4
			lease 1m
			fail_policy closed
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["uploads"]
	if z.Concurrency != 4 || time.Duration(z.Lease) != time.Minute || z.MaxEvents != 0 || z.Window != 0 {
		t.Fatalf("parsed %+v, want concurrency 4, lease 1m, no events or window", z)
	}
	js, err := json.Marshal(z)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"concurrency":4,"lease":60000000000`; !strings.Contains(string(js), want) {
		t.Fatalf("JSON %s does not contain %s", js, want)
	}
}

func TestCaddyfileConcurrencyErrorsNameTheLineAndTheFix(t *testing.T) {
	zone := func(body string) string {
		return "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n" + body + "\n\t}\n}"
	}
	for _, tc := range []struct {
		name, input string
		line        int
		want        string
	}{
		{"events then concurrency", zone("\t\tevents 1\n\t\tconcurrency 2"), 5, "concurrency replaces events, window and burst"},
		{"concurrency then window", zone("\t\tconcurrency 2\n\t\twindow 1s"), 5, "concurrency replaces events, window and burst"},
		{"lease without concurrency", zone("\t\tevents 1\n\t\twindow 1s\n\t\tlease 1m"), 7, "lease only applies to concurrency zones"},
		{"short lease", zone("\t\tconcurrency 2\n\t\tlease 100ms"), 5, "lease must be at least 1s"},
		{"zero concurrency", zone("\t\tconcurrency 0"), 4, "concurrency must be a whole number from 1"},
		{"repeated", zone("\t\tconcurrency 1\n\t\tconcurrency 2"), 5, "concurrency is given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.input)
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.input)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, "Testfile:"+strconv.Itoa(tc.line)) {
				t.Errorf("error %q, want it to say %q at line %d", msg, tc.want, tc.line)
			}
		})
	}
}

// Zones of one rate are ordered by burst, however far apart the bursts
// are: a comparison by difference would wrap where int is 32 bits.
func TestZonesOfOneRateAreOrderedBySmallerBurst(t *testing.T) {
	mk := func(name string, burst int64) *httpZone {
		return &httpZone{Zone: mustZone(zones.Config{Name: name, Events: 1 << 33, Window: 1 << 33 * time.Microsecond, Burst: burst}, nil, nil)}
	}
	huge, tiny := mk("a_huge", 1<<33), mk("b_tiny", 1)
	if got := compareZones(tiny, huge); got != -1 {
		t.Errorf("compareZones(burst 1, burst 2^33) = %d, want -1", got)
	}
	if got := compareZones(huge, tiny); got != 1 {
		t.Errorf("compareZones(burst 2^33, burst 1) = %d, want 1", got)
	}
}

// Rate zones decide before concurrency zones, so that a request a rate zone
// denies never takes a slot; among concurrency zones the smallest goes
// first.
func TestConcurrencyZonesAreDecidedAfterRateZones(t *testing.T) {
	mk := func(name string, c zones.Config) *httpZone {
		c.Name = name
		return &httpZone{Zone: mustZone(c, nil, nil)}
	}
	c8, c2 := mk("c8", zones.Config{Concurrency: 8}), mk("c2", zones.Config{Concurrency: 2})
	rate := mk("rate", zones.Config{Events: 1, Window: time.Hour})
	for _, tc := range []struct {
		a, b *httpZone
		want int
	}{{rate, c2, -1}, {c2, rate, 1}, {c2, c8, -1}, {c8, c2, 1}, {c2, c2, 0}} {
		if got := compareZones(tc.a, tc.b); got != tc.want {
			t.Errorf("compareZones(%s, %s) = %d, want %d", tc.a.Name, tc.b.Name, got, tc.want)
		}
	}
}

func TestConcurrencyPolicyHeader(t *testing.T) {
	z := &httpZone{Zone: mustZone(zones.Config{Name: "uploads", Concurrency: 4}, nil, nil)}
	hdr := http.Header{}
	(&Handler{}).setHeaders(hdr, []ticket{{Owner: z, Zone: z.Zone, Decision: zones.Decision{Allowed: true, Remaining: 3}}}, false, 0)
	if p, s, l := hdr.Get("RateLimit-Policy"), hdr.Get("RateLimit"), hdr.Get("RateLimit-Limit"); p != `"uploads";q=4;qu="concurrent-requests"` || s != `"uploads";r=3` || l != "4" {
		t.Fatalf("allowed: policy %s, state %s, limit %s", p, s, l)
	}
	// Denied: t is the retry time; when a slot frees otherwise is unknown.
	hdr = http.Header{}
	maxT := (&Handler{}).setHeaders(hdr, []ticket{{Owner: z, Zone: z.Zone, Decision: zones.Decision{RetryAfter: zones.ConcurrencyRetryAfter, ResetAfter: zones.ConcurrencyRetryAfter}}}, true, zones.ConcurrencyRetryAfter)
	if s, want := hdr.Get("RateLimit"), `"uploads";r=0;t=`+strconv.FormatInt(ceilSeconds(zones.ConcurrencyRetryAfter), 10); s != want || maxT != ceilSeconds(zones.ConcurrencyRetryAfter) {
		t.Fatalf("denied: state %s (largest t %d), want %s", s, maxT, want)
	}
}

// A handler after rate_limit that panics still gives the slot back: the
// release is deferred around next.
func TestSlotIsReleasedWhenNextPanics(t *testing.T) {
	cfg := zones.Config{Name: "uploads", Concurrency: 1}
	state := zones.NewState(cfg, time.Hour)
	defer state.Destruct()
	z := &httpZone{Zone: mustZone(cfg, state, nil)}
	tickets := []ticket{{Owner: z, Zone: z.Zone, Key: "alice"}}
	if tickets[0].Admit(context.Background(), 0); !tickets[0].Allowed {
		t.Fatal("first request denied")
	}
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { panic("boom") })
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not propagate")
			}
		}()
		_ = (&Handler{}).serve(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil), nil, next, tickets)
	}()
	if n := z.InFlight(); n != 0 {
		t.Fatalf("%d requests in flight after the panic, want 0", n)
	}
	if d, _ := z.Acquire(context.Background(), "alice"); !d.Allowed {
		t.Fatal("alice's only slot was not released by the panicking request")
	}
}

// A handler's shared resources are released once, by the last of its
// users: the config (Cleanup) and the requests and charges holding them;
// once released, nothing can hold them again.
func TestHandlerResourcesOutliveCleanupUntilTheLastUser(t *testing.T) {
	released := make(chan struct{}, 2)
	u := newHandlerUsers(func() { released <- struct{}{} })
	for range 2 {
		if !u.hold() {
			t.Fatal("a request could not hold a live handler's resources")
		}
	}
	u.cleanup()
	u.done()
	select {
	case <-released:
		t.Fatal("released while a request still holds them")
	case <-time.After(20 * time.Millisecond):
	}
	u.done()
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("not released after the last request let go")
	}
	if u.hold() {
		t.Fatal("released resources were held again")
	}
	select {
	case <-released:
		t.Fatal("released twice")
	case <-time.After(20 * time.Millisecond):
	}
}
