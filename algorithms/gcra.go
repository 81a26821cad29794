// Package algorithms holds the Generic Cell Rate Algorithm (GCRA) that
// every tally zone enforces, locally and (translated to Lua) in Redis.
//
// It is pure arithmetic: no clocks, no I/O. Callers pass the current time
// and the stored theoretical arrival time (TAT) in, and get the new TAT
// out, so the same code decides in nanoseconds in-process and is checked
// against the Redis script in microseconds.
//
// # The algorithm
//
// A key's whole state is one number, its TAT (theoretical arrival time; 0
// for a key never seen). A limit has burst B and emission interval T (a
// window W of N events: T = W/N). A request of cost c arriving at now:
//
//	tat        = max(TAT, now)
//	newTAT     = tat + c·T
//	allowAt    = newTAT − B·T
//	allowed    = allowAt <= now               (then newTAT is stored)
//	remaining  = ⌊(now − allowAt)/T⌋          (allowed: after this request; denied: 0)
//	retryAfter = allowAt − now                (denied only; > 0)
//	resetAfter = newTAT − now (allowed), tat − now (denied)
//
// resetAfter is when the key is back to its full burst: a stored TAT <= now
// carries no information, so it is also the key's time to live. A refund
// moves the TAT back by c·T, never below now (Limit.Refund); a charge after
// the response moves it on by c·T whatever the burst, but not past now +
// 2·B·T unless it was already (Limit.Charge).
//
// # Guarantee
//
// A limit of burst B and emission interval T admits, over any interval of
// length d, at most B + d/T units of cost. With B = N and T = W/N this
// means a fresh key may send N requests at once and then one every T: any
// window of length W sees at most 2N-1 admitted requests, and exactly N per
// W in the long run. B = 1 gives a perfectly smooth rate of one request
// every T.
//
// # Overflow
//
// Inputs are non-negative. The arithmetic saturates at math.MaxInt64
// instead of wrapping, so an extreme cost or limit denies (or reports a
// very long wait) rather than admitting or wrapping negative; callers
// refuse limits whose burst × emission interval they cannot represent.
package algorithms

import (
	"math"
	"math/bits"
)

// mul returns a*b for non-negative a and b, or math.MaxInt64 when the
// product does not fit.
func mul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// add returns a+b for non-negative b, or math.MaxInt64 when the sum does
// not fit.
func add(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Limit is a GCRA limit: one unit of cost every EmissionInterval on
// average, with up to Burst units at once. Times are in whatever unit the
// caller uses consistently (nanoseconds locally, microseconds in Redis).
type Limit struct {
	EmissionInterval int64 // T = window / events
	Burst            int64 // B, in units of cost; at least 1
}

// NewLimit returns the limit of events per window with the given burst (0:
// events). Events and window must be positive.
func NewLimit(events, window, burst int64) Limit {
	if burst <= 0 {
		burst = events
	}
	return Limit{EmissionInterval: max(1, window/events), Burst: burst}
}

// Result is the outcome of one GCRA step.
type Result struct {
	Allowed bool
	// TAT is the value to store for the key: the new TAT when allowed, the
	// unchanged one when denied (a denied request consumes nothing).
	TAT int64
	// Remaining is how many more unit-cost requests would be allowed now:
	// after this request when allowed, 0 when denied; in [0, Burst].
	Remaining int64
	// RetryAfter is how long until this request would be allowed; > 0
	// exactly when denied.
	RetryAfter int64
	// ResetAfter is how long until the key is back to its full burst: its
	// time to live, after which the stored TAT carries no information.
	ResetAfter int64
	// Delay is how long a request DecideAhead admitted for later waits for
	// its turn; 0 for one that passes at once.
	Delay int64
}

// Decide runs one GCRA step for a request of the given cost arriving at
// now, for a key whose stored TAT is tat (0 when the key is absent).
//
// It is the formula of the package documentation (newTAT = max(TAT, now) +
// cost·T, allowed when newTAT − B·T <= now) rearranged around wait =
// max(TAT, now) − now, so that no intermediate exceeds what the result
// needs: allowed when wait <= (B − cost)·T, remaining = B − cost −
// ⌈wait/T⌉.
func (l Limit) Decide(tat, now, cost int64) Result {
	tat = max(tat, now)
	wait := tat - now
	if cost > l.Burst { // never allowed, however long the key waits
		return Result{TAT: tat, RetryAfter: add(wait, mul(cost-l.Burst, l.EmissionInterval)), ResetAfter: wait}
	}
	slack := mul(l.Burst-cost, l.EmissionInterval)
	if wait > slack {
		return Result{TAT: tat, RetryAfter: wait - slack, ResetAfter: wait}
	}
	newTAT := add(tat, mul(cost, l.EmissionInterval))
	busy := wait / l.EmissionInterval
	if wait%l.EmissionInterval != 0 {
		busy++
	}
	return Result{
		Allowed:    true,
		TAT:        newTAT,
		Remaining:  l.Burst - cost - busy,
		ResetAfter: newTAT - now,
	}
}

// DecideAhead is Decide for a limit that lets a request wait for its turn:
// a request Decide would deny, whose allow time is at most ahead away, is
// admitted for later. Its slot is reserved at once (the TAT moves as for an
// allowed request) and Delay is how long it must wait, allowAt − now;
// Remaining is then 0 and ResetAfter counts from now, as for any allowed
// request. A request further away is denied as Decide denies it: its
// RetryAfter, allowAt − now, counts the reservations already made, and is
// when it would pass without waiting. With ahead 0 it is Decide.
//
// Over any interval of length d the limit still admits at most B + d/T
// units: a reservation is an admission at its allow time, which GCRA spaces
// by T like any other; the requests admitted for later are served over d +
// ahead.
func (l Limit) DecideAhead(tat, now, cost, ahead int64) Result {
	r := l.Decide(tat, now, cost)
	if r.Allowed || ahead <= 0 || cost > l.Burst || r.RetryAfter > ahead {
		return r
	}
	newTAT := add(r.TAT, mul(cost, l.EmissionInterval))
	return Result{Allowed: true, TAT: newTAT, ResetAfter: newTAT - now, Delay: r.RetryAfter}
}

// Refund gives back the cost of an allowed request that must not count: TAT
// moves back by cost*T, never below now.
func (l Limit) Refund(tat, now, cost int64) int64 {
	return max(tat-mul(cost, l.EmissionInterval), now)
}

// Peek reports the state of a key without consuming anything: what a
// unit-cost request would see, with Allowed telling whether it would pass.
func (l Limit) Peek(tat, now int64) Result {
	r := l.Decide(tat, now, 1)
	if r.Allowed { // the key as it is, before the hypothetical request
		r.Remaining++
		r.TAT = max(tat, now)
		r.ResetAfter = r.TAT - now
	}
	return r
}

// Charge adds cost to a key after the fact (a post-charged zone, once the
// response says what the request cost): the TAT moves on by cost*T from
// max(tat, now) whatever the burst, so a key may go into debt and is then
// denied until it is paid. The debt is capped: the TAT never passes now +
// 2*B*T (one burst owed beyond the full burst), so that no run of charges
// can overflow. The result is the key as it stands afterwards, as Peek
// reports it; its TAT is the one to store.
func (l Limit) Charge(tat, now, cost int64) Result {
	newTAT := add(max(tat, now), mul(cost, l.EmissionInterval))
	newTAT = min(newTAT, max(tat, add(now, mul(2*l.Burst, l.EmissionInterval))))
	return l.Peek(newTAT, now)
}
