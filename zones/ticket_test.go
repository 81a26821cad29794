package zones

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// A post-charged zone's check takes nothing, so a later zone's denial gives
// nothing back: a key with 3 of 5 spent keeps 2.
func TestCancelOfAPostChargedCheckRefundsNothing(t *testing.T) {
	ctx, now := context.Background(), monotime.Now()
	pc := Config{Name: "tokens", Events: 5, Window: time.Hour}
	strict := Config{Name: "strict", Events: 1, Window: time.Hour}
	tokens, other := mustNew(pc, newTestState(t, pc), nil), mustNew(strict, newTestState(t, strict), nil)
	p := tokens.Plan()
	tokens.Charge(ctx, "k", now, &p, 3)
	if d := other.Decide(ctx, "k", now); !d.Allowed {
		t.Fatalf("the other zone's only event: %+v", d)
	}
	tickets := []Ticket[struct{}]{
		{Zone: tokens, Key: "k", Plan: tokens.Plan(), Cost: 1, PostCharged: true},
		{Zone: other, Key: "k", Plan: other.Plan(), Cost: 1},
	}
	adm := Admit(ctx, tickets, now, func(int) {}, func(int64) (context.Context, bool) { return ctx, true })
	if adm.Denied != 1 || !tickets[0].Allowed {
		t.Fatalf("admission %+v, tickets %+v: want the check allowed, the second zone denying", adm, tickets)
	}
	read := Ticket[struct{}]{Zone: tokens, Key: "k", Plan: tokens.Plan()}
	if d, _ := read.Read(ctx, now); d.Remaining != 2 {
		t.Fatalf("after the later zone denied: %d remaining, want 2 (3 of 5 spent, the check took nothing)", d.Remaining)
	}
}

// An exempt or deny override's ticket pays nothing after its response: the
// key is still at its full burst.
func TestWaivedTicketIsNotChargedAfterTheResponse(t *testing.T) {
	for _, o := range []Override{{ID: "e", Key: "k", Exempt: true}, {ID: "d", Key: "k", Deny: true}} {
		ctx, now := context.Background(), monotime.Now()
		c := Config{Name: "tokens", Events: 10, Window: time.Hour}
		z := mustNew(c, newTestState(t, c), nil)
		tk := Ticket[struct{}]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 1, PostCharged: true, Override: &o}
		tk.Admit(ctx, now)
		if err := tk.Charge(ctx, now, 5); err != nil {
			t.Fatal(err)
		}
		p := z.Plan()
		if d := z.DecideWith(ctx, "k", now, &p, 10); !d.Allowed {
			t.Fatalf("exempt %v, deny %v: the full burst of 10 refused after the ticket's charge of 5: %+v", o.Exempt, o.Deny, d)
		}
	}
}

// A request that waited for its turn carries the headers of one admitted at
// its turn: its reset is nearer by the time it waited.
func TestServedTicketsResetIsReducedByItsWait(t *testing.T) {
	ctx, now := context.Background(), monotime.Now()
	c := Config{Name: "slow", Events: 1, Window: 4 * time.Second, Burst: 1, Delay: 10 * time.Second}
	z := mustNew(c, newTestState(t, c), nil)
	if d := z.Decide(ctx, "k", now); !d.Allowed || d.Delay != 0 {
		t.Fatalf("first request: %+v", d)
	}
	tk := Ticket[struct{}]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 1}
	tk.Admit(ctx, now)
	if !tk.Allowed || tk.Delay <= 0 {
		t.Fatalf("second request: %+v, want admitted for later", tk.Decision)
	}
	reset := tk.ResetAfter
	tk.Served(3 * time.Second)
	if tk.ResetAfter != reset-3*time.Second || tk.Delay != 0 || z.Waiting() != 0 {
		t.Fatalf("after waiting 3s: reset %v (was %v), delay %v, %d waiting; want the reset 3s nearer, no delay, none waiting",
			tk.ResetAfter, reset, tk.Delay, z.Waiting())
	}
}
