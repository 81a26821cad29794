package zones

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

func TestChargesFromManyGoroutinesAllCountAndMayPassTheBurst(t *testing.T) {
	c := Config{Name: "z", Events: 100, Window: time.Hour}
	z := mustNew(c, newTestState(t, c), nil)
	p := z.Plan()
	T := int64(time.Hour) / 100
	now := monotime.Now()
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !z.Check(ctx, "k", now, &p).Allowed {
				t.Error("a check denied a key with quota left")
			}
			z.Charge(ctx, "k", now, &p, 1)
		}()
	}
	wg.Wait()
	if d := z.Check(ctx, "k", now, &p); !d.Allowed || d.Remaining != 36 {
		t.Fatalf("after 64 charges of 1 at events 100: %+v, want allowed with 36 left", d)
	}
	z.Charge(ctx, "k", now, &p, 100) // 164: 64 past the burst
	d := z.Check(ctx, "k", now, &p)
	if d.Allowed || d.RetryAfter != time.Duration(65*T) {
		t.Fatalf("after 164 charged at events 100: %+v, want denied for 65 intervals (the debt and one unit)", d)
	}
	z.Charge(ctx, "k", now, &p, 1000) // capped: a key owes at most one burst more
	if d := z.Check(ctx, "k", now, &p); d.RetryAfter != time.Duration(101*T) {
		t.Fatalf("after a charge past the cap: retry after %v, want %v (two bursts)", d.RetryAfter, time.Duration(101*T))
	}
}

func TestStrictChargesThatCannotLandFallBackAtOnceAndAreCountedAfterRetries(t *testing.T) {
	c := Config{Name: "z", Events: 100, Window: time.Hour, FailPolicy: FailLocal}
	st := &faultStore{err: errors.New("redis down"), instances: 2}
	z := mustNew(c, newTestState(t, c), st)
	var failed atomic.Int64
	z.OnChargeFailed = func(error) { failed.Add(1) }
	p := z.Plan()
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			z.Charge(ctx, "k", monotime.Now(), &p, 1)
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > time.Second {
		t.Errorf("64 charges with Redis down took %v: a charge must never wait for Redis", d)
	}
	// Each instance's part while Redis is down is 50 (2 instances); the
	// 64 charges land in it, so the key owes 14 of them plus one unit.
	deadline := time.Now().Add(5 * time.Second)
	for failed.Load() < 64 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 64 failed charges reported after their retries", failed.Load())
		}
		time.Sleep(10 * time.Millisecond) // polling a counter the chargers update
	}
	if n := failed.Load(); n != 64 {
		t.Fatalf("%d failed charges reported, want 64", n)
	}
	if n := st.calls.Load(); n < 64*2 {
		t.Errorf("%d store calls for 64 charges, want each retried", n)
	}
	d := z.Check(ctx, "k", monotime.Now(), &p)
	share := int64(time.Hour) / 50
	if d.Allowed || d.Source != SourceFailLocal || d.RetryAfter > time.Duration(15*share) || d.RetryAfter < time.Duration(15*share)-5*time.Second {
		t.Fatalf("check after 64 failed charges: %+v, want denied by the local share for about 15 of its intervals", d)
	}
}

// slowChargeStore keeps a GCRA table, like Redis would, whose charges land
// only after a delay: a strict store under load.
type slowChargeStore struct {
	faultStore
	table *Table
	delay time.Duration
}

func (s *slowChargeStore) Rate(ctx context.Context, zone, key string, st RateStep) (RateReply, error) {
	switch st.Op {
	case OpCheck:
		return RateReply{Result: s.table.Peek(key, monotime.Now(), st.Limit)}, nil
	case OpCharge:
		time.Sleep(s.delay) // the round trip, not synchronisation
		return RateReply{Result: s.table.Charge(key, monotime.Now(), st.Limit, st.Cost)}, nil
	}
	return s.faultStore.Rate(ctx, zone, key, st)
}

// A strict check waits for this instance's own charges of the key still on
// their way to Redis: a client cannot slip past its own unrecorded debt
// (issue 23: multi-instance tests waited on the admin API before each
// request, so nothing checked it).
func TestStrictCheckWaitsForThisInstancesPendingCharges(t *testing.T) {
	c := Config{Name: "z", Events: 3, Window: time.Hour}
	st := &slowChargeStore{table: NewTable(10), delay: 30 * time.Millisecond}
	z := mustNew(c, newTestState(t, c), st)
	p := z.Plan()
	ctx := context.Background()
	for i := range 3 {
		if d := z.Check(ctx, "k", monotime.Now(), &p); !d.Allowed {
			t.Fatalf("check %d of 3: %+v, want allowed", i+1, d)
		}
		z.Charge(ctx, "k", monotime.Now(), &p, 1)
	}
	if d := z.Check(ctx, "k", monotime.Now(), &p); d.Allowed {
		t.Fatalf("a check right after the whole burst was charged: %+v, want denied (it must wait for the charges in flight)", d)
	}
}
