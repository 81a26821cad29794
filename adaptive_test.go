package ratelimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The syntax, as written, parses into an adaptive zone with its
// classes, delay and queue.
func TestCaddyfileAdaptiveZone(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone backend {
			key {http.request.host}
			adaptive {
				latency 250ms
				min 4
				max 2000
			}
			priority {http.vars.class} signed_in anonymous
			delay 2s
			queue 500
			status 429
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["backend"]
	if z.Adaptive == nil || time.Duration(z.Adaptive.Latency) != 250*time.Millisecond || z.Adaptive.Min != 4 || z.Adaptive.Max != 2000 {
		t.Fatalf("adaptive %+v, want latency 250ms min 4 max 2000", z.Adaptive)
	}
	if z.Priority == nil || z.Priority.Placeholder != "{http.vars.class}" || strings.Join(z.Priority.Classes, ",") != "signed_in,anonymous" {
		t.Fatalf("priority %+v", z.Priority)
	}
	if time.Duration(z.Delay) != 2*time.Second || z.Queue != 500 || z.StatusCode != 429 {
		t.Fatalf("delay %v queue %d status %d", time.Duration(z.Delay), z.Queue, z.StatusCode)
	}
	js, _ := json.Marshal(z)
	for _, want := range []string{`"adaptive":{"latency":250000000,"min":4,"max":2000}`, `"priority":{"placeholder":"{http.vars.class}","classes":["signed_in","anonymous"]}`, `"status_code":429`} {
		if !strings.Contains(string(js), want) {
			t.Fatalf("JSON %s does not contain %s", js, want)
		}
	}
}

func TestCaddyfileAdaptiveErrorsNameTheLineAndTheFix(t *testing.T) {
	zone := func(body string) string {
		return "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n" + body + "\n\t}\n}"
	}
	for _, tc := range []struct {
		name, input string
		line        int
		want        string
	}{
		{"no latency", zone("\t\tadaptive {\n\t\t\tmin 2\n\t\t}"), 4, "adaptive needs a latency target"},
		{"zero latency", zone("\t\tadaptive {\n\t\t\tlatency 0s\n\t\t}"), 5, "latency must be a positive duration"},
		{"latency too long", zone("\t\tadaptive {\n\t\t\tlatency 2m\n\t\t}"), 5, "adaptive latency must be a positive duration of at most 1m0s"},
		{"max below min", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t\tmin 5\n\t\t\tmax 4\n\t\t}"), 4, "adaptive max 4 is below min 5"},
		{"unknown setting", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t\ttarget 2s\n\t\t}"), 6, `unknown adaptive setting "target"`},
		{"with concurrency", zone("\t\tconcurrency 3\n\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}"), 5, "adaptive is a limit of requests in flight"},
		{"events after adaptive", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tevents 3"), 7, "it replaces concurrency, lease, quota, events"},
		{"priority without adaptive", zone("\t\tevents 1\n\t\twindow 1s\n\t\tpriority {http.vars.c} a b"), 6, "priority shares an adaptive zone's limit"},
		{"priority without placeholder", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tpriority class a b"), 7, "the placeholder the class is read from"},
		{"priority with one class", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tpriority {http.vars.c} a"), 7, "at least two classes"},
		{"priority class twice", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tpriority {http.vars.c} a b a"), 7, `class "a" is given twice`},
		{"ban in adaptive", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tban 1m"), 7, "ban does not apply to an adaptive zone"},
		{"fail_policy in adaptive", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tfail_policy closed"), 7, "fail_policy does not apply to an adaptive zone"},
		{"queue without delay in adaptive", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tqueue 5"), 7, "queue bounds the requests waiting for their turn, which only a zone with delay has: add e.g. delay 3s"},
		{"zone status out of range", zone("\t\tadaptive {\n\t\t\tlatency 1s\n\t\t}\n\t\tstatus 200"), 7, "status must be a whole number from 400"},
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

func TestPriorityUnknownClassIsTheLowest(t *testing.T) {
	p := &Priority{Placeholder: "{x}", Classes: []string{"signed_in", "anonymous"}}
	for value, want := range map[string]int{"signed_in": 0, "anonymous": 1, "": 1, "admin": 1} {
		if got := p.ClassOf(value); got != want {
			t.Errorf("class of %q = %d, want %d", value, got, want)
		}
	}
}

// adaptiveHandler provisions a handler with one adaptive zone of limit 1
// keyed by X-Api-Key, with the zone's extra settings.
func adaptiveHandler(t *testing.T, zone Zone, dryRun bool) *Handler {
	zone.Key = "{http.request.header.X-Api-Key}"
	zone.Adaptive = &Adaptive{Latency: caddy.Duration(time.Second), Min: 1, Max: 1}
	return provisioned(t, &Handler{RateLimits: map[string]*Zone{"backend": &zone}, DryRun: dryRun})
}

// serveHeld starts a request that holds its place until release is closed,
// and returns once it is in flight.
func serveHeld(t *testing.T, h *Handler, release chan struct{}) chan error {
	inside := make(chan struct{})
	done := make(chan error, 1)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Api-Key", "host")
	caddyhttp.NewTestReplacer(r)
	go func() {
		done <- h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			close(inside)
			<-release
			w.WriteHeader(http.StatusOK)
			return nil
		}))
	}()
	<-inside
	return done
}

func TestAdaptiveShedIs503WithRetryAfterAndTheZonesStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		want   int
	}{{"default", 0, http.StatusServiceUnavailable}, {"zone status", http.StatusTooManyRequests, http.StatusTooManyRequests}} {
		t.Run(tc.name, func(t *testing.T) {
			h := adaptiveHandler(t, Zone{StatusCode: tc.status}, false)
			release := make(chan struct{})
			done := serveHeld(t, h, release)
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("X-Api-Key", "host")
			caddyhttp.NewTestReplacer(r)
			w := httptest.NewRecorder()
			called := false
			err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { called = true; return nil }))
			var he caddyhttp.HandlerError
			if !errors.As(err, &he) || he.StatusCode != tc.want || called {
				t.Fatalf("shed request: error %v (next called %v), want a HandlerError of %d", err, called, tc.want)
			}
			if got := w.Header().Get("Retry-After"); got != "1" {
				t.Fatalf("Retry-After %q, want 1", got)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAdaptiveDryRunShedsNothing(t *testing.T) {
	h := adaptiveHandler(t, Zone{}, true)
	release := make(chan struct{})
	done := serveHeld(t, h, release)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Api-Key", "host")
	caddyhttp.NewTestReplacer(r)
	called := false
	if err := h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { called = true; return nil })); err != nil || !called {
		t.Fatalf("dry run: error %v, next called %v; want the request served", err, called)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := h.zones[0].InFlight(); n != 0 {
		t.Fatalf("in flight %d after both requests, want 0", n)
	}
}
