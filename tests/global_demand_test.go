package tests

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

// A scope global zone's steps count for its region's demand when they say
// something of it: a decision, a charge, and a post-charged check the key
// failed (its client wants more than it has), whether or not the step
// carries the zone's ban rule; a peek and a refund do not. (The wrapper
// over a strict store with bans used to leave a failed check out.)
func TestGlobalFailedChecksAreDemandWithOrWithoutABan(t *testing.T) {
	// Syncs and polls an hour apart: nothing takes the counts meanwhile.
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: time.Hour, lease: 2 * time.Hour}, nil)
	reg, sh := f.regions[0].regions[0], f.regions[0].shared[0]
	ctx := context.Background()
	for _, tc := range []struct {
		key string
		ban zones.BanRule
	}{{"plain", zones.BanRule{}}, {"banned", zones.BanRule{First: time.Hour}}} {
		step := func(op zones.Op, cost int64) zones.RateReply {
			t.Helper()
			rep, err := sh.Rate(ctx, globalZone, tc.key, zones.RateStep{Op: op, Limit: globalLimit, Cost: cost, Ban: tc.ban})
			if err != nil {
				t.Fatalf("%s: %v", tc.key, err)
			}
			return rep
		}
		step(zones.OpCharge, 2*globalLimit.Burst) // the key in debt
		a0, d0 := reg.Demand(globalZone, tc.key)
		if a0 != 2*globalLimit.Burst || d0 != 0 {
			t.Fatalf("%s: a charge of %d counted admitted %d, denied %d", tc.key, 2*globalLimit.Burst, a0, d0)
		}
		if rep := step(zones.OpCheck, 1); rep.Allowed {
			t.Fatalf("%s: a check of a key in debt allowed: %+v", tc.key, rep)
		}
		step(zones.OpPeek, 1)
		step(zones.OpRefund, 1)
		if a, d := reg.Demand(globalZone, tc.key); a != a0 || d != 1 {
			t.Errorf("%s (ban %v): after a failed check, a peek and a refund the region counted admitted %d, denied %d; want %d and 1 (the failed check alone)", tc.key, tc.ban.First, a, d, a0)
		}
	}
}
