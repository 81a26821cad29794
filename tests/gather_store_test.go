package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// Many concurrent gathers, each of 5 callers (three peeking a key of their
// own zone, the first of them twice, one reading a concurrency zone's
// slots, one finishing without a read), on one strict store: every read
// finds its own key's state, each rate peek in one PTTL. Under
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
	// Every read waits for its gather's batch, which the last caller to
	// arrive sends: a batch never sent must fail the read in seconds,
	// saying so, not hang the suite (nor may its error: errs holds one
	// per read).
	const readWait = 10 * time.Second
	gctx, cancel := context.WithTimeout(ctx, readWait)
	defer cancel()
	stuck := func(err error) error {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: no reply by the read's deadline (the store's timeout, at most %v): the gather's batch was never sent", err, readWait)
		}
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, gathers*5) // at most one error per read, 5 reads per gather
	for k := range gathers {
		g := distributed.NewGather(5)
		for caller := range 5 {
			wg.Go(func() {
				ctx, done := g.Caller(gctx)
				defer done()
				key := fmt.Sprint("k", k)
				switch caller {
				case 3:
					return // a zone answered without the store
				case 4: // another script's read: a concurrency zone's slots
					if n, err := s.Slots(ctx, "conc", key); err != nil || n != int64(k%3) {
						errs <- fmt.Errorf("gather %d: %d slots, %v; want %d", k, n, stuck(err), k%3)
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
						errs <- fmt.Errorf("gather %d, zone z%d: remaining %d, %v; want %d", k, caller, r.Remaining, stuck(err), want)
					}
				}
			})
		}
	}
	waitGroupWithin(t, &wg, readWait+5*time.Second, fmt.Sprintf("the reads of %d gathers (each waits for its gather's batch)", gathers))
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 5 {
		t.Errorf("and %d more reads failed", n-5)
	}
	// 5 reads per gather: the slots' in a script call, and 4 rate peeks
	// (zones without a ban), each a PTTL of the key.
	if calls := len(scriptsLogged(t, rs, ":k")); calls != gathers {
		t.Errorf("%d script calls for %d gathers of 5 reads, want %d", calls, gathers, gathers)
	}
	log, err := rs.Client().SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	pttls := 0
	for _, e := range log {
		if len(e.Args) == 2 && strings.EqualFold(e.Args[0], "pttl") {
			pttls++
		}
	}
	if pttls != 4*gathers {
		t.Errorf("%d PTTLs for %d gathers of 4 rate peeks, want %d", pttls, gathers, 4*gathers)
	}
}

// waitGroupWithin waits for wg, failing the test after timeout with what
// it waited for: a goroutine stuck on a reply that never comes fails the
// test in seconds instead of hanging the suite (its goroutines are left).
func waitGroupWithin(t *testing.T, wg *sync.WaitGroup, timeout time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}
