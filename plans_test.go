package ratelimit

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The JSON's plan bounds are checked as the Caddyfile checks them, and a
// limit the client sets without a bound is warned about.
func TestPlanBoundsAreCheckedAndUnboundedClientPlansWarned(t *testing.T) {
	minute := caddy.Duration(time.Minute)
	for _, tc := range []struct {
		name string
		zone Zone
		want string // "" = accepted
		warn int
	}{
		{"bounded", Zone{MaxEvents: 60, MaxEventsPlaceholder: "{http.request.header.X-RPM}", MaxEventsAtMost: 600, Window: minute}, "", 0},
		{"unbounded request header", Zone{MaxEvents: 60, MaxEventsPlaceholder: "{http.request.header.X-RPM}", Window: minute}, "", 1},
		{"unbounded operator value", Zone{MaxEvents: 60, MaxEventsPlaceholder: "{plan_rpm}", Window: minute}, "", 0},
		{"bound without placeholder", Zone{MaxEvents: 60, MaxEventsAtMost: 600, Window: minute}, "events at_most bounds the values of a placeholder", 0},
		{"bound under the fallback", Zone{MaxEvents: 60, MaxEventsPlaceholder: "{p}", MaxEventsAtMost: 30, Window: minute}, "events at_most 30 is less than the fallback, events 60", 0},
		{"bound over 2^40", Zone{MaxEvents: 60, MaxEventsPlaceholder: "{p}", MaxEventsAtMost: 1<<40 + 1, Window: minute}, "events at_most must be a whole number from 1 to 2^40", 0},
		{"window bound over the fallback", Zone{MaxEvents: 60, Window: minute, WindowPlaceholder: "{w}", WindowAtLeast: 2 * minute}, "window at_least 2m0s is longer than the fallback, window 1m0s", 0},
		{"burst bound under the fallback", Zone{MaxEvents: 60, Window: minute, Burst: 10, BurstPlaceholder: "{b}", BurstAtMost: 5}, "burst at_most 5 is less than the fallback, burst 10", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			_, err := newPlanVars("z", &tc.zone, zap.New(core))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if n := logs.FilterMessageSnippet("which the client sets, with no bound").Len(); n != tc.warn {
				t.Errorf("%d warnings, want %d", n, tc.warn)
			}
		})
	}
}
