package zones

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Read reports the state now and consumes nothing, in each kind of zone:
// a fresh key has its whole limit, and after each request (its slot still
// held) the read equals that request's remaining.
func TestReadIsTheStateNowAndConsumesNothing(t *testing.T) {
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
			full := max(c.Events, c.Quota, c.Concurrency, c.Adaptive.Min)
			if s := readKey(t, z, "k", now); s.Remaining != full || !s.Allowed || s.Tracked || s.Limit != full {
				t.Fatalf("a fresh key reads %+v, want its whole limit %d", s, full)
			}
			var held []Slot
			for i := range 8 {
				tk := Ticket[int]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 1}
				tk.Resolve()
				for range 50 { // asking many times changes nothing
					readKey(t, z, "k", now)
				}
				tk.Admit(ctx, now)
				if tk.Holds() {
					held = append(held, tk.Slot())
				}
				s := readKey(t, z, "k", now)
				if s.Remaining != tk.Remaining || s.Limit != tk.Quota() || !s.Tracked {
					t.Fatalf("request %d: read says remaining %d of %d; the request's headers %d of %d", i, s.Remaining, s.Limit, tk.Remaining, tk.Quota())
				}
				if c.Ban > 0 && !tk.Allowed && !s.Banned {
					t.Errorf("request %d: a banned key's read does not say so: %+v", i, s)
				}
			}
			for _, sl := range held {
				z.Release(sl)
			}
		})
	}
}

// readKey is Read of key under the plan it was last decided under.
func readKey(t testing.TB, z *Zone, key string, now int64) KeyState {
	t.Helper()
	tk := Ticket[struct{}]{Zone: z, Key: key, Plan: z.LastPlan(key, now), Cost: 1}
	tk.Resolve()
	s, err := tk.Read(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	return s
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
