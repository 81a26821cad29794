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
	const interval = 200 * time.Millisecond
	f := startGlobalFleet(t, interval, 5*time.Second)
	f.waitContact()
	us := f.regions[1]
	// us pushes against its half of the limit (5 a second) while its
	// bucket stays full and the key has no state in Redis: the drive's
	// decisions use an emission interval of 1 ns, so the key expires a
	// millisecond after each, but count for the region's demand as any.
	tiny := algorithms.Limit{EmissionInterval: 1, Burst: globalLimit.Burst}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for n := 0; n < 500; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := us.shared[n%2].Decide(context.Background(), globalZone, "k", tiny, 1); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	f.waitShare(1, "k", distributed.ShareScale*9/10, 10*time.Second)
	close(stop)
	<-done
	// At once, the whole burst: the region had a full bucket at half the
	// limit (10), and gains 19 tokens only as its new rate refills them
	// (9.5 a second). Without the coordinator's write of the raised key it
	// would admit 19.
	admitted := 0
	for n := range 20 {
		r, err := us.shared[n%2].Decide(context.Background(), globalZone, "k", globalLimit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted > 11 {
		t.Errorf("the raised region admitted %d of a burst of 20 at once, want at most its old burst (10) and one refilled", admitted)
	}
	if admitted == 0 {
		t.Error("the raised region admitted nothing")
	}
	t.Logf("admitted %d of 20 at once after the raise", admitted)
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
