package zones

import (
	"context"
	"time"
)

// Status is a key's state as a client asks for its own (the
// rate_limit_status handler): what a unit-cost request would get now.
type Status struct {
	Decision
	// Quota zones: the units used in the current period, and its bounds.
	Used                   int64
	PeriodStart, PeriodEnd time.Time
	// Concurrency zones: the key's requests in flight, and its limit of
	// them (an adaptive zone's: the key's limit now).
	InFlight, Limit int64
}

// Status reports what a unit-cost request of key would get at now under
// plan p (the override o, when not nil, resolved: Ticket.Resolve),
// consuming nothing and starting no ban: a ban or a cached denial first
// (no store call), then the key's state here or one peek of the store.
// Its Remaining is what the next request's headers say, after it.
func (z *Zone) Status(ctx context.Context, key string, now int64, p *Plan, o *Override) (Status, error) {
	switch {
	case o != nil && o.Exempt:
		return Status{Decision: Decision{Allowed: true, Remaining: max(0, p.Burst-1), Source: SourceOverride}}, nil
	case o != nil && o.Deny:
		d := o.DenyFor(time.Now().UnixNano())
		return Status{Decision: Decision{RetryAfter: d, ResetAfter: d, Source: SourceOverride}}, nil
	case z.IsConcurrency():
		n, err := z.SlotsInUse(ctx, key)
		if err != nil {
			return Status{}, err
		}
		limit := p.Burst
		if z.IsAdaptive() {
			limit = z.ConcurrencyOf(key)
		} else if limit <= 0 {
			limit = z.Concurrency
		}
		left := max(0, limit-n)
		return Status{Decision: Decision{Allowed: left > 0, Remaining: max(0, left-1)}, InFlight: n, Limit: limit}, nil
	case z.state.quota != nil:
		if d, ok := z.CachedDenial(key, now, p); ok {
			start, end := z.PeriodNow(now)
			return Status{Decision: d, PeriodStart: start, PeriodEnd: end, Used: p.Events}, nil
		}
		q, err := z.peekQuotaUnder(ctx, key, now, p.Events)
		if err != nil {
			return Status{}, err
		}
		toEnd := max(time.Duration(1), time.Until(q.PeriodEnd))
		d := Decision{Allowed: q.Remaining > 0, Remaining: max(0, q.Remaining-1), ResetAfter: toEnd, Period: q.PeriodEnd.Sub(q.PeriodStart), Source: q.Source}
		if q.Remaining == 0 {
			d.RetryAfter = toEnd
		}
		return Status{Decision: d, Used: q.Used, PeriodStart: q.PeriodStart, PeriodEnd: q.PeriodEnd}, nil
	}
	if z.state.Bans != nil {
		if end, level, banned := z.banIn(key, now); banned {
			return Status{Decision: z.bannedDecision(key, now, p, end, level)}, nil
		}
	}
	if until, ok := z.deniedUntil(key, now); ok && z.store != nil {
		retry := time.Duration(until - now)
		return Status{Decision: Decision{RetryAfter: retry, ResetAfter: retry + time.Duration((p.limit.Burst-1)*p.limit.EmissionInterval), Source: SourceDenyCache}}, nil
	}
	var d Decision
	switch r, ok := z.peekRecord(key, now, p.limit); {
	case z.store == nil:
		d = fromResult(z.state.Local.Peek(key, now, p.limit), SourceLocal)
	case ok:
		d = fromResult(r, SourceRecord)
	default:
		var err error
		if d, err = z.peekStore(ctx, key, p.limit); err != nil {
			return Status{}, err
		}
	}
	if d.RetryAfter <= 0 && d.Remaining >= 1 {
		// The state now, as the next request would leave it.
		d.Allowed, d.Remaining = true, d.Remaining-1
		d.ResetAfter += time.Duration(p.limit.EmissionInterval)
	}
	if z.state.Bans != nil && z.banRule == (BanRule{}) {
		if b, ok := z.BanOf(key, now); ok {
			z.withBan(&d, b.Left, b.Level)
		}
	}
	return Status{Decision: d}, nil
}
