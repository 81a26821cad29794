package ratelimit

import (
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

// A zone's snapshot name and identity change with its limits, so that a
// zone whose limits changed does not resume from the old snapshot, and do
// not change with anything else.
func TestSnapshotNameFollowsTheLimits(t *testing.T) {
	name := func(events int64, window time.Duration, dryRun bool) string {
		zh := &httpZone{Zone: mustZone(zones.Config{Name: "login", Events: events, Window: window, DryRun: dryRun}, nil, nil)}
		return snapshotID(zh)
	}
	base := name(3, time.Hour, false)
	if name(3, time.Hour, true) != base {
		t.Error("dry_run changed the snapshot's identity")
	}
	for _, other := range []string{name(4, time.Hour, false), name(3, 2*time.Hour, false)} {
		if other == base {
			t.Errorf("changed limits keep the snapshot identity %s", base)
		}
	}
}
