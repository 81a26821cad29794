package zones

import (
	"context"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// KeyState is a key's state now, as GitHub's GET /rate_limit reports it:
// Remaining is what the key can still spend (after a request: its RateLimit
// remaining).
type KeyState struct {
	Decision
	Limit  int64         // the RateLimit-Policy's q (Ticket.Quota)
	Window time.Duration // and w (Ticket.Window)
	// Quota zones: the units used in the current period, and its bounds.
	Used                   int64
	PeriodStart, PeriodEnd time.Time
	InFlight               int64 // concurrency zones: the key's requests in flight
	Tracked                bool  // the zone holds state for the key (else it is at its full limit)
}

// Read is the one read of a key's state, for rate_limit_status, the admin
// API and the CLI: the ticket's key under its plan (Resolve first),
// consuming nothing and starting no ban. An override (but for a quota key's
// use and a concurrency key's slots), a ban, a cached denial and this
// instance's own state answer without the store; else one peek,
// which a Gather in ctx sends with the request's other reads in one round trip.
func (t *Ticket[O]) Read(ctx context.Context, now int64) (KeyState, error) {
	z, key, p := t.Zone, t.Key, &t.Plan
	s := KeyState{Limit: t.Quota(), Window: t.Window()}
	if z.IsAdaptive() {
		s.Limit = z.limitOf(key)
	}
	var err error
	switch {
	case t.Waived() && z.state.quota == nil && !z.IsConcurrency():
		// a rate key: the override alone answers, below
	case z.IsConcurrency():
		if s.InFlight, err = z.SlotsInUse(ctx, key); err == nil {
			s.Remaining, s.Tracked = max(0, s.Limit-s.InFlight), s.InFlight > 0
			s.Allowed = s.Remaining > 0
		}
	case z.state.quota != nil:
		err = z.readQuota(ctx, key, now, p, &s)
	default:
		err = z.readRate(ctx, key, now, p, &s)
	}
	if err == nil && t.Waived() {
		// The override decides; a quota key's use of the period and a
		// concurrency key's slots in flight are read beside it.
		s.Decision, s.Tracked = t.waived(), true
	}
	return s, err
}

// readQuota is Read in a quota zone: the period's count, here or in the
// store (a cached denial would not say how far past the quota a key is).
func (z *Zone) readQuota(ctx context.Context, key string, now int64, p *Plan, s *KeyState) error {
	pn := z.state.quota.at(now)
	s.PeriodStart, s.PeriodEnd, s.Source = pn.start, pn.end, SourceLocal
	if z.store == nil {
		s.Used = z.state.Local.quotaUsed(key, pn.gen)
	} else {
		r, err := z.store.Quota(ctx, z.Name, key, QuotaStep{Op: OpPeek, Limit: QuotaLimit{Limit: p.Events, Periods: &pn.periods}})
		if err != nil {
			z.followClock(err)
			return err
		}
		s.Used, s.Source = r.Used, SourceStore
		s.PeriodStart, s.PeriodEnd = pn.periods.Period(r.Period)
	}
	toEnd := max(time.Nanosecond, time.Until(s.PeriodEnd))
	s.Decision = quotaDecision(s.Used < p.Events, max(0, p.Events-s.Used), toEnd, s.PeriodEnd.Sub(s.PeriodStart), s.Source)
	s.Tracked, s.Window = s.Used > 0, s.Period
	return nil
}

// readRate is Read in a rate zone: a ban, else what decides the key's next
// request here: its local state or record, a cached denial or a store peek.
func (z *Zone) readRate(ctx context.Context, key string, now int64, p *Plan, s *KeyState) error {
	if d, banned := z.banned(key, now, p); banned {
		s.Decision, s.Tracked = d, true
		return nil
	}
	var d Decision
	var r algorithms.Result
	recorded := false
	if z.records != nil {
		r, recorded = z.records.Peek(z.Name, key, now, p.limit)
	}
	until, denied := z.deniedUntil(key, now)
	switch {
	case z.store == nil:
		d = fromResult(z.state.Local.Peek(key, now, p.limit), SourceLocal)
	case recorded:
		d = fromResult(r, SourceRecord)
	case denied:
		s.Decision, s.Tracked = z.cachedDenial(until, now, p), true
		return nil
	default:
		var err error
		if d, err = z.peekStore(ctx, key, p.limit); err != nil {
			return err
		}
	}
	src := d.Source
	d, err := z.peeked(key, now, d)
	if err != nil { // ErrUnknownKey: at the full limit
		d = Decision{Allowed: true, Remaining: p.Burst, Source: src}
	}
	s.Decision, s.Tracked = d, err == nil
	return nil
}
