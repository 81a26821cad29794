package tests

import (
	"context"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

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

// A zone decides more keys in a poll than its demand counts (10,000): the
// decisions left out are counted, and logged once per zone.
func TestGlobalDemandOverTheKeyCapIsCountedAndLoggedOnce(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: time.Hour, lease: 2 * time.Hour}, zap.New(core))
	reg := f.regions[0].regions[0]
	for i := range 10_010 {
		reg.Count(globalZone, "k"+strconv.Itoa(i), true, 1)
	}
	if got := reg.DemandDropped(globalZone); got != 10 {
		t.Errorf("%d keys decided in one poll: %d decisions dropped from the demand, want 10", 10_010, got)
	}
	if n := logs.FilterMessageSnippet("than its demand counts").Len(); n != 1 {
		t.Errorf("%d WARNs of demand dropped, want 1", n)
	}
}

// A zone a reload dropped leaves the coordinator's state with its last
// user (its holdings and reports are not kept for ever, reload after
// reload).
func TestGlobalReleasedZoneLeavesTheCoordinator(t *testing.T) {
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: 200 * time.Millisecond, lease: 5 * time.Second}, nil)
	f.waitContact()
	eu := f.regions[0].regions
	syncs := func() int64 { return eu[0].Stats().Syncs.Load() + eu[1].Stats().Syncs.Load() }
	for _, r := range eu {
		r.AddZone("old", globalLimit)
		r.Count("old", "k", false, 1)
	}
	twoSyncs := func() {
		n := syncs()
		if err := waitUntil(10*time.Second, func() bool { return syncs() >= n+2 }); err != nil {
			t.Fatalf("eu did not sync: %v", err)
		}
	}
	twoSyncs()
	for _, r := range eu {
		r.ReleaseZone("old")
	}
	twoSyncs()
	most := 0
	for _, r := range eu {
		r.Close()
		most = max(most, r.CoordinatedZones())
	}
	if most != 1 {
		t.Errorf("eu's coordinator keeps the state of %d zones after old was released, want 1 (%s)", most, globalZone)
	}
}
