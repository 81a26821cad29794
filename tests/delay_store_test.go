package tests

// Delay in strict mode at the store (issue 25): the reservation is made in
// the decision's own script step, with or without a ban.

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// 5 per second, burst 1, ahead 1s: the first passes, the next 5 wait 200ms
// more each, the 7th is denied with its turn (1.2s) as retry; in a zone
// with ban that denial starts the ban, and the key is then denied for it.
func TestStrictDelayReservesInTheScriptStep(t *testing.T) {
	srv := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 2 * time.Second}, nil)
	limit := zones.Config{Events: 5, Window: time.Second, Burst: 1}.Limit()
	ahead := int64(time.Second)
	ctx := context.Background()
	rule := zones.BanRule{First: time.Minute}
	for _, ban := range []bool{false, true} {
		key := "plain"
		if ban {
			key = "banned"
		}
		var delays []time.Duration
		for i := range 7 {
			var r algorithms.Result
			var banned zones.StoreBan
			var err error
			if ban {
				r, banned, err = stepDecideBanAhead(s, ctx, "smooth", key, limit, 1, rule, ahead)
			} else {
				r, err = stepDecideAhead(s, ctx, "smooth", key, limit, 1, ahead)
			}
			if err != nil {
				t.Fatal(err)
			}
			if i < 6 {
				if !r.Allowed || r.Remaining != 0 && i > 0 {
					t.Fatalf("ban %v, request %d: %+v, want admitted", ban, i, r)
				}
				delays = append(delays, time.Duration(r.Delay))
				continue
			}
			switch {
			case r.Allowed:
				t.Fatalf("ban %v: the 7th (turn 1.2s away, ahead 1s) was admitted: %+v", ban, r)
			case !ban && (r.RetryAfter < int64(1150*time.Millisecond) || r.RetryAfter > int64(1200*time.Millisecond)):
				t.Errorf("the 7th's retry %v, want its turn ~1.2s (counting the reservations)", time.Duration(r.RetryAfter))
			case ban && (!banned.Banned || !banned.Started || r.RetryAfter < int64(59*time.Second)):
				t.Errorf("ban: the 7th %+v %+v, want a ban of 1m started", r, banned)
			}
		}
		for i, d := range delays {
			want := time.Duration(i) * 200 * time.Millisecond
			if d > want || d < want-50*time.Millisecond {
				t.Errorf("ban %v: request %d waits %v, want %v (less the time the requests took)", ban, i, d, want)
			}
		}
	}
}
