package zones

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Status says what the next request's decision will say, and consumes
// nothing, in each kind of zone; an override's limit is the one reported.
func TestStatusIsTheNextDecisionAndConsumesNothing(t *testing.T) {
	ctx := context.Background()
	now := int64(1e12)
	for _, c := range []Config{
		{Name: "rate", Events: 5, Window: time.Minute},
		{Name: "banned", Events: 2, Window: time.Minute, Ban: time.Hour},
		{Name: "quota", Quota: 4, Period: algorithms.Day},
		{Name: "conc", Concurrency: 3},
		{Name: "adaptive", Adaptive: algorithms.AdaptiveLimit{Target: int64(100 * time.Millisecond), Min: 3, Max: 10}},
	} {
		t.Run(c.Name, func(t *testing.T) {
			state := NewState(c, time.Hour)
			defer state.Destruct()
			z, err := New(c, state, nil)
			if err != nil {
				t.Fatal(err)
			}
			var held []Slot
			for i := range 8 {
				tk := Ticket[int]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 1}
				tk.Resolve()
				var s Status
				for range 50 { // asking many times changes nothing
					if s, err = z.Status(ctx, "k", now, &tk.Plan, tk.Override); err != nil {
						t.Fatal(err)
					}
				}
				tk.Admit(ctx, now)
				if tk.Holds() {
					held = append(held, tk.Slot())
				}
				if s.Remaining != tk.Remaining || s.Allowed != tk.Allowed {
					t.Fatalf("request %d: status said allowed %v, remaining %d; the request got %v, %d", i, s.Allowed, s.Remaining, tk.Allowed, tk.Remaining)
				}
				if c.IsConcurrency() && s.Limit != 3 {
					t.Errorf("request %d: status says a limit of %d in flight, want 3", i, s.Limit)
				}
				if c.Ban > 0 && !tk.Allowed && !s.Banned && i > 2 {
					t.Errorf("request %d: a banned key's status does not say so: %+v", i, s)
				}
			}
			for _, sl := range held {
				z.Release(sl)
			}
		})
	}
}

// A concurrency zone's override n is its limit of requests in flight.
func TestConcurrencyOverrideN(t *testing.T) {
	c := Config{Name: "conc", Concurrency: 1}
	state := NewState(c, time.Hour)
	defer state.Destruct()
	z, _ := New(c, state, nil)
	var ov Overrides
	z.UseOverrides(&ov)
	set, _ := NewOverrideSet([]*Override{{ID: "big", Key: "k", Plan: ConcurrencyPlan(3)}})
	ov.Store(set)
	admitted := 0
	for range 5 {
		tk := Ticket[int]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 1}
		tk.Resolve()
		tk.Admit(context.Background(), 0)
		if tk.Allowed {
			admitted++
			if tk.Quota() != 3 {
				t.Errorf("q = %d, want the override's 3", tk.Quota())
			}
		}
	}
	if admitted != 3 {
		t.Errorf("%d in flight under an override of 3", admitted)
	}
}
