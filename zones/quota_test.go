package zones

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// testClock is a wall clock and a monotonic one that a test moves together
// (or apart, to step the wall clock).
type testClock struct {
	mu   sync.Mutex
	wall time.Time
	mono int64
}

func (c *testClock) now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.wall, c.mono = c.wall.Add(d), c.mono+int64(d)
	c.mu.Unlock()
}

func (c *testClock) stepWall(d time.Duration) {
	c.mu.Lock()
	c.wall = c.wall.Add(d)
	c.mu.Unlock()
}

// newQuotaZone is a quota zone whose clock is clk, starting at wall.
func newQuotaZone(t *testing.T, c Config, store Store, wall string) (*Zone, *testClock) {
	t.Helper()
	at, err := time.Parse(time.RFC3339, wall)
	if err != nil {
		t.Fatal(err)
	}
	clk := &testClock{wall: at, mono: int64(time.Hour)}
	s := newTestState(t, c)
	s.quota.wall = func() time.Time {
		clk.mu.Lock()
		defer clk.mu.Unlock()
		return clk.wall
	}
	s.quota.mono = clk.now
	return mustNew(c, s, store), clk
}

func minuteQuota(n int64) Config {
	return Config{Name: "q", Quota: n, Period: algorithms.Minute}
}

func TestQuotaZoneCountsUntilTheLimitAndStartsAgainAtTheBoundary(t *testing.T) {
	ctx := context.Background()
	z, clk := newQuotaZone(t, minuteQuota(3), nil, "2026-03-15T10:00:20Z")
	for i := range 3 {
		d := z.Decide(ctx, "k", clk.now())
		if !d.Allowed || d.Remaining != int64(2-i) || d.ResetAfter != 40*time.Second || d.Period != time.Minute {
			t.Fatalf("request %d: %+v, want allowed, %d left, reset in 40s, period 1m", i+1, d, 2-i)
		}
	}
	d := z.Decide(ctx, "k", clk.now())
	if d.Allowed || d.RetryAfter != 40*time.Second || d.Remaining != 0 {
		t.Fatalf("4th request: %+v, want denied until the minute's end, 40s", d)
	}
	clk.advance(39 * time.Second)
	if d := z.Decide(ctx, "k", clk.now()); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("a second before the boundary: %+v, want denied for 1s", d)
	}
	clk.advance(time.Second)
	for i := range 3 {
		if d := z.Decide(ctx, "k", clk.now()); !d.Allowed || d.ResetAfter != time.Minute {
			t.Fatalf("next minute, request %d: %+v, want allowed, reset in 1m", i+1, d)
		}
	}
	if d := z.Decide(ctx, "k", clk.now()); d.Allowed {
		t.Fatal("a 4th request in the next minute was allowed")
	}
	// Another key has its own count.
	if d := z.Decide(ctx, "other", clk.now()); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("another key: %+v", d)
	}
}

func TestQuotaZoneAdmitsExactlyTheQuotaUnderConcurrency(t *testing.T) {
	const quota, goroutines, each = 1000, 64, 50
	c := Config{Name: "q", Quota: quota, Period: algorithms.Day}
	z := mustNew(c, newTestState(t, c), nil)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range each {
				now := monotime.Now()
				key := "shared"
				if i%10 == 0 {
					key = "own" // a second key in the same shards
				}
				if d := z.DecideWith(context.Background(), key, now, &z.plan, 1); d.Allowed && key == "shared" {
					allowed.Add(1)
				}
				if i%7 == 0 {
					tk := Ticket[int]{Zone: z, Key: key, Plan: z.plan}
					tk.Read(context.Background(), now) //nolint:errcheck // a reader beside the writers
				}
			}
		})
	}
	wg.Wait()
	if n := allowed.Load(); n != quota {
		t.Fatalf("%d allowed out of %d, want exactly the quota %d", n, goroutines*each*9/10, quota)
	}
}

func TestQuotaChargeEndsThePeriodInDebtByAtMostOneCharge(t *testing.T) {
	ctx := context.Background()
	z, clk := newQuotaZone(t, minuteQuota(100), nil, "2026-03-15T10:00:00Z")
	p := z.Plan()
	if d := z.Check(ctx, "k", clk.now(), &p); !d.Allowed || d.Remaining != 100 {
		t.Fatalf("check of a fresh key: %+v", d)
	}
	z.Charge(ctx, "k", clk.now(), &p, 90)
	if d := z.Check(ctx, "k", clk.now(), &p); !d.Allowed || d.Remaining != 10 {
		t.Fatalf("check after 90: %+v, want allowed with 10 left", d)
	}
	// Three requests in flight on the last units, each charged 60.
	for range 3 {
		z.Charge(ctx, "k", clk.now(), &p, 60)
	}
	if s := readKey(t, z, "k", clk.now()); s.Used != 160 || s.Remaining != 0 {
		t.Fatalf("Read = %+v; want used 160 (the quota and one charge)", s)
	}
	if d := z.Check(ctx, "k", clk.now(), &p); d.Allowed || d.RetryAfter != time.Minute {
		t.Fatalf("check in debt: %+v, want denied until the period's end", d)
	}
	clk.advance(time.Minute)
	if d := z.Check(ctx, "k", clk.now(), &p); !d.Allowed || d.Remaining != 100 {
		t.Fatalf("next period: %+v, want the debt gone", d)
	}
}

func TestQuotaRefundGivesUnitsBack(t *testing.T) {
	ctx := context.Background()
	z, clk := newQuotaZone(t, minuteQuota(5), nil, "2026-03-15T10:00:00Z")
	p := z.Plan()
	d := z.DecideWith(ctx, "k", clk.now(), &p, 5)
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost 5 of 5: %+v", d)
	}
	if d, _ = z.RefundWith(ctx, "k", clk.now(), d, &p, 3); d.Remaining != 3 {
		t.Fatalf("after refunding 3: %+v, want 3 left", d)
	}
	if d := z.DecideWith(ctx, "k", clk.now(), &p, 3); !d.Allowed {
		t.Fatalf("the refunded units could not be spent: %+v", d)
	}
}

func TestPeriodClockFollowsTheWallClockOnlyAtBoundaries(t *testing.T) {
	ctx := context.Background()
	berlin, _ := time.LoadLocation("Europe/Berlin")
	c := Config{Name: "q", Quota: 1, Period: algorithms.Day, Location: berlin}
	// 2026-03-29 is 23 hours long in Berlin; it started at 2026-03-28T23:00Z.
	z, clk := newQuotaZone(t, c, nil, "2026-03-29T12:00:00Z")
	if d := z.Decide(ctx, "k", clk.now()); !d.Allowed || d.Period != 23*time.Hour || d.ResetAfter != 10*time.Hour {
		t.Fatalf("first request: %+v, want a 23-hour day ending in 10h", d)
	}
	// A wall clock stepped forward by a day mid-period neither ends the
	// period nor moves its end, which the monotonic clock keeps.
	clk.stepWall(24 * time.Hour)
	clk.advance(time.Hour)
	if d := z.Decide(ctx, "k", clk.now()); d.Allowed || d.RetryAfter != 9*time.Hour {
		t.Fatalf("after a forward step: %+v, want still denied, 9h to the end", d)
	}
	// At the boundary the wall clock counts again: it is now a day ahead,
	// in the period after next.
	clk.advance(9 * time.Hour)
	d := z.Decide(ctx, "k", clk.now())
	start, end := z.PeriodNow(clk.now())
	if !d.Allowed || !start.Equal(time.Date(2026, 3, 31, 0, 0, 0, 0, berlin)) || !end.Equal(time.Date(2026, 4, 1, 0, 0, 0, 0, berlin)) {
		t.Fatalf("at the boundary: %+v in [%v, %v), want allowed in the 31st", d, start, end)
	}
	// Stepped back by two days: the period goes on until the wall clock
	// reaches its end again; nothing is counted twice.
	clk.stepWall(-48 * time.Hour)
	clk.advance(24 * time.Hour) // the 31st's end on the monotonic clock
	if d := z.Decide(ctx, "k", clk.now()); d.Allowed {
		t.Fatalf("after a backward step: %+v, want the period of the 31st to go on", d)
	}
	if s, e := z.PeriodNow(clk.now()); !s.Equal(start) || !e.Equal(end) {
		t.Fatalf("after a backward step the period is [%v, %v), want [%v, %v)", s, e, start, end)
	}
}

// quotaFaultStore is a Store whose quota steps answers the test dictates: it only
// injects errors and counts calls; Redis's behaviour is tested in tests/.
type quotaFaultStore struct {
	faultStore
	used   int64 // what a step answers as used, denied when over the limit
	period int
	seen   atomic.Pointer[Periods]
}

func (f *quotaFaultStore) step(q QuotaLimit, cost int64) (QuotaResult, error) {
	f.calls.Add(1)
	f.seen.Store(q.Periods)
	if f.err != nil {
		return QuotaResult{}, f.err
	}
	used := f.used + cost
	if used > q.Limit {
		return QuotaResult{Used: f.used, ToEnd: 30 * time.Second, Period: f.period}, nil
	}
	return QuotaResult{Allowed: true, Used: used, ToEnd: 30 * time.Second, Period: f.period}, nil
}

func (f *quotaFaultStore) Quota(_ context.Context, _, _ string, s QuotaStep) (QuotaResult, error) {
	switch s.Op {
	case OpDecide, OpCharge:
		return f.step(s.Limit, s.Cost)
	case OpRefund:
		f.refunds.Add(1)
		return QuotaResult{}, f.err
	case OpReset:
		return QuotaResult{}, f.err
	}
	return f.step(s.Limit, 0)
}

func (f *quotaFaultStore) Offers() Offers { return Offers{Mode: "strict", Quotas: true} }

func TestQuotaDenialIsCachedOnlyWhenNothingIsLeft(t *testing.T) {
	ctx := context.Background()
	st := &quotaFaultStore{used: 10, period: 1}
	z, clk := newQuotaZone(t, minuteQuota(10), st, "2026-03-15T10:00:00Z")
	p := z.Plan()
	for range 100 {
		if d := z.Decide(ctx, "k", clk.now()); d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("%+v, want denied", d)
		}
	}
	if n := st.calls.Load(); n != 1 {
		t.Fatalf("store called %d times for a key with nothing left, want 1", n)
	}
	clk.advance(QuotaDenyCacheFor)
	z.Decide(ctx, "k", clk.now())
	if n := st.calls.Load(); n != 2 {
		t.Fatalf("store called %d times after %v, want 2", n, QuotaDenyCacheFor)
	}
	// A weighted request denied with units left is not cached: a cheaper
	// one may pass.
	st.used = 8
	z.DecideWith(ctx, "w", clk.now(), &p, 5)
	if d := z.DecideWith(ctx, "w", clk.now(), &p, 1); !d.Allowed {
		t.Fatalf("cost 1 after a denied cost 5 with 2 left: %+v, want allowed", d)
	}
}

func TestQuotaFailPolicies(t *testing.T) {
	ctx := context.Background()
	outage := errors.New("redis: connection refused")
	for _, tc := range []struct {
		policy  FailPolicy
		allowed int
		source  Source
	}{
		{FailOpen, 100, SourceFailOpen},
		{FailClosed, 0, SourceFailClosed},
		{FailLocal, 10, SourceFailLocal}, // 30 per minute among 3 instances
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			c := minuteQuota(30)
			c.FailPolicy = tc.policy
			z, clk := newQuotaZone(t, c, &quotaFaultStore{faultStore: faultStore{err: outage, instances: 3}}, "2026-03-15T10:00:00Z")
			allowed := 0
			for range 100 {
				d := z.Decide(ctx, "k", clk.now())
				if d.Source != tc.source || d.Err == nil {
					t.Fatalf("%+v, want decided by %v with the error", d, tc.source)
				}
				if d.Allowed {
					allowed++
				}
			}
			if allowed != tc.allowed {
				t.Fatalf("%d allowed, want %d", allowed, tc.allowed)
			}
		})
	}
	t.Run("local starts from the fleet's use", func(t *testing.T) {
		c := minuteQuota(30)
		st := &quotaFaultStore{faultStore: faultStore{instances: 3}, used: 11, period: 1}
		z, clk := newQuotaZone(t, c, st, "2026-03-15T10:00:00Z")
		z.Decide(ctx, "k", clk.now()) // 12 of 30 used: 4 of this instance's 10
		st.err = outage
		allowed := 0
		for range 20 {
			if d := z.Decide(ctx, "k", clk.now()); d.Allowed {
				allowed++
			}
		}
		if allowed != 6 {
			t.Fatalf("%d allowed during the outage, want 6 (a share of 10, 4 used)", allowed)
		}
	})
}

// followStoreClock runs a minute quota zone whose instance clock reads
// instance and whose store answers a clock error at store: the fail
// policy answers that request, ending at the store's minute's end, and
// the next request is sent in the store's minute.
func followStoreClock(t *testing.T, instance, store string) (*quotaFaultStore, *Zone, *testClock) {
	t.Helper()
	ctx := context.Background()
	st := &quotaFaultStore{faultStore: faultStore{instances: 1}, period: 1}
	z, clk := newQuotaZone(t, minuteQuota(10), st, instance)
	sent := func() time.Time { return time.UnixMicro(st.seen.Load().Bounds[1]).UTC() }
	z.Decide(ctx, "k", clk.now())
	if at, _ := time.Parse(time.RFC3339, instance); !sent().Equal(at.Truncate(time.Minute)) {
		t.Fatalf("current period starts at %v", sent())
	}
	storeNow, _ := time.Parse(time.RFC3339, store)
	st.err = &QuotaClockError{Now: storeNow}
	toEnd := storeNow.Truncate(time.Minute).Add(time.Minute).Sub(storeNow)
	if d := z.Decide(ctx, "k", clk.now()); d.Source != SourceFailLocal || d.ResetAfter != toEnd {
		t.Fatalf("%+v, want the fail policy in the store's minute, ending in %v", d, toEnd)
	}
	st.err = nil
	z.Decide(ctx, "k", clk.now())
	if want := storeNow.Truncate(time.Minute); !sent().Equal(want) {
		t.Fatalf("after the store's clock error the current period starts at %v, want %v", sent(), want)
	}
	return st, z, clk
}

func TestQuotaZoneFollowsAStoreClockAPeriodAway(t *testing.T) {
	followStoreClock(t, "2026-03-15T10:00:30Z", "2026-03-15T12:00:10Z")
}

// A store clock periods behind the instance's is followed too: the period
// goes back to the store's, which a local wall-clock step back never does.
func TestQuotaZoneFollowsAStoreClockPeriodsBehind(t *testing.T) {
	st, z, clk := followStoreClock(t, "2026-03-15T12:00:10Z", "2026-03-15T10:00:30Z")
	// Followed once, a later local step back keeps the period again.
	clk.stepWall(-time.Hour)
	clk.advance(30 * time.Second) // the 10:00 minute's end on the monotonic clock
	z.Decide(context.Background(), "k", clk.now())
	if b := st.seen.Load().Bounds[1]; b != time.Date(2026, 3, 15, 10, 0, 0, 0, time.UTC).UnixMicro() {
		t.Fatalf("after a local step back the current period starts at %v, want 10:00 to go on", time.UnixMicro(b).UTC())
	}
}

// The decision a store's clock error hands to fail_policy local is made in
// the store's period, which the zone has just learned: not in the period
// the instance's clock had, where the key may have used its part already.
func TestQuotaClockErrorFallbackCountsInTheStoresPeriod(t *testing.T) {
	ctx := context.Background()
	st := &quotaFaultStore{faultStore: faultStore{instances: 1}, used: 2, period: 1}
	z, clk := newQuotaZone(t, minuteQuota(2), st, "2026-03-15T10:00:30Z")
	if d := z.Decide(ctx, "k", clk.now()); d.Allowed || d.Source != SourceStore {
		t.Fatalf("%+v, want the store's denial: the key used its 2 of the 10:00 minute", d)
	}
	clk.advance(QuotaDenyCacheFor) // past the cached denial, still 10:00 here
	st.err = &QuotaClockError{Now: time.Date(2026, 3, 15, 12, 0, 10, 0, time.UTC)}
	d := z.Decide(ctx, "k", clk.now())
	if d.Source != SourceFailLocal || !d.Allowed || d.ResetAfter != 50*time.Second || d.Period != time.Minute {
		t.Fatalf("%+v, want fail_policy local to allow in the store's minute, 12:00, ending in 50s", d)
	}
}

func TestQuotaPeriodsAreTheNeighbours(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, ny) // a 25-hour day
	_, end := algorithms.Day.Bounds(start, ny)
	ps := PeriodsAt(algorithms.Day, start, ny)
	want := []time.Time{time.Date(2026, 10, 31, 0, 0, 0, 0, ny), start, end, time.Date(2026, 11, 3, 0, 0, 0, 0, ny)}
	var arg []string
	for i, w := range want {
		if ps.Bounds[i] != w.UnixMicro() {
			t.Errorf("bound %d = %v, want %v", i, time.UnixMicro(ps.Bounds[i]).In(ny), w)
		}
		arg = append(arg, strconv.FormatInt(w.UnixMicro(), 10))
	}
	if ps.length(1) != 25*time.Hour {
		t.Errorf("the current period lasts %v, want 25h", ps.length(1))
	}
	if s, ok := ps.Arg.(string); !ok || s != strings.Join(arg, " ") {
		t.Errorf("Arg = %#v, want %q", ps.Arg, strings.Join(arg, " "))
	}
	if s, e := ps.Period(1); !s.Equal(start) || !e.Equal(end) || s.Location() != ny {
		t.Errorf("Period(1) = [%v, %v)", s, e)
	}
}

func TestQuotaConfigValidateNamesTheFix(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Name: "q", Quota: 10, Period: algorithms.Day, Events: 5, Window: time.Second}, "either a quota or a rate"},
		{Config{Name: "q", Quota: 10, Period: algorithms.Day, Concurrency: 2}, "either a quota or a concurrency"},
		{Config{Name: "q", Period: algorithms.Day}, "quota must be a whole number"},
		{Config{Name: "q", Quota: MaxEvents + 1, Period: algorithms.Day}, "quota must be a whole number"},
	} {
		if err := tc.c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
	if err := (Config{Name: "q", Period: algorithms.Day, PerRequest: true}).Validate(); err != nil {
		t.Errorf("a per-request quota without fallback: %v", err)
	}
}

// deny_while asks a quota zone whether it denies a key now: locally, when
// the key has nothing left in the period; counting nothing.
func TestQuotaZoneDeniesOnceNothingIsLeft(t *testing.T) {
	ctx := context.Background()
	z, clk := newQuotaZone(t, minuteQuota(2), nil, "2026-03-15T10:00:00Z")
	for range 2 {
		if z.Denies("k", clk.now()) {
			t.Fatal("denies with units left")
		}
		z.Decide(ctx, "k", clk.now())
	}
	if !z.Denies("k", clk.now()) {
		t.Fatal("does not deny with nothing left")
	}
	clk.advance(time.Minute)
	if z.Denies("k", clk.now()) {
		t.Fatal("denies in the next period")
	}
}

// A weighted request denied with units left reports 0 remaining, as every
// denial does; the units are there for the next, cheaper request.
func TestQuotaDenialReportsNothingRemaining(t *testing.T) {
	ctx := context.Background()
	z, clk := newQuotaZone(t, minuteQuota(5), nil, "2026-03-15T10:00:00Z")
	p := z.Plan()
	z.DecideWith(ctx, "k", clk.now(), &p, 3)
	if d := z.DecideWith(ctx, "k", clk.now(), &p, 3); d.Allowed || d.Remaining != 0 || d.RetryAfter != time.Minute {
		t.Fatalf("cost 3 with 2 left: %+v, want denied, 0 remaining, until the minute's end", d)
	}
	if d := z.DecideWith(ctx, "k", clk.now(), &p, 2); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost 2 with 2 left: %+v, want allowed", d)
	}
}
