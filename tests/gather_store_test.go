package tests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// Many concurrent gathers, each of 4 callers (three peeking a key of their
// own zone, one peeking twice, one finishing without a peek), on one
// strict store: every peek reads its own key's state, and the Redis saw
// fewer script calls than peeks. Under -race: the gather is shared state.
func TestGatherPeeksEachKeyInOneBatch(t *testing.T) {
	rs := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{rs.Addr}, Timeout: time.Second}, nil)
	ctx := context.Background()
	l := algorithms.NewLimit(100, int64(time.Hour), 0)
	const gathers = 40
	// Key k of zone z has spent z+k%7+1.
	spent := func(z, k int) int64 { return int64(z + k%7 + 1) }
	for k := range gathers {
		for z := range 3 {
			if _, err := stepDecide(s, ctx, fmt.Sprint("z", z), fmt.Sprint("k", k), l, spent(z, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	logEveryCommand(t, rs)
	var wg sync.WaitGroup
	errs := make(chan error, gathers*4)
	for k := range gathers {
		g := distributed.NewGather(4)
		for caller := range 4 {
			wg.Go(func() {
				ctx, done := g.Caller(ctx)
				defer done()
				if caller == 3 {
					return // a zone answered without the store
				}
				key := fmt.Sprint("k", k)
				peeks := 1
				if caller == 0 {
					peeks = 2 // the second goes on its own
				}
				for range peeks {
					r, err := stepPeek(s, ctx, fmt.Sprint("z", caller), key, l)
					if want := 100 - spent(caller, k); err != nil || r.Remaining != want {
						errs <- fmt.Errorf("gather %d, zone z%d: remaining %d, %v; want %d", k, caller, r.Remaining, err, want)
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// 4 peeks per gather: 3 in one call and 1 alone, so 2 calls each.
	if calls := len(scriptsLogged(t, rs, ":k")); calls != 2*gathers {
		t.Errorf("%d script calls for %d gathers of 4 peeks, want %d", calls, gathers, 2*gathers)
	}
}
