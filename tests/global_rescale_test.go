package tests

// A share that rises adds no tokens at once (issue 29's bound): before a
// strict region's coordinator publishes a raise, it rescales each raised
// key in the regional Redis so that the key keeps the tokens it had at its
// old share (a key with no state: a full bucket at its old share), with the
// burst span the key was decided with.

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

func TestGlobalRaisedRegionGainsNoBurstAtOnce(t *testing.T) {
	// 600 in 10 minutes, burst 20: T = 1 s and a burst's span B·T = 20 s
	// at every share, so that a raise from half to 0.95 takes 9.5 s to
	// fill up at the new share, longer than any delay of the test. A plan
	// of the zone: 300 in 10 minutes, burst 20 (span 40 s).
	limit := algorithms.NewLimit(600, int64(10*time.Minute), 20)
	plan := algorithms.NewLimit(300, int64(10*time.Minute), 20)
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: 200 * time.Millisecond, lease: 5 * time.Second, limit: limit}, nil)
	f.waitContact()
	us := f.regions[1]
	rc, ctx := us.redis.Client(), t.Context()
	redisKey := func(key string) string { return "tally:" + globalZone + ":" + key }
	serverNow := func() int64 {
		now, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMicro()
	}
	decide := func(key string, l algorithms.Limit, n int) (admitted int64) {
		for i := range n {
			r, err := stepDecide(us.shared[i%2], ctx, globalZone, key, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			}
		}
		return admitted
	}
	// At half the limit (burst 10): "fresh" has no state in Redis; "used"
	// and "planned" (at its plan) spent 4 tokens each; "old" was full 12 s
	// ago and its state, as a key last decided then keeps it, ends in 2 s,
	// before its first decision at the new share; "banned" holds a ban
	// (no TAT, the ban's end and how long it is remembered, level 1).
	if decide("used", limit, 4) != 4 || decide("planned", plan, 4) != 4 {
		t.Fatal("the keys' first decisions at half the limit were denied")
	}
	start := serverNow()
	if err := rc.Set(ctx, redisKey("old"), strconv.FormatInt(start-12e6, 10), 2*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	ban := "," + strconv.FormatInt(start+60e6, 10) + "," + strconv.FormatInt(start+120e6, 10) + ",1"
	if err := rc.Set(ctx, redisKey("banned"), "0"+ban, 2*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	// us pushes against its half of the limit for every key without
	// deciding any, so that only the coordinator writes them, until the
	// test ends (demand that stops lapses, and the shares go back).
	keys := []string{"fresh", "used", "old", "banned", "planned"}
	defer countEvery(100*time.Millisecond, func(n int) {
		for _, key := range keys {
			if key == "planned" {
				us.regions[n%2].CountWith(globalZone, key, true, 1, plan)
			} else {
				us.regions[n%2].Count(globalZone, key, true, 1)
			}
		}
	})()
	for _, key := range keys {
		f.waitShare(1, key, distributed.ShareScale*9/10, 10*time.Second)
	}

	// The coordinator wrote the fresh key as a full bucket at its old
	// share, kept the old key's state, and the ban with the rescaled TAT.
	if ttl := rc.PTTL(ctx, redisKey("fresh")).Val(); ttl <= 0 {
		t.Errorf("the raised key with no state has no state after the raise (PTTL %v): want a full bucket at its old share", ttl)
	}
	if ttl := rc.PTTL(ctx, redisKey("old")).Val(); ttl < 5*time.Second {
		t.Errorf("the raised key with state expires in %v, want it kept until it fills at the new share (9.5 s from the raise)", ttl)
	}
	if v := rc.Get(ctx, redisKey("banned")).Val(); !strings.HasSuffix(v, ban) || strings.HasPrefix(v, "0,") {
		t.Errorf("the raised banned key holds %q, want a TAT and its ban as it was, <TAT>%s", v, ban)
	}
	if ttl := rc.PTTL(ctx, redisKey("banned")).Val(); ttl < 100*time.Second {
		t.Errorf("the raised banned key expires in %v, want the ban remembered as long as before (~120 s)", ttl)
	}
	// Past the end the old key's state had.
	for serverNow() < start+2100000 {
		time.Sleep(20 * time.Millisecond)
	}

	// At once, the tokens each key had at the old share and what the new
	// rate refilled since the raise (at most since start); without the
	// coordinator's rescale, a key with no state would have the new
	// share's whole burst (19), "used" 11 of it, "planned" rescaled with
	// the zone's span instead of its plan's 10.
	for _, c := range []struct {
		key    string
		limit  algorithms.Limit
		tokens int64 // at the old share
	}{{"fresh", limit, 10}, {"used", limit, 6}, {"old", limit, 10}, {"planned", plan, 6}} {
		share := f.share(1, c.key)
		if share < distributed.ShareScale*9/10 {
			t.Fatalf("%s: the region's share fell back to %d before the burst", c.key, share)
		}
		raised := distributed.Scale(c.limit, share)
		admitted := decide(c.key, c.limit, 20)
		refilled := (serverNow() - start) / (raised.EmissionInterval / 1000)
		if bound := c.tokens + 1 + refilled; admitted > bound {
			t.Errorf("%s: the raised region admitted %d of a burst of 20 at once, want at most the %d tokens it had at its old share, one more, and %d refilled at the new rate since", c.key, admitted, c.tokens, refilled)
		}
		if admitted < c.tokens {
			t.Errorf("%s: the raised region admitted %d of a burst of 20, want at least the %d tokens it had", c.key, admitted, c.tokens)
		}
		t.Logf("%s: admitted %d of 20 at once after the raise (%d tokens before, %d refilled since)", c.key, admitted, c.tokens, refilled)
	}
}

// An async region's raise adds no tokens at once either: the coordinator
// rescales the key's hash (its TAT, field t) as it does a strict key, so
// the leases it reserved hold and what is left of the burst is the tokens
// the key had at its old share.
func TestGlobalRaisedAsyncRegionGainsNoBurstAtOnce(t *testing.T) {
	// 600 in 10 minutes, burst 40: T = 1 s, a burst's span 40 s. At half
	// the limit the key has 20 tokens at most; raised to 0.9 it would have
	// 36 less its debt at once without the rescale.
	// The regional timeout is 1 s, not 200 ms: an async view goes stale
	// (and Decide errors) 2 syncs + the timeout after its last sync, which
	// a loaded machine's stalls reach at 200 ms; the rescale is what this
	// test is about.
	limit := algorithms.NewLimit(600, int64(10*time.Minute), 40)
	f := startGlobalFleetWith(t, fleetOptions{mode: "async", interval: 200 * time.Millisecond, lease: 5 * time.Second, timeout: time.Second, limit: limit}, nil)
	f.waitContact()
	us := f.regions[1]
	rc, ctx := us.redis.Client(), t.Context()
	const key = "k"
	redisKey := "tally:" + globalZone + ".async:" + key
	for i := range 2 {
		if r, err := stepDecide(us.shared[i], ctx, globalZone, key, limit, 1); err != nil || !r.Allowed {
			t.Fatalf("the key's first decision at half the limit: %+v, %v", r, err)
		}
	}
	// The two decisions are demand too: until the global store heard it
	// and, once the region reported it gone, us is back at half the limit
	// (the raise below must start from half, not from a raise for them).
	demand := func() bool {
		return f.global.Client().HExists(ctx, "tally:g.z:"+globalZone+":"+key, "x.us").Val()
	}
	waitFor(t, 10*time.Second, "the two decisions' demand in the global store", demand)
	waitFor(t, 20*time.Second, "their demand gone and us back at half the limit", func() bool {
		return !demand() && f.share(1, key) == distributed.ShareScale/2
	})
	// Until both instances handed back the rest of their fresh shares
	// (their records are dormant): the key's tokens are in Redis, not in
	// the instances' leases.
	if err := waitUntil(20*time.Second, func() bool {
		tat, err := strconv.ParseInt(rc.HGet(ctx, redisKey, "t").Val(), 10, 64)
		now := rc.Time(ctx).Val().UnixMicro()
		return err == nil && tat-now < 10e6
	}); err != nil {
		t.Fatalf("the instances kept their fresh shares of %s: %v", key, err)
	}
	start := time.Now()
	defer countEvery(100*time.Millisecond, func(n int) {
		us.regions[n%2].Count(globalZone, key, true, 1)
	})()
	f.waitShare(1, key, distributed.ShareScale*9/10, 10*time.Second)
	raised := distributed.Scale(limit, f.share(1, key))
	var admitted int64
	for n := range 80 { // 2 s: every lease the key can give, many syncs
		r, err := stepDecide(us.shared[n%2], ctx, globalZone, key, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
		time.Sleep(25 * time.Millisecond)
	}
	// The old share's whole burst (20), one more, and what the new rate
	// refilled since the raise was asked for; without the rescale the key
	// has the new share's burst (36+) less its debt (2 tokens at the old
	// share) at once.
	refilled := int64(time.Since(start)) / raised.EmissionInterval
	if bound := 20 + 1 + refilled; admitted > bound {
		t.Errorf("the raised async region admitted %d at once, want at most the 20 tokens of its old share, one more, and %d refilled at the new rate", admitted, refilled)
	}
	t.Logf("admitted %d after the raise (%d refilled at the new rate since it was asked for)", admitted, refilled)
}
