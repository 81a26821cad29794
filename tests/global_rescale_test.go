package tests

// A share that rises adds no tokens at once (issue 29's bound): the strict
// store rescales a shared key's TAT when its share has risen since it was
// written, and a strict region's coordinator writes a raised key with no
// state as a full bucket at its old share before publishing the raise.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// decideN decides key n times at limit and returns the remaining counts of
// the admissions and how many were denied.
func decideN(t *testing.T, s *distributed.Store, key string, limit algorithms.Limit, n int) (remaining []int64, denied int) {
	t.Helper()
	for range n {
		r, err := s.Decide(context.Background(), globalZone, key, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			remaining = append(remaining, r.Remaining)
		} else {
			denied++
		}
	}
	return remaining, denied
}

func TestSharedKeyKeepsItsTokensWhenItsShareRises(t *testing.T) {
	rs := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{rs.Addr}, Timeout: 2 * time.Second}, nil)
	// 600 an hour, burst 20: T = 6 s, so nothing refills during the test.
	limit := algorithms.NewLimit(600, int64(time.Hour), 20)
	half, whole, quarter := distributed.Scale(limit, distributed.ShareScale/2),
		distributed.Scale(limit, distributed.ShareScale), distributed.Scale(limit, distributed.ShareScale/4)

	// At half the limit (burst 10) four admissions leave 6 tokens.
	if rem, _ := decideN(t, s, "k", half, 4); len(rem) != 4 || rem[3] != 6 {
		t.Fatalf("at half the limit: remaining %v, want 9 8 7 6", rem)
	}
	// Its TTL is its resetAfter (4 × 12 s) plus the burst's span (10 × 12
	// s): a key full at its share keeps its state for a raise.
	if ttl := rs.Client().PTTL(context.Background(), s.RedisKey(globalZone, "k")).Val(); ttl <= 167*time.Second || ttl > 168*time.Second {
		t.Errorf("the shared key's TTL is %v, want its resetAfter and the burst's span, 168 s", ttl)
	}
	// Raised to the whole limit (burst 20) the key still has 6 tokens: its
	// debt of 4 × 12 s would be 8 of 20 tokens (12 left) without the
	// rescale.
	rem, denied := decideN(t, s, "k", whole, 8)
	if want := []int64{5, 4, 3, 2, 1, 0}; !equalInts(rem, want) || denied != 2 {
		t.Errorf("after the raise to the whole limit: remaining %v and %d denied, want %v and 2 denied", rem, denied, want)
	}
	// A cut takes tokens away and never gives any.
	if rem, _ := decideN(t, s, "k", quarter, 2); len(rem) != 0 {
		t.Errorf("after the cut to a quarter: admitted with remaining %v, want none", rem)
	}
	v, err := rs.Client().Get(context.Background(), s.RedisKey(globalZone, "k")).Result()
	if err != nil || !strings.HasSuffix(v, "/250000") {
		t.Errorf("the key's value is %q (%v), want its TAT with the share it was written at, /250000", v, err)
	}

	// A key written as a full bucket at half the limit, as a coordinator
	// writes a raised key with no state, has 10 tokens at the whole limit.
	now, err := rs.Client().Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Client().Set(context.Background(), s.RedisKey(globalZone, "fresh"), // as plantScript writes it
		strconv.FormatInt(now.UnixMicro(), 10)+"/500000", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if rem, denied := decideN(t, s, "fresh", whole, 12); len(rem) != 10 || denied != 2 {
		t.Errorf("a key full at half the limit, decided at the whole limit: %d admitted (remaining %v), want 10", len(rem), rem)
	}
	// A key of a zone of scope region is stored as before.
	if rem, _ := decideN(t, s, "plain", limit, 1); len(rem) != 1 {
		t.Fatal("a plain key was denied")
	}
	if v, _ := rs.Client().Get(context.Background(), s.RedisKey(globalZone, "plain")).Result(); strings.Contains(v, "/") {
		t.Errorf("a key of scope region holds %q: no share belongs there", v)
	}
}

func TestGlobalRaisedRegionGainsNoBurstAtOnce(t *testing.T) {
	// 600 in 10 minutes, burst 20: T = 1 s and a burst's span B·T = 20 s
	// at every share, so that a raise from half to 0.95 takes 9.5 s to
	// fill up at the new share, longer than any delay of the test.
	limit := algorithms.NewLimit(600, int64(10*time.Minute), 20)
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
	// "fresh" has no state in Redis. "old" was full at its half share 12 s
	// ago, and its state, as a key last decided then keeps it, ends in 2 s:
	// before its first decision at the new share.
	start := serverNow()
	if err := rc.Set(ctx, redisKey("old"), strconv.FormatInt(start-12e6, 10)+"/500000", 2*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	// us pushes against its half of the limit for both keys without
	// deciding either, so that only the coordinator writes them, until the
	// test ends (demand that stops lapses, and the shares go back).
	stop := make(chan struct{})
	done := make(chan struct{})
	defer func() { close(stop); <-done }()
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n := 0; n < 1000; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, key := range []string{"fresh", "old"} {
				us.regions[n%2].Count(globalZone, key, true, 1)
			}
		}
	}()
	f.waitShare(1, "fresh", distributed.ShareScale*9/10, 10*time.Second)
	f.waitShare(1, "old", distributed.ShareScale*9/10, 10*time.Second)

	// The coordinator wrote the fresh key as a full bucket at its old
	// share, and kept the old key's state for a burst's span.
	v, err := rc.Get(ctx, redisKey("fresh")).Result()
	planted, _ := strconv.ParseInt(strings.TrimSuffix(v, "/500000"), 10, 64)
	if err != nil || !strings.HasSuffix(v, "/500000") || planted == 0 {
		t.Fatalf("the raised key with no state holds %q (%v), want a TAT at the old share, <now>/500000", v, err)
	}
	if ttl := rc.PTTL(ctx, redisKey("old")).Val(); ttl < 10*time.Second {
		t.Errorf("the raised key with state expires in %v, want it kept for the span (20 s), at least the 9.5 s it takes to fill at the new share", ttl)
	}
	// Past the end the old key's state had.
	for serverNow() < start+2100000 {
		time.Sleep(20 * time.Millisecond)
	}

	// At once, the tokens each key had at the old share (10) and what the
	// new rate refilled since its raise; without the coordinator's care, a
	// key with no state would have the new share's whole burst (19).
	burst := func(key string) int64 {
		var admitted int64
		for n := range 20 {
			r, err := us.shared[n%2].Decide(ctx, globalZone, key, limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			}
		}
		return admitted
	}
	for _, c := range []struct {
		key   string
		since int64 // µs, Redis's clock: at or before the key's raise
	}{{"fresh", planted}, {"old", start}} {
		share := f.share(1, c.key)
		if share < distributed.ShareScale*9/10 {
			t.Fatalf("%s: the region's share fell back to %d before the burst", c.key, share)
		}
		raised := distributed.Scale(limit, share)
		admitted := burst(c.key)
		refilled := (serverNow() - c.since) / (raised.EmissionInterval / 1000)
		if bound := 10 + 1 + refilled; admitted > bound {
			t.Errorf("%s: the raised region admitted %d of a burst of 20 at once, want at most its old burst (10), one more, and %d refilled at the new rate since the raise", c.key, admitted, refilled)
		}
		if admitted < 10 {
			t.Errorf("%s: the raised region admitted %d of a burst of 20, want at least the old burst (10)", c.key, admitted)
		}
		t.Logf("%s: admitted %d of 20 at once after the raise (%d refilled since)", c.key, admitted, refilled)
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
