package tests

// Delay in async mode (issue 25): reservations come from the key's lease,
// and Redis counts what the lease did not cover.

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

// One async store, 5 per second with burst 1, delay 3s: of 20 requests at
// once, 1 passes and the next 15 are admitted for later, their turns 200ms
// apart; the rest are denied with a retry beyond the delay. After a sync,
// Redis counts every reservation: the key's TAT is 16 intervals on, and the
// next request's turn comes after them.
func TestAsyncDelayReservesFromTheLeaseAndRedisCountsIt(t *testing.T) {
	rs := startRedis(t)
	const interval = 100 * time.Millisecond
	stores := openAsyncStores(t, 1, rs.Addr, interval, time.Second)
	a := stores[0]
	limit := zones.Config{Events: 5, Window: time.Second, Burst: 1}.Limit()
	const T = 200 * time.Millisecond
	ahead := int64(3 * time.Second)
	ctx := context.Background()

	start := time.Now()
	var turns []time.Time
	denied := 0
	for range 20 {
		r, err := stepDecideAhead(a, ctx, "smooth", "k", limit, 1, ahead)
		switch {
		case err != nil:
			t.Fatal(err)
		case !r.Allowed:
			denied++
			if r.RetryAfter <= ahead {
				t.Errorf("denied with retry %v, within the delay", time.Duration(r.RetryAfter))
			}
		default:
			turns = append(turns, time.Now().Add(time.Duration(r.Delay)))
		}
	}
	if len(turns) != 16 || denied != 4 {
		t.Fatalf("%d admitted and %d denied of 20, want 16 (1 at once, 15 within 3s) and 4", len(turns), denied)
	}
	if d := turns[0].Sub(start); d > 50*time.Millisecond {
		t.Errorf("the first request's turn is %v away, want at once", d)
	}
	for i := 1; i < len(turns); i++ {
		if gap := turns[i].Sub(turns[i-1]); gap < T-5*time.Millisecond || gap > T+5*time.Millisecond {
			t.Errorf("turns %d and %d are %v apart, want %v", i-1, i, gap, T)
		}
	}

	// Redis counts the 16: the hash's TAT (field t) is 16 intervals after
	// the first request, less the time since.
	waitForSyncs(t, stores, interval)
	rdb := rs.Client()
	var nowUs int64
	if tm, err := rdb.Time(ctx).Result(); err == nil {
		nowUs = tm.UnixMicro()
	}
	raw, err := rdb.HGet(ctx, a.RedisKey("smooth", "k"), "t").Result()
	if err != nil {
		t.Fatalf("the key's TAT in Redis: %v", err)
	}
	tat, _ := strconv.ParseInt(raw, 10, 64)
	ahead16 := time.Duration(tat-nowUs) * time.Microsecond
	want := 16*T - time.Since(start)
	if ahead16 < want-150*time.Millisecond || ahead16 > want+150*time.Millisecond {
		t.Errorf("Redis has the key's TAT %v ahead, want ~%v (16 intervals from the first request)", ahead16, want.Round(time.Millisecond))
	}
	// The next request's turn comes after every reservation.
	r, err := stepDecideAhead(a, ctx, "smooth", "k", limit, 1, ahead)
	if err != nil {
		t.Fatal(err)
	}
	if r.Allowed {
		turn := time.Now().Add(time.Duration(r.Delay))
		if turn.Before(turns[15].Add(T - 10*time.Millisecond)) {
			t.Errorf("after the sync a new turn %v after the first, before the last reserved one (%v) and an interval", turn.Sub(turns[0]), turns[15].Sub(turns[0]))
		}
	}
}
