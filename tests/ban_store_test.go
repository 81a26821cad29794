package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// gcra.lua's ban ops on Redis's own table, with an explicit clock: a denial
// starts the ban in the same step, bans escalate 10s, 20s, 40s, 40s and
// start over once the key has not been banned for max; refunds, charges
// and plain steps keep the ban; the key's TTL reaches the ban's end plus
// the memory.
func TestLuaBansEscalateAndKeepTheirTTL(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.Client()
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 5 * time.Second}, nil)
	ctx := context.Background()
	const sec = int64(1_000_000)
	ban := distributed.Op("b10000000,40000000")
	l := algorithms.Limit{EmissionInterval: sec, Burst: 1} // one a second
	now := int64(1_700_000_000) * sec
	step := func(op distributed.Op) algorithms.Result {
		t.Helper()
		r, err := s.EvalAt(ctx, op, "z", "k", l, 1, now)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	banOf := func(want int64, level int64) {
		t.Helper()
		if r := step(ban); !r.Allowed {
			t.Fatalf("at the ban's end the key is not full: %+v", r)
		}
		r := step(ban)
		if r.Allowed || r.RetryAfter != want*sec || r.ResetAfter != -(9+2*level) {
			t.Fatalf("denial: %+v, want a ban of %ds at level %d started (reset %d)", r, want, level, -(9 + 2*level))
		}
		if r := step(ban); r.RetryAfter != want*sec || r.ResetAfter != -(8+2*level) {
			t.Fatalf("during the ban: %+v, want banned, not started again", r)
		}
		if r := step(distributed.OpRefund); r.Allowed && r.Remaining != 0 {
			t.Fatalf("refund: %+v", r)
		}
		v := rdb.Get(ctx, "tally:z:k").Val()
		if strings.Count(v, ",") != 3 {
			t.Fatalf("the banned key holds %q, want TAT,end,remembered until,level", v)
		}
		if ttl := rdb.PTTL(ctx, "tally:z:k").Val(); ttl < time.Duration(want+40-1)*time.Second {
			t.Fatalf("TTL %v, want the ban's end plus the memory (%ds)", ttl, want+40)
		}
		now += want * sec
	}
	banOf(10, 1)
	banOf(20, 2)
	banOf(40, 3)
	banOf(40, 4)
	now += 40*sec + 1 // not banned for max: starts over
	banOf(10, 1)
	// A plain decision on a banned key keeps the ban (it does not see it).
	step(ban)
	step(ban)
	if r := step(distributed.OpDecide); r.Allowed {
		t.Fatalf("plain decide inside the rate: %+v", r)
	}
	if r := step(ban); r.ResetAfter != -(8 + 2*2) { // the ban of level 2 the second step started
		t.Fatalf("after a plain step the ban is gone: %+v", r)
	}
}
