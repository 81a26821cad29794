package zones

import (
	"context"
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
