package zones

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// Estimates that take up to what is left: 20 requests at once of a key
// with 50 left, each estimated at 30, take 30 and then the 20 left, and no
// more; a key with 3 left still makes a request estimated at 100 (it takes
// the 3); a key with none makes none. In a rate zone and a quota zone.
func TestEstimatesTakeUpToWhatIsLeftUnderConcurrency(t *testing.T) {
	for _, kind := range []string{"rate", "quota"} {
		t.Run(kind, func(t *testing.T) {
			var z *Zone
			now := monotime.Now()
			if kind == "rate" {
				c := Config{Name: "tokens", Events: 1000, Window: 24 * time.Hour, Burst: 1000}
				z = mustNew(c, newTestState(t, c), nil)
			} else {
				var clk *testClock
				z, clk = newQuotaZone(t, Config{Name: "q", Quota: 1000, Period: algorithms.Day}, nil, "2026-03-15T10:00:00Z")
				now = clk.now()
			}
			ctx := context.Background()
			take := func(cost int64) Ticket[struct{}] {
				tk := Ticket[struct{}]{Zone: z, Key: "k", Plan: z.Plan(), Cost: cost, UpTo: true}
				tk.Admit(ctx, now)
				return tk
			}
			if tk := take(950); !tk.Allowed || tk.Cost != 950 {
				t.Fatalf("first request: %+v cost %d, want allowed at 950", tk.Decision, tk.Cost)
			}
			var admitted, taken atomic.Int64
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					if tk := take(30); tk.Allowed {
						admitted.Add(1)
						taken.Add(tk.Cost)
					}
				})
			}
			wg.Wait()
			if admitted.Load() != 2 || taken.Load() != 50 {
				t.Fatalf("20 requests at once with 50 left: %d admitted taking %d, want 2 taking 50", admitted.Load(), taken.Load())
			}
			if tk := take(30); tk.Allowed {
				t.Fatalf("a request with nothing left: %+v, want denied", tk.Decision)
			}
			// Settle one of them at 10 less: 10 left, and a request
			// estimated at 100 takes them.
			tk := Ticket[struct{}]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 30, UpTo: true, Decision: Decision{Allowed: true}}
			if err := tk.Charge(ctx, now, 20); err != nil {
				t.Fatal(err)
			}
			if tk := take(100); !tk.Allowed || tk.Cost != 10 {
				t.Fatalf("a request estimated at 100 with 10 left: %+v cost %d, want allowed taking 10", tk.Decision, tk.Cost)
			}
			// An estimate over the burst takes at most the burst.
			big := Ticket[struct{}]{Zone: z, Key: "fresh", Plan: z.Plan(), Cost: 5000, UpTo: true}
			if big.Admit(ctx, now); !big.Allowed || big.Cost != 1000 {
				t.Fatalf("an estimate of 5000 with a burst of 1000: %+v cost %d, want allowed taking 1000", big.Decision, big.Cost)
			}
		})
	}
}
