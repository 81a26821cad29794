package ratelimit

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

// A zone with ban has its ban settings in its snapshot's identity (a ban
// entry packs the end with the memory, ban max), so that a zone whose ban
// changed does not resume the bans of the old one; a zone without ban keeps
// the identity it had before bans were persisted.
func TestSnapshotIdentityFollowsTheBan(t *testing.T) {
	id := func(ban, banMax time.Duration) string {
		c := zones.Config{Name: "login", Events: 3, Window: time.Hour, Ban: ban, BanMax: banMax}
		return snapshotID(&httpZone{Zone: mustZone(c, nil, nil)})
	}
	plain := id(0, 0)
	if strings.Contains(plain, "ban") {
		t.Errorf("a zone without ban has the identity %q: its snapshots of before bans were persisted would be ignored", plain)
	}
	seen := map[string]string{plain: "no ban"}
	for _, c := range []struct {
		name        string
		ban, banMax time.Duration
	}{
		{"ban 1h", time.Hour, 0},
		{"ban 2h", 2 * time.Hour, 0},
		{"ban 1h 8h", time.Hour, 8 * time.Hour},
		{"ban 1h 16h", time.Hour, 16 * time.Hour},
	} {
		got := id(c.ban, c.banMax)
		if other, dup := seen[got]; dup {
			t.Errorf("%s has the snapshot identity of %s: %q", c.name, other, got)
		}
		seen[got] = c.name
	}
}
