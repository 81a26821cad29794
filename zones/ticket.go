package zones

import (
	"cmp"
	"context"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// Ticket is one zone's admission of one request, a value like x/time/rate's
// Reservation: what the zone took (cost, a turn, a slot, a ban started) and
// what the headers need. A request holds one per zone, all decided by Admit;
// Owner is the caller's side of the zone, so that they are one array.
type Ticket[O any] struct {
	Owner       O
	Zone        *Zone
	Key         string
	Raw         string          // the key as built, which prefix overrides match ("" is Key)
	Plan        Plan            // the limit decided under (adaptive: Burst is the key's limit once admitted)
	Cost        int64           // what it costs (a post-charged zone: what it is charged by default)
	PostCharged bool            // the zone checks before the request and charges after it (Charge)
	UpTo        bool            // Cost is an estimate that takes at most what the key has left
	Override    *Override       // the operator's override of the key (Resolve)
	Class       int             // adaptive zones: the request's class, 0 the highest (past the last: lowest)
	Done        <-chan struct{} // when set, closed as the client goes: adaptive zones with delay stop waiting
	Decision
	slot Slot
}

// Resolve looks up the operator's override of the ticket's key, before
// Admit: a limit becomes the ticket's plan; Admit decides exempt and deny.
// A zone without overrides pays one atomic load.
func (t *Ticket[O]) Resolve() {
	if t.Override = t.Zone.OverrideOf(t.Key, t.Raw); t.Override != nil && !t.Waived() {
		t.Plan = t.Override.Plan
	}
}

// Waived reports whether an exempt or deny override decides the ticket.
func (t *Ticket[O]) Waived() bool {
	return t.Override != nil && (t.Override.Exempt || t.Override.Deny)
}

// OverBurst reports whether the request costs more than the key can ever
// have: it is denied at once, consuming nothing.
func (t *Ticket[O]) OverBurst() bool {
	return !t.Zone.IsConcurrency() && !t.Waived() && t.Cost > t.Plan.Burst
}

// Admit decides the request in the ticket's zone alone, by its kind.
func (t *Ticket[O]) Admit(ctx context.Context, now int64) {
	z := t.Zone
	switch {
	case t.Waived():
		t.Decision = t.waived()
	case z.IsAdaptive():
		t.Decision, t.slot, t.Plan.Burst = z.acquireAdaptive(t.Key, t.Class, now, t.Done)
	case z.IsConcurrency():
		t.Decision, t.slot = z.acquire(ctx, t.Key, t.inFlightLimit())
	case t.PostCharged:
		t.Decision = z.Check(ctx, t.Key, now, &t.Plan)
	case t.UpTo:
		t.Decision = t.decideUpTo(ctx, now)
	case t.Cost > t.Plan.Burst:
		t.Decision = z.neverPasses(ctx, t.Key, now, &t.Plan)
	default:
		t.Decision = z.DecideWith(ctx, t.Key, now, &t.Plan, t.Cost)
	}
}

// waived is an exempt override's admission with the full limit left
// (adaptive: the key's limit now), consuming nothing, or a deny override's
// denial until it lapses.
func (t *Ticket[O]) waived() Decision {
	if t.Zone.IsAdaptive() {
		t.Plan.Burst = t.Zone.limitOf(t.Key)
	}
	if t.Override.Exempt {
		return Decision{Allowed: true, Remaining: t.Plan.Burst, Source: SourceOverride}
	}
	d := DenyRetryAfter
	if e := t.Override.Expires; e != 0 {
		d = max(time.Duration(e-time.Now().UnixNano()), time.Second)
	}
	return Decision{RetryAfter: d, ResetAfter: d, Source: SourceOverride}
}

// neverPasses denies, consuming nothing, a request costing more than the
// key can ever have: reset is the key's time to full as a check reads it,
// Retry-After one window (quota: the period's end), when its plan may give more.
func (z *Zone) neverPasses(ctx context.Context, key string, now int64, p *Plan) Decision {
	state := z.Check(ctx, key, now, p)
	if z.IsQuota() {
		toEnd := max(state.ResetAfter, time.Nanosecond)
		return Decision{RetryAfter: toEnd, ResetAfter: toEnd, Period: state.Period, Source: SourceLocal}
	}
	return Decision{RetryAfter: p.Window, ResetAfter: state.ResetAfter, Source: SourceLocal}
}

// decideUpTo decides a ticket whose cost is an estimate settled after the
// response (Charge): it takes the estimate or, when less is left, all that is
// left, so a key with any budget can make one request however large its
// estimate. Concurrent requests take in turn: together they overshoot only by
// what their actual costs exceed what they took. Only a denied estimate costs
// more: a check of what is left, and a decision for that.
func (t *Ticket[O]) decideUpTo(ctx context.Context, now int64) Decision {
	z := t.Zone
	t.Cost = min(t.Cost, t.Plan.Burst)
	d := z.DecideWith(ctx, t.Key, now, &t.Plan, t.Cost)
	if d.Allowed || d.Err != nil || t.Cost <= 1 {
		return d
	}
	left := z.Check(ctx, t.Key, now, &t.Plan)
	if !left.Allowed || left.Err != nil || left.Remaining <= 0 || left.Remaining >= t.Cost {
		return d
	}
	t.Cost = left.Remaining
	return z.DecideWith(ctx, t.Key, now, &t.Plan, t.Cost)
}

// inFlightLimit is a concurrency zone's limit for the ticket: an override's
// (adaptive: the key's), else the zone's.
func (t *Ticket[O]) inFlightLimit() int64 { return cmp.Or(t.Plan.Burst, t.Zone.Concurrency) }

// Holds reports whether the ticket holds a concurrency slot to Release.
func (t *Ticket[O]) Holds() bool { return t.slot.Held() }

// Slot is the ticket's slot, for a caller that releases it itself.
func (t *Ticket[O]) Slot() Slot { return t.slot }

// Release gives the ticket's slot back and counts it as remaining again.
func (t *Ticket[O]) Release() {
	t.Zone.Release(t.slot)
	t.slot = Slot{}
	t.Remaining = min(t.Remaining+1, t.Quota())
}

// Finish gives the ticket's slot back once the request ended at now, with
// its latency and failure for an adaptive zone (see Zone.ReleaseAfter).
func (t *Ticket[O]) Finish(now int64, latency time.Duration, failed bool) {
	t.Zone.ReleaseAfter(t.slot, now, latency, failed)
	t.slot = Slot{}
}

// Cancel gives back what the ticket took: its cost (a turn included) or slot,
// and its queue place; the decision then stands as after the refund. A refund
// the store could not take is returned (the ticket is cancelled all the same).
func (t *Ticket[O]) Cancel(ctx context.Context, now int64) error {
	if !t.Allowed || t.PostCharged {
		return nil
	}
	if t.slot.Held() {
		t.Release()
		return nil
	}
	var err error
	t.Decision, err = t.Zone.RefundWith(ctx, t.Key, now, t.Decision, &t.Plan, t.Cost)
	t.Served(0) // its queue place, if it waited
	return err
}

// Charge finishes a ticket that pays after its response, once it is known to
// cost cost: it is charged or refunded the difference from what it took (a
// post-charged zone's check, or a dry-run denial, took nothing); a waived one
// pays nothing. A refund the store could not take is returned.
func (t *Ticket[O]) Charge(ctx context.Context, now, cost int64) error {
	if t.Waived() {
		return nil
	}
	taken := t.Cost
	if !t.Allowed || t.PostCharged {
		taken = 0
	}
	switch d := cost - taken; {
	case d > 0:
		t.Zone.Charge(ctx, t.Key, now, &t.Plan, d)
	case d < 0:
		var err error
		t.Decision, err = t.Zone.RefundWith(ctx, t.Key, now, t.Decision, &t.Plan, -d)
		return err
	}
	return nil
}

// Served ends a ticket's wait for its turn, waited long, giving back its place.
func (t *Ticket[O]) Served(waited time.Duration) {
	if t.Delay > 0 {
		t.Zone.EndWait()
		t.ResetAfter = max(0, t.ResetAfter-waited)
		t.Delay = 0
	}
}

// Quota is draft-10's q: the plan's events, or a concurrency zone's limit.
func (t *Ticket[O]) Quota() int64 {
	if t.Zone.IsConcurrency() {
		return t.inFlightLimit()
	}
	return t.Plan.Events
}

// QuotaUnit is qu when it is not draft-10's default ("requests").
func (t *Ticket[O]) QuotaUnit() string {
	if t.Zone.IsConcurrency() {
		return "concurrent-requests"
	}
	return ""
}

// Window is w: the plan's window (none in a concurrency zone), or a quota
// zone's period.
func (t *Ticket[O]) Window() time.Duration {
	if t.Zone.IsQuota() {
		return t.Period
	}
	return t.Plan.Window
}

// MoreQuotaIn is t: how long until the key has one more unit than reported;
// false when none can come (a full key, or slots, which free at no time known).
func (t *Ticket[O]) MoreQuotaIn() (time.Duration, bool) {
	switch {
	case t.RetryAfter > 0:
		return t.RetryAfter, true
	case t.ResetAfter <= 0 || t.Zone.IsConcurrency():
		return 0, false
	case t.Zone.IsQuota(): // nothing comes back before the period's end
		return t.ResetAfter, t.Remaining == 0
	}
	// A unit frees each time resetAfter drops past a multiple of T.
	return (t.ResetAfter-1)%time.Duration(t.Plan.limit.EmissionInterval) + 1, true
}

// Admission is how a request's admission in its zones went.
type Admission struct {
	Denied int   // the ticket that denied the request, -1 when none (or dry run) did
	Turn   int64 // the latest turn a zone with delay reserved (monotime), 0 if none
	Gone   bool  // the client left while waiting; every ticket was cancelled
}

// Admit admits a request in its tickets' zones in order (tightest first,
// concurrency zones last), the one multi-zone loop of requests and
// connections alike:
//   - each ticket is admitted, then seen(i) (the caller's metrics and logs);
//   - a denial by a zone not in dry run stops the loop and cancels the
//     tickets admitted before it: a denied request consumes nothing;
//   - before a concurrency zone takes a slot (held while waiting, it would
//     deny others for nothing), the request waits for the latest turn
//     reserved (wait returns the context for the store calls after it, and
//     false when the client left, whose tickets it cancels).
//
// The turn still to wait for once every zone allowed is the Admission's.
func Admit[O any](ctx context.Context, tickets []Ticket[O], now int64, seen func(i int), wait func(turn int64) (context.Context, bool)) Admission {
	adm := Admission{Denied: -1}
	for i := range tickets {
		t := &tickets[i]
		if adm.Turn != 0 && t.Zone.IsConcurrency() {
			var ok bool
			if ctx, ok = wait(adm.Turn); !ok {
				adm.Gone = true
				return adm
			}
			adm.Turn = 0
		}
		t.Admit(ctx, now)
		if t.Delay > 0 { // its turn counts from the answer
			adm.Turn = max(adm.Turn, monotime.Now()+int64(t.Delay))
		}
		if !t.Gone { // else left while waiting for a place
			seen(i)
			if t.Allowed || t.Zone.DryRun {
				continue
			}
			adm.Denied = i
		}
		adm.Gone = t.Gone
		for j := range i {
			_ = tickets[j].Cancel(ctx, now)
		}
		return adm
	}
	return adm
}
