package zones

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

func TestNewPlanRefusesWhatCouldOverflowOrNeverLimit(t *testing.T) {
	cases := []struct {
		events int64
		window time.Duration
		burst  int64
		want   error
	}{
		{60, time.Minute, 0, nil},
		{1 << 40, 366 * 24 * time.Hour, 1 << 40, nil},
		{0, time.Minute, 0, ErrEvents},
		{-1, time.Minute, 0, ErrEvents},
		{1<<40 + 1, time.Hour, 0, ErrEvents},
		{60, 0, 0, ErrWindow},
		{60, -time.Second, 0, ErrWindow},
		{1000, time.Nanosecond, 0, ErrWindow},
		{1_000_000, 999 * time.Millisecond, 0, ErrWindow}, // finer than a microsecond, which Redis counts
		{60, time.Minute, -1, ErrBurst},
		{60, time.Minute, 1<<40 + 1, ErrBurst},
		{1, 200 * 365 * 24 * time.Hour, 0, ErrSpan},
		{1, time.Hour, 1 << 40, ErrSpan},
	}
	for _, c := range cases {
		p, err := NewPlan(c.events, c.window, c.burst)
		if !errors.Is(err, c.want) {
			t.Errorf("NewPlan(%d, %v, %d) = %v, want %v", c.events, c.window, c.burst, err, c.want)
		}
		if err == nil && p.Burst == 0 {
			t.Errorf("NewPlan(%d, %v, %d): burst not resolved", c.events, c.window, c.burst)
		}
	}
}

func TestPlansRememberEachKeysLastPlanUnderConcurrency(t *testing.T) {
	ps := newPlans(10_000)
	now := monotime.Now()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p, err := NewPlan(int64(1+(g+i)%50), time.Hour, 0)
				if err != nil {
					t.Error(err)
					return
				}
				ps.record(fmt.Sprintf("g%d", g), p, now+int64(time.Hour), now)
			}
		}()
	}
	wg.Wait()
	for g := range 64 {
		p, ok := ps.last(fmt.Sprintf("g%d", g), now)
		if want := int64(1 + (g+199)%50); !ok || p.Events != want {
			t.Errorf("key g%d: last plan %+v (found %v), want events %d", g, p, ok, want)
		}
	}
	if _, ok := ps.last("g0", now+int64(2*time.Hour)); ok {
		t.Error("a key's plan is still remembered after its state expired")
	}
}

// A PerRequest zone's key denied from the deny cache was decided under the
// request's plan: the admin API's read (LastPlan) shows that plan, whether
// the zone counts a rate or a quota and whether the zone or the handler's
// CachedDenial (serve.go's fast path) answered.
func TestDenyCacheAnswerRecordsTheRequestsPlan(t *testing.T) {
	ctx := context.Background()
	rate := func(t *testing.T) (*Zone, int64, Plan, Plan) {
		c := Config{Name: "r", Events: 10, Window: time.Minute, PerRequest: true}
		z := mustNew(c, newTestState(t, c), &faultStore{})
		p1, _ := NewPlan(10, time.Minute, 0)
		p2, _ := NewPlan(1000, time.Minute, 0)
		return z, monotime.Now(), p1, p2
	}
	quota := func(t *testing.T) (*Zone, int64, Plan, Plan) {
		c := minuteQuota(10)
		c.PerRequest = true
		z, clk := newQuotaZone(t, c, &quotaFaultStore{used: 10, period: 1}, "2026-03-15T10:00:00Z")
		return z, clk.now(), QuotaPlan(10), QuotaPlan(20)
	}
	for _, kind := range []struct {
		name string
		zone func(*testing.T) (*Zone, int64, Plan, Plan)
	}{{"rate", rate}, {"quota", quota}} {
		for _, path := range []string{"DecideWith", "CachedDenial"} {
			t.Run(kind.name+"/"+path, func(t *testing.T) {
				z, now, p1, p2 := kind.zone(t)
				if d := z.DecideWith(ctx, "k", now, &p1, 1); d.Allowed || d.Source != SourceStore {
					t.Fatalf("%+v, want the store's denial", d)
				}
				var d Decision
				if path == "DecideWith" {
					d = z.DecideWith(ctx, "k", now, &p2, 1)
				} else {
					d, _ = z.CachedDenial("k", now, &p2)
				}
				if d.Source != SourceDenyCache {
					t.Fatalf("%+v, want a denial from the deny cache", d)
				}
				if got := z.LastPlan("k", now); got.Events != p2.Events {
					t.Fatalf("last plan has %d events, want %d: the plan the cached denial was decided under", got.Events, p2.Events)
				}
			})
		}
	}
}
