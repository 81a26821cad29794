package ratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

func testZone(name string, events int64, window time.Duration, burst int64) *httpZone {
	cfg := zones.Config{Name: name, Events: events, Window: window, Burst: burst}
	return &httpZone{Zone: mustZone(cfg, nil, nil)}
}

// The RateLimit fields to the letter of draft-ietf-httpapi-ratelimit-headers-10
// and RFC 9651: t is the time until more quota is available, omitted when
// none can become available, and Retry-After never earlier than any t.
func TestHeadersFollowDraft10(t *testing.T) {
	perMin := testZone("z", 10, time.Minute, 0) // T = 6s
	daily := testZone("daily", 1000, 24*time.Hour, 0)
	half := testZone("half", 5, 1500*time.Millisecond, 0)
	tests := []struct {
		name       string
		tickets    []ticket
		denied     bool
		policy     string
		state      string
		legacy     [3]string // limit, remaining, reset
		minRetryAt int64
	}{
		{"first request of a fresh key: one unit frees in T",
			[]ticket{{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 9, ResetAfter: 6 * time.Second}}}, false,
			`"z";q=10;w=60`, `"z";r=9;t=6`, [3]string{"10", "9", "6"}, 6},
		{"part way through an interval: t is what is left of it, rounded up",
			[]ticket{{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 7, ResetAfter: 14*time.Second + 200*time.Millisecond}}}, false,
			`"z";q=10;w=60`, `"z";r=7;t=3`, [3]string{"10", "7", "15"}, 3},
		{"last unit used: t is the next interval, not the full reset",
			[]ticket{{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 0, ResetAfter: 60 * time.Second}}}, false,
			`"z";q=10;w=60`, `"z";r=0;t=6`, [3]string{"10", "0", "60"}, 6},
		{"denied: t is the retry time, as Retry-After",
			[]ticket{{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{RetryAfter: 5*time.Second + time.Millisecond, ResetAfter: 60 * time.Second}}}, true,
			`"z";q=10;w=60`, `"z";r=0;t=6`, [3]string{"10", "0", "60"}, 6},
		{"full key (fail open): no t, nothing more can become available",
			[]ticket{{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 10}}}, false,
			`"z";q=10;w=60`, `"z";r=10`, [3]string{"10", "10", "0"}, 0},
		{"window not in whole seconds: no w",
			[]ticket{{Owner: half, Zone: half.Zone, Plan: half.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 4, ResetAfter: 300 * time.Millisecond}}}, false,
			`"half";q=5`, `"half";r=4;t=1`, [3]string{"5", "4", "1"}, 1},
		{"denied by one zone: the other, with quota left, gives no t to undercut Retry-After",
			[]ticket{
				{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{RetryAfter: 2 * time.Second, ResetAfter: 56 * time.Second}},
				{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 990, ResetAfter: 864 * time.Second}},
			}, true,
			`"z";q=10;w=60, "daily";q=1000;w=86400`, `"z";r=0;t=2, "daily";r=990`, [3]string{"10", "0", "56"}, 2},
		{"allowed by two zones: one member each, legacy trio from the one with fewest remaining",
			[]ticket{
				{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 3, ResetAfter: 40 * time.Second}},
				{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 990, ResetAfter: 864 * time.Second}},
			}, false,
			`"z";q=10;w=60, "daily";q=1000;w=86400`, `"z";r=3;t=4, "daily";r=990;t=87`, [3]string{"10", "3", "40"}, 87},
		{"two zones with as many remaining: legacy trio from the one that is full again later, whichever comes first",
			[]ticket{
				{Owner: perMin, Zone: perMin.Zone, Plan: perMin.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 3, ResetAfter: 40 * time.Second}},
				{Owner: daily, Zone: daily.Zone, Plan: daily.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 3, ResetAfter: 2520 * time.Second}},
			}, false,
			`"z";q=10;w=60, "daily";q=1000;w=86400`, `"z";r=3;t=4, "daily";r=3;t=15`, [3]string{"1000", "3", "2520"}, 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &Handler{}
			hdr := http.Header{}
			maxT := h.setHeaders(hdr, tc.tickets, tc.denied, tc.tickets[0].Decision.RetryAfter)
			if got := hdr.Get("RateLimit-Policy"); got != tc.policy {
				t.Errorf("RateLimit-Policy = %q, want %q", got, tc.policy)
			}
			if got := hdr.Get("RateLimit"); got != tc.state {
				t.Errorf("RateLimit = %q, want %q", got, tc.state)
			}
			got := [3]string{hdr.Get("RateLimit-Limit"), hdr.Get("RateLimit-Remaining"), hdr.Get("RateLimit-Reset")}
			if got != tc.legacy {
				t.Errorf("legacy trio = %v, want %v", got, tc.legacy)
			}
			if maxT != tc.minRetryAt {
				t.Errorf("largest t = %d, want %d", maxT, tc.minRetryAt)
			}
			wantRetry := ""
			if tc.denied {
				wantRetry = strconv.FormatInt(tc.minRetryAt, 10)
			}
			if got := hdr.Get("Retry-After"); got != wantRetry {
				t.Errorf("Retry-After = %q, want %q", got, wantRetry)
			}
		})
	}
}

// A second rate_limit handler on the route adds its members to the first
// one's; on a denial the first one's members with quota left lose their t,
// and the largest remaining t bounds Retry-After.
func TestHeadersOfTwoHandlersMerge(t *testing.T) {
	h := &Handler{}
	hdr := http.Header{}
	first := testZone("daily", 1000, 24*time.Hour, 0)
	second := testZone("z", 10, time.Minute, 0)
	h.setHeaders(hdr, []ticket{{Owner: first, Zone: first.Zone, Plan: first.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 990, ResetAfter: 864 * time.Second}}}, false, 0)
	maxT := h.setHeaders(hdr, []ticket{{Owner: second, Zone: second.Zone, Plan: second.Plan(), Decision: zones.Decision{RetryAfter: 2 * time.Second, ResetAfter: 56 * time.Second}}}, true, 1500*time.Millisecond)
	if got, want := hdr.Get("RateLimit-Policy"), `"daily";q=1000;w=86400, "z";q=10;w=60`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got, want := hdr.Get("RateLimit"), `"daily";r=990, "z";r=0;t=2`; got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	if maxT != 2 {
		t.Errorf("largest t = %d, want 2", maxT)
	}
	if got := hdr.Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After = %q, want 2: never earlier than t", got)
	}
	if got := hdr.Get("RateLimit-Remaining"); got != "0" {
		t.Errorf("RateLimit-Remaining = %q, want the denying zone's 0", got)
	}
}

// Every value is a valid RFC 9651 Integer (at most 15 digits), even for the
// largest limits a configuration may hold.
func TestHeaderIntegersStayWithinStructuredFieldRange(t *testing.T) {
	z := testZone("big", 1<<40, zones.MaxSpan, 0)
	hdr := http.Header{}
	(&Handler{}).setHeaders(hdr, []ticket{{Owner: z, Zone: z.Zone, Plan: z.Plan(), Decision: zones.Decision{RetryAfter: zones.MaxSpan, ResetAfter: 1<<63 - 1}}}, true, zones.MaxSpan)
	for _, name := range []string{"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After"} {
		for _, f := range strings.FieldsFunc(hdr.Get(name), func(r rune) bool { return r < '0' || r > '9' }) {
			if n, err := strconv.ParseInt(f, 10, 64); err != nil || len(f) > 15 || n < 0 {
				t.Errorf("%s: %q carries %q, not an sf-integer", name, hdr.Get(name), f)
			}
		}
	}
}

func BenchmarkSetHeaders(b *testing.B) {
	h := &Handler{}
	api := testZone("api", 100, time.Minute, 0)
	vs := []ticket{{Owner: api, Zone: api.Zone, Plan: api.Plan(), Decision: zones.Decision{Allowed: true, Remaining: 42, ResetAfter: 35 * time.Second}}}
	hdr := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		clear(hdr)
		h.setHeaders(hdr, vs, false, 0)
	}
}

// Responses rendered at once from many goroutines each get their own values,
// whether the caches hold them, another goroutine just replaced them, two
// values share a slot, or two zones' responses carry the same numbers.
func TestHeaderValueCacheUnderConcurrency(t *testing.T) {
	h := &Handler{values: newValueCache(), rendered: new(renderCache)}
	api := testZone("api", 100, time.Minute, 0)
	web := testZone("web", 100, time.Minute, 0) // the same numbers, another name
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hdr := http.Header{}
			for i := range 2000 {
				remaining := int64((g*7 + i) % 100) // far more values than slots' worth of collisions
				z := api
				if i%2 == 1 {
					z = web
				}
				clear(hdr)
				denied := remaining == 0
				d := zones.Decision{Allowed: !denied, Remaining: remaining, ResetAfter: 35 * time.Second}
				retry := time.Duration(0)
				if denied {
					d.RetryAfter, retry = 200*time.Millisecond, time.Duration(i%3)*time.Second
				}
				h.setHeaders(hdr, []ticket{{Owner: z, Zone: z.Zone, Plan: z.Plan(), Decision: d}}, denied, retry)
				// T = 0.6s: 35s is 0.2s into an interval.
				want := `"` + z.Name + `";r=` + strconv.FormatInt(remaining, 10) + ";t=1"
				if got := hdr.Get("RateLimit"); got != want {
					t.Errorf("RateLimit %q, want %q", got, want)
					return
				}
				if got := hdr.Get("RateLimit-Policy"); got != `"`+z.Name+`";q=100;w=60` {
					t.Errorf("RateLimit-Policy %q for zone %s", got, z.Name)
					return
				}
				if got := hdr.Get("RateLimit-Remaining"); got != strconv.FormatInt(remaining, 10) {
					t.Errorf("RateLimit-Remaining %q, want %d", got, remaining)
					return
				}
				wantRetry := ""
				if denied {
					wantRetry = strconv.Itoa(max(1, i%3))
				}
				if got := hdr.Get("Retry-After"); got != wantRetry {
					t.Errorf("Retry-After %q, want %q", got, wantRetry)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// mustZone is zones.New for a zone the test knows its store accepts.
func mustZone(c zones.Config, s *zones.State, store zones.Store) *zones.Zone {
	z, err := zones.New(c, s, store)
	if err != nil {
		panic(err)
	}
	return z
}
