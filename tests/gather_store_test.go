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

// Many concurrent gathers, each of 5 callers (three peeking a key of their
// own zone, the first of them twice, one reading a concurrency zone's
// slots, one finishing without a read), on one strict store: every read
// finds its own key's state, and the rate peeks went in one call. Under
// -race: the gather is shared state.
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
	// Key k holds k%3 concurrency slots of zone conc.
	for k := range gathers {
		for range k % 3 {
			if slot, _, err := s.Acquire(ctx, "conc", fmt.Sprint("k", k), 10, time.Minute); err != nil || slot == "" {
				t.Fatalf("acquire: %q, %v", slot, err)
			}
		}
	}
	logEveryCommand(t, rs)
	var wg sync.WaitGroup
	errs := make(chan error, gathers*4)
	for k := range gathers {
		g := distributed.NewGather(5)
		for caller := range 5 {
			wg.Go(func() {
				ctx, done := g.Caller(ctx)
				defer done()
				key := fmt.Sprint("k", k)
				switch caller {
				case 3:
					return // a zone answered without the store
				case 4: // another script's read: a concurrency zone's slots
					if n, err := s.Slots(ctx, "conc", key); err != nil || n != int64(k%3) {
						errs <- fmt.Errorf("gather %d: %d slots, %v; want %d", k, n, err, k%3)
					}
					return
				}
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
	// 5 reads per gather: 3 rate peeks in one call, the slots in one of
	// their own beside it, and a second rate peek alone: 3 calls each.
	if calls := len(scriptsLogged(t, rs, ":k")); calls != 3*gathers {
		t.Errorf("%d script calls for %d gathers of 5 reads, want %d", calls, gathers, 3*gathers)
	}
}
