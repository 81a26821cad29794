package zones

// Denies reports whether a unit-cost request of key would be denied at now
// (monotime) under its last plan, with no store call: by an override, a ban
// known here, a local zone's table, else the deny cache (a distributed
// zone's denial is seen once a request of the key was denied here). It
// consumes nothing and costs one lookup: deny_while asks it for every new
// connection. A concurrency zone never denies here: its slots free as
// requests end, not with time.
func (z *Zone) Denies(key string, now int64) bool {
	if o := z.Override(key); o != nil && (o.Exempt || o.Deny) {
		return o.Deny
	}
	if z.IsConcurrency() {
		return false
	}
	if _, _, banned := z.banIn(key, now); banned {
		return true
	}
	if z.store == nil {
		p := z.LastPlan(key, now)
		d := z.localStep(false, key, now, &p, OpPeek, 1, 0)
		// A zone with delay admits for later what is at most its delay away.
		return !d.Allowed && (z.Delay == 0 || z.DryRun || d.RetryAfter > z.Delay)
	}
	_, denied := z.deniedUntil(key, now)
	return denied
}
