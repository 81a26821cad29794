package zones

// Quota zones (`quota <n> per minute|hour|day|week|month [<time zone>]`): at
// most n units of cost per calendar period, counted from 0 at each period's
// start (docs/configuration.md, Calendar quotas). Locally a key's count is
// one int64 packed with its period (gen, below); a store picks the period
// by its own clock among the three the zone hands it (a script cannot do
// time zones). The zone's clock (periodClock) follows the wall clock's
// boundaries on the monotonic clock: a wall-clock step never resets,
// prolongs or repeats a period.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/keytable"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// QuotaLimit is one quota step's limit: units per period, and the periods
// the store's clock may be in.
type QuotaLimit struct {
	Limit   int64
	Periods *Periods
}

// Periods are the previous, current and next periods of a quota zone as
// its clock sees them, for a store to pick from with its own clock.
type Periods struct {
	// Bounds are the periods' edges in Unix microseconds: the previous
	// period is [Bounds[0], Bounds[1]), the current [1, 2), the next [2, 3).
	Bounds [4]int64
	Arg    any // Bounds as a script argument, "b0 b1 b2 b3", boxed once per period
	loc    *time.Location
}

// PeriodsAt returns the period of p in loc that contains t and its neighbours.
func PeriodsAt(p algorithms.Period, t time.Time, loc *time.Location) Periods {
	start, end := p.Bounds(t, loc)
	prev, _ := p.Bounds(start.Add(-time.Nanosecond), loc)
	_, next := p.Bounds(end, loc)
	b := [4]int64{prev.UnixMicro(), start.UnixMicro(), end.UnixMicro(), next.UnixMicro()}
	return Periods{Bounds: b, Arg: fmt.Sprintf("%d %d %d %d", b[0], b[1], b[2], b[3]), loc: loc}
}

// Period returns the i-th period (0 previous, 1 current, 2 next) in the
// zone's time zone.
func (ps *Periods) Period(i int) (start, end time.Time) {
	i = min(max(i, 0), 2)
	return time.UnixMicro(ps.Bounds[i]).In(ps.loc), time.UnixMicro(ps.Bounds[i+1]).In(ps.loc)
}

func (ps *Periods) length(i int) time.Duration {
	i = min(max(i, 0), 2)
	return time.Duration(ps.Bounds[i+1]-ps.Bounds[i]) * time.Microsecond
}

// QuotaResult is a store's answer to a quota step.
type QuotaResult struct {
	Allowed bool
	Used    int64         // units used in the period after the step (async mode: as this instance knows)
	ToEnd   time.Duration // until the period ends, on the store's clock
	Period  int           // which of the QuotaLimit's Periods: 0 previous, 1 current, 2 next
}

// QuotaClockError is a store's report that its clock (Now) is in none of
// the periods it was given. The step is not made: the zone moves its clock
// to the store's, and its fail policy answers the step in that period.
type QuotaClockError struct{ Now time.Time }

func (e *QuotaClockError) Error() string {
	return fmt.Sprintf("the store's clock (%s) is outside the periods this instance computed: its wall clock is a period or more off; following the store's from now on", e.Now.UTC().Format(time.RFC3339))
}

// QuotaDenyCacheFor is the longest a store's quota denial is answered from
// the deny cache: a blocked key's flood costs the store one call a second
// per instance, and a raised quota or a refund is seen within that.
const QuotaDenyCacheFor = time.Second

// IsQuota reports whether the zone limits units per calendar period.
func (c Config) IsQuota() bool { return c.Period != 0 }

func (c Config) validateQuota() error {
	switch {
	case c.Period < algorithms.Minute || c.Period > algorithms.Month:
		return errors.New("quota needs a period: per minute, hour, day, week or month")
	case c.Events != 0 || c.Window != 0 || c.Burst != 0:
		return errors.New("a zone has either a quota or a rate: remove events, window and burst, or put the rate in a zone of its own")
	case c.Concurrency != 0 || c.Lease != 0:
		return errors.New("a zone has either a quota or a concurrency limit: put the concurrency limit in a zone of its own")
	case c.Quota < 0 || c.Quota > MaxEvents || c.Quota == 0 && !c.PerRequest:
		return fmt.Errorf("quota must be a whole number from 1 to %d", int64(MaxEvents))
	}
	return nil
}

// QuotaPlan is the plan of n units per period (0: only cost 0 passes); its
// Window is 0, the period's length being the calendar's.
func QuotaPlan(n int64) Plan { return Plan{Events: n, Burst: n} }

// newPeriodClock is c's clock; onWrap is called when gen starts again.
func newPeriodClock(c Config, onWrap func()) *periodClock {
	return &periodClock{period: c.Period, loc: cmp.Or(c.Location, time.UTC), onWrap: onWrap, wall: time.Now, mono: monotime.Now}
}

// A local count is gen<<quotaUsedBits | used: gen counts this process's
// periods from 1 (a count of another gen is 0), used is under 3·2^40 (the
// limit and one charge of two limits). After maxQuotaGen periods (4 years
// of minutes) gen starts again at 1 and the tables are cleared.
const (
	quotaUsedBits = 42
	quotaUsedMask = 1<<quotaUsedBits - 1
	maxQuotaGen   = 1<<(63-quotaUsedBits) - 1
)

// staleBelow is the value at or below which an entry counts a period before
// gen: the "expired" of Sweep and of eviction.
func staleBelow(gen int64) int64 { return gen<<quotaUsedBits - 1 }

// periodClock is a quota zone's clock: the period it is in, and when on the
// monotonic clock that period ends.
type periodClock struct {
	period algorithms.Period
	loc    *time.Location
	mu     sync.Mutex // serialises rollovers
	cur    atomic.Pointer[periodNow]
	offset atomic.Int64 // added to the wall clock: a store's clock followed (QuotaClockError)
	// followed (by follow, under mu): the next roll moves to the store's
	// period even when it is before the current one.
	followed bool
	onWrap   func() // gen starts again at 1

	wall func() time.Time // tests replace the clocks
	mono func() int64
}

// periodNow is the period a clock is in. Immutable once published.
type periodNow struct {
	gen        int64
	start, end time.Time // in the zone's time zone
	endMono    int64     // monotime when it ends
	length     time.Duration
	periods    Periods // it and its neighbours, for stores
}

// at is the period the clock is in at now (monotime): one atomic load and a
// comparison, but for the first call after a boundary.
func (c *periodClock) at(now int64) *periodNow {
	if p := c.cur.Load(); p != nil && now < p.endMono {
		return p
	}
	return c.roll(now)
}

func (c *periodClock) roll(now int64) *periodNow {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.cur.Load()
	if p != nil && now < p.endMono {
		return p
	}
	wall := c.wall().Add(time.Duration(c.offset.Load()))
	mono := c.mono()
	start, end := c.period.Bounds(wall, c.loc)
	gen := int64(1)
	if p != nil {
		switch {
		case start.Equal(p.start):
			gen = p.gen // the wall clock is behind the monotonic one: the period goes on
		case start.Before(p.start) && !c.followed:
			// The wall clock went back: stay in the period until it reaches
			// its end again. A store's clock followed back starts a new one.
			gen, start, end = p.gen, p.start, p.end
		case p.gen >= maxQuotaGen:
			if c.onWrap != nil {
				c.onWrap()
			}
		default:
			gen = p.gen + 1
		}
	}
	n := &periodNow{gen: gen, start: start, end: end, endMono: mono + int64(end.Sub(wall)),
		length: end.Sub(start), periods: PeriodsAt(c.period, start, c.loc)}
	c.cur.Store(n)
	c.followed = false
	return n
}

// follow moves the clock to the store's from the next call on.
func (c *periodClock) follow(store time.Time) {
	c.mu.Lock()
	c.offset.Store(int64(store.Sub(c.wall())))
	c.followed = true
	if p := c.cur.Load(); p != nil {
		stale := *p
		stale.endMono = math.MinInt64
		c.cur.Store(&stale)
	}
	c.mu.Unlock()
}

// quotaDecision is a quota zone's decision in a period that ends in toEnd.
// A denial reports 0 remaining, even with units left (as every denial does).
func quotaDecision(allowed bool, left int64, toEnd, period time.Duration, src Source) Decision {
	d := Decision{Allowed: allowed, Remaining: left, ResetAfter: toEnd, Period: period, Source: src}
	if !allowed {
		d.RetryAfter, d.Remaining = toEnd, 0
	}
	return d
}

func (pn *periodNow) toEnd(now int64) time.Duration { return time.Duration(max(1, pn.endMono-now)) }

func (pn *periodNow) decision(r algorithms.QuotaResult, now int64, src Source) Decision {
	return quotaDecision(r.Allowed, r.Remaining, pn.toEnd(now), pn.length, src)
}

// quotaStep runs op on key's count in period gen and stores what it wrote.
func (t *Table) quotaStep(key string, gen int64, op Op, q algorithms.Quota, cost int64) (r algorithms.QuotaResult) {
	t.kt.Update(key, staleBelow(gen), func(v int64, found bool) (int64, keytable.Op) {
		var used int64
		if found && v>>quotaUsedBits == gen {
			used = v & quotaUsedMask
		}
		write := false
		switch op {
		case OpDecide:
			r = q.Decide(used, cost)
			write = r.Allowed && r.Used != used
		case OpCharge:
			r, write = q.Charge(used, cost), true
		case OpRefund:
			r, write = q.Refund(used, cost), found
		default:
			r = q.Check(used)
		}
		switch {
		case !write:
			return 0, keytable.Keep
		case r.Used == 0:
			return 0, keytable.Delete
		}
		return gen<<quotaUsedBits | min(r.Used, quotaUsedMask), keytable.Store
	})
	return r
}

// setQuotaUsed stores used as key's count in period gen.
func (t *Table) setQuotaUsed(key string, gen, used int64) {
	t.kt.Update(key, staleBelow(gen), func(int64, bool) (int64, keytable.Op) {
		if used <= 0 {
			return 0, keytable.Delete
		}
		return gen<<quotaUsedBits | min(used, quotaUsedMask), keytable.Store
	})
}

// quotaUsed is key's count in period gen.
func (t *Table) quotaUsed(key string, gen int64) int64 {
	v, ok := t.kt.Get(key)
	if !ok || v>>quotaUsedBits != gen {
		return 0
	}
	return v & quotaUsedMask
}

// recordPlan remembers the plan key was decided under (PerRequest zones).
func (z *Zone) recordPlan(key string, p *Plan, now int64, d Decision) {
	if z.state.plans != nil {
		z.state.plans.record(key, *p, now+int64(d.ResetAfter), now)
	}
}

// storeQuota is storeStep for a quota zone.
func (z *Zone) storeQuota(ctx context.Context, op Op, key string, now int64, p *Plan, cost int64) Decision {
	pn := z.state.quota.at(now)
	r, err := z.store.Quota(ctx, z.Name, key, QuotaStep{Op: op, Limit: QuotaLimit{Limit: p.Events, Periods: &pn.periods}, Cost: cost})
	if err == nil {
		return z.storeQuotaDecision(key, now, pn, p.Events, r)
	}
	// Local counts at this instance's part, ⌊n/N⌋ and at least 1, from its
	// part of what the fleet had used (storeQuotaDecision).
	if z.followClock(err) {
		pn = z.state.quota.at(now) // the store's period, not the one it refused
	}
	open := Decision{Remaining: p.Events, ResetAfter: pn.toEnd(now), Period: pn.length}
	return z.failPolicy(err, open, func() Decision {
		return pn.decision(z.state.Fallback.quotaStep(key, pn.gen, op, algorithms.Quota{Limit: z.localLimit(p, true).Burst}, cost), now, SourceFailLocal)
	})
}

// storeQuotaDecision is the Decision of the store's answer; a denial with
// nothing left is cached, and the key's use noted for fail_policy local.
func (z *Zone) storeQuotaDecision(key string, now int64, pn *periodNow, limit int64, r QuotaResult) Decision {
	left := max(0, limit-r.Used)
	d := quotaDecision(r.Allowed, left, max(r.ToEnd, 1), pn.periods.length(r.Period), SourceStore)
	if !r.Allowed && left == 0 {
		// Never a weighted request denied with units left: a cheaper one
		// may use them.
		z.state.Denied.Set(key, min(pn.endMono, now+int64(QuotaDenyCacheFor)), now)
	}
	if z.FailPolicy == FailLocal && r.Period == 1 {
		n := int64(max(1, z.store.Instances()))
		z.state.Fallback.setQuotaUsed(key, pn.gen, (r.Used+n-1)/n)
	}
	return d
}

func (z *Zone) cachedQuotaDenial(key string, now int64, pn *periodNow) (Decision, bool) {
	until, ok := z.state.Denied.Get(key, now)
	if !ok || until > pn.endMono {
		return Decision{}, false
	}
	return quotaDecision(false, 0, pn.toEnd(now), pn.length, SourceDenyCache), true
}

// followClock moves the zone's clock to the store's on a QuotaClockError.
func (z *Zone) followClock(err error) bool {
	var ce *QuotaClockError
	if errors.As(err, &ce) {
		z.state.quota.follow(ce.Now)
		return true
	}
	return false
}

// PeriodNow is the period a quota zone is in on this instance's clock, in
// its time zone.
func (z *Zone) PeriodNow(now int64) (start, end time.Time) {
	pn := z.state.quota.at(now)
	return pn.start, pn.end
}
