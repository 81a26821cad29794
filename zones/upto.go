package zones

import "context"

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
