// Package algorithms holds the Generic Cell Rate Algorithm (GCRA) that every
// tally zone enforces, locally and (translated to Lua) in Redis.
//
// It is pure arithmetic: no clocks, no I/O. Callers pass the current time and
// the stored theoretical arrival time (TAT) in, and get the new TAT out, so the
// same code decides in nanoseconds in-process and is checked against the Redis
// script in microseconds.
//
// # Guarantee
//
// A limit of burst B and emission interval T admits, over any interval of
// length d, at most B + d/T units of cost. With B = N and T = W/N this means a
// fresh key may send N requests at once and then one every T: any window of
// length W sees at most 2N-1 admitted requests, and exactly N per W in the
// long run. B = 1 gives a perfectly smooth rate of one request every T.
package algorithms

// Limit is a GCRA limit: one unit of cost every EmissionInterval on average,
// with up to Burst units at once. Times are in whatever unit the caller uses
// consistently (nanoseconds locally, microseconds in Redis).
type Limit struct {
	EmissionInterval int64 // T = window / events
	Burst            int64 // B, in units of cost; at least 1
}

// NewLimit returns the limit of events per window with the given burst.
// A burst of 0 means burst = events. Events and window must be positive.
func NewLimit(events, window, burst int64) Limit {
	if burst <= 0 {
		burst = events
	}
	t := window / events
	if t < 1 {
		t = 1
	}
	return Limit{EmissionInterval: t, Burst: burst}
}

// Result is the outcome of one GCRA step.
type Result struct {
	Allowed bool
	// TAT is the value to store for the key: the new TAT when allowed, the
	// unchanged one when denied (a denied request consumes nothing).
	TAT int64
	// Remaining is how many more unit-cost requests would be allowed right
	// now: after this request when allowed, 0 when denied. Always in [0, Burst].
	Remaining int64
	// RetryAfter is how long until this request would be allowed; > 0 when
	// denied, 0 when allowed.
	RetryAfter int64
	// ResetAfter is how long until the key is back to its full burst. It is
	// also the key's time to live: after it the stored TAT carries no
	// information and may be dropped.
	ResetAfter int64
}

// Decide runs one GCRA step for a request of the given cost arriving at now,
// for a key whose stored TAT is tat (0 when the key is absent).
func (l Limit) Decide(tat, now, cost int64) Result {
	if tat < now {
		tat = now
	}
	newTAT := tat + cost*l.EmissionInterval
	allowAt := newTAT - l.Burst*l.EmissionInterval
	if allowAt <= now {
		return Result{
			Allowed:    true,
			TAT:        newTAT,
			Remaining:  (now - allowAt) / l.EmissionInterval,
			ResetAfter: newTAT - now,
		}
	}
	return Result{
		TAT:        tat,
		RetryAfter: allowAt - now,
		ResetAfter: tat - now,
	}
}

// Refund gives back the cost of a request that was allowed but must not count
// (a later zone denied it): TAT moves back by cost*T, never below now.
func (l Limit) Refund(tat, now, cost int64) int64 {
	tat -= cost * l.EmissionInterval
	if tat < now {
		tat = now
	}
	return tat
}

// Peek reports the state of a key without consuming anything: what a
// unit-cost request would see, with Allowed telling whether it would pass.
func (l Limit) Peek(tat, now int64) Result {
	r := l.Decide(tat, now, 1)
	if r.Allowed {
		// Report the key as it is, before the hypothetical request.
		r.Remaining++
		r.TAT = max(tat, now)
		r.ResetAfter = r.TAT - now
	}
	return r
}
