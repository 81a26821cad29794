package zones

import (
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
