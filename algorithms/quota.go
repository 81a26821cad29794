package algorithms

// Quota is a calendar quota: at most Limit units of cost per period (see
// Period), counted from 0 at each period's start. Its state per key is the
// units used in the current period; what was used in an earlier one is 0.
//
// Unlike a GCRA limit nothing refills during the period: a key that used
// its quota on the 1st of the month waits for the 1st of the next. Inputs
// are non-negative; sums saturate at math.MaxInt64.
type Quota struct {
	// Units per period. 0 admits nothing but cost 0: a quota read from a
	// request that gave none, in a zone with no fallback.
	Limit int64
}

// QuotaResult is the outcome of one quota step.
type QuotaResult struct {
	Allowed   bool
	Used      int64 // units used in the period after the step
	Remaining int64 // Limit - Used, at least 0
}

func (q Quota) result(allowed bool, used int64) QuotaResult {
	return QuotaResult{Allowed: allowed, Used: used, Remaining: max(0, q.Limit-used)}
}

// Decide admits a request of cost when the period's quota has room for all
// of it, and counts it; a denied request counts nothing. Cost 0 passes.
func (q Quota) Decide(used, cost int64) QuotaResult {
	if n := add(used, cost); n <= q.Limit {
		return q.result(true, n)
	}
	return q.result(false, used)
}

// Check reports, counting nothing, whether a post-charged request may
// start: one unit is left.
func (q Quota) Check(used int64) QuotaResult { return q.result(used < q.Limit, used) }

// Charge counts cost after the response, whatever is left: a request
// checked while units remained is charged in full. The debt a key can end a
// period with is capped at what one charge counts: after any charge, used
// is at most Limit + cost, however many requests were in flight when the
// quota ran out. Allowed reports whether the key still has a unit left.
func (q Quota) Charge(used, cost int64) QuotaResult {
	n := add(min(used, q.Limit), cost)
	return q.result(n < q.Limit, n)
}

// Refund gives back cost counted for a request that must not count.
func (q Quota) Refund(used, cost int64) QuotaResult { return q.result(true, max(0, used-cost)) }
