package zones

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// A request through two zones with delay waits for the later of the turns
// they reserved, whichever zone comes first: served at the earlier one, it
// would pass the slower zone's rate.
func TestRequestThroughTwoDelayZonesWaitsForTheLaterTurn(t *testing.T) {
	for _, order := range []string{"later turn first", "later turn last"} {
		t.Run(order, func(t *testing.T) {
			slow := Config{Name: "slow", Events: 1, Window: 4 * time.Second, Burst: 1, Delay: 10 * time.Second}
			fast := Config{Name: "fast", Events: 1, Window: time.Second, Burst: 1, Delay: 10 * time.Second}
			zs := []*Zone{mustNew(slow, newTestState(t, slow), nil), mustNew(fast, newTestState(t, fast), nil)}
			if order == "later turn last" {
				zs[0], zs[1] = zs[1], zs[0]
			}
			ctx, now := context.Background(), monotime.Now()
			for _, z := range zs { // the key's burst, at once
				if d := z.Decide(ctx, "k", now); !d.Allowed || d.Delay != 0 {
					t.Fatalf("%s, first request: %+v, want allowed at once", z.Name, d)
				}
			}
			tickets := make([]Ticket[struct{}], len(zs))
			for i, z := range zs {
				tickets[i] = Ticket[struct{}]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 1}
			}
			before := monotime.Now()
			adm := Admit(ctx, tickets, now, func(int) {}, func(int64) (context.Context, bool) {
				t.Fatal("wait called with no concurrency zone")
				return ctx, false
			})
			after := monotime.Now()
			if adm.Denied != -1 || adm.Gone {
				t.Fatalf("second request: %+v, want admitted for later by both zones", adm)
			}
			for _, tk := range tickets {
				if want := tk.Zone.Window; !tk.Allowed || tk.Delay < want-time.Duration(after-now) || tk.Delay > want {
					t.Fatalf("%s: %+v, want admitted for later, its turn %v away", tk.Zone.Name, tk.Decision, want)
				}
			}
			// The slow zone's turn, 4s away, not the fast one's, 1s away.
			if lo, hi := before+int64(4*time.Second)-(after-now), after+int64(4*time.Second); adm.Turn < lo || adm.Turn > hi {
				t.Fatalf("the request's turn is %v from now, want the slow zone's, 4s", time.Duration(adm.Turn-before))
			}
		})
	}
}

// Estimates settled by many requests at once leave the key exactly where
// their actual costs put it: each request takes its estimate, then is
// charged or refunded the difference; nothing is lost between them.
func TestSettledEstimatesLeaveTheSumOfActualCosts(t *testing.T) {
	// 10000 a day: time stands still for the test's purpose (one unit
	// frees every 8.64 s).
	c := Config{Name: "tokens", Events: 10000, Window: 24 * time.Hour, Burst: 10000}
	z := mustNew(c, newTestState(t, c), nil)
	ctx, now := context.Background(), monotime.Now()
	const workers, each = 16, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				// Estimate 5, actual 2 or 4 or 6: refunds and charges mixed.
				tk := Ticket[struct{}]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 5}
				tk.Admit(ctx, now)
				if !tk.Allowed {
					t.Errorf("worker %d request %d: denied with %d left", w, i, tk.Remaining)
					return
				}
				if err := tk.Charge(ctx, now, int64(2+2*((w+i)%3))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	var want int64
	for w := range workers {
		for i := range each {
			want += int64(2 + 2*((w+i)%3))
		}
	}
	d := readKey(t, z, "k", now)
	if used := c.Burst - d.Remaining; used != want {
		t.Fatalf("after %d settled requests: %d used, want their actual costs' sum %d", workers*each, used, want)
	}
	// A denied ticket (a dry-run zone's: the request went on) took
	// nothing, so all of its cost is charged.
	tk := Ticket[struct{}]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 5}
	tk.Decision = Decision{Allowed: false}
	if err := tk.Charge(ctx, now, 7); err != nil {
		t.Fatal(err)
	}
	if d := readKey(t, z, "k", now); c.Burst-d.Remaining != want+7 {
		t.Fatalf("a denied ticket settled at 7: %d used, want %d", c.Burst-d.Remaining, want+7)
	}
}
