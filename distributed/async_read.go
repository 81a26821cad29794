package distributed

// Async mode's admin read of a key: what this instance's record would
// decide, kept apart from the steps in async.go.

import "github.com/caddy-tally/ratelimit/algorithms"

// Peek is what key's record would decide for a unit-cost request at now
// (zones.Records): its allowance left when it has a unit, else the wait
// until the next sync or the fleet's next token, as record.result reports
// them to the requests it decides. It consumes, creates and wakes nothing.
// ok is false for a key with no record (its next request gets a fresh
// share) and for a dormant record the next request wakes through Redis:
// the store's own peek (the fleet's view) answers for those.
func (a *Async) Peek(zone, key string, now int64, limit algorithms.Limit) (algorithms.Result, bool) {
	z := (*a.zones.Load())[zone]
	if z == nil {
		return algorithms.Result{}, false
	}
	s := z.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.m[key]
	if r == nil || (r.dormant && r.retryAt <= now) {
		return algorithms.Result{}, false
	}
	return r.result(now, a.nextSync.Load(), limit, r.allow >= 1), true
}
