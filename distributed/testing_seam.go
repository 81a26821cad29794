package distributed

// The testing seam: what the integration tests (tests/, exported names
// only) need beyond zones.Store and Caddy's use: the scripts on an explicit
// clock, syncs on demand, what a store holds. None of it is on the request
// path.

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// EvalAt runs the GCRA script directly (no batcher, no breaker) with an
// explicit clock, for the test that checks it against algorithms.Limit:
// limit, nowUs and the result are in µs. Result.TAT is not filled in.
func (s *Strict) EvalAt(ctx context.Context, op Op, zone, key string, limit algorithms.Limit, cost, nowUs int64) (algorithms.Result, error) {
	res, errs, err := s.EvalManyAt(ctx, []Step{{op, zone, key, limit, cost}}, nowUs)
	if err != nil {
		return algorithms.Result{}, err
	}
	return res[0], errs[0]
}

// Step is one key's GCRA step for EvalManyAt.
type Step struct {
	Op    Op
	Zone  string
	Key   string
	Limit algorithms.Limit // in microseconds
	Cost  int64
}

// EvalManyAt is EvalAt for many steps in one call, as the batcher sends a
// batch. A step's error is in errs; err is the call's.
func (s *Strict) EvalManyAt(ctx context.Context, steps []Step, nowUs int64) (results []algorithms.Result, errs []error, err error) {
	keys, argv := make([]string, len(steps)), []any{nowUs}
	for i, st := range steps {
		keys[i] = s.RedisKey(st.Zone, st.Key)
		argv = append(argv, st.Limit.EmissionInterval, st.Limit.Burst, st.Cost, string(st.Op))
	}
	return evalMany(ctx, s, s.gcra, keys, argv, 2, parseStep, func(r reply) algorithms.Result { return r.step })
}

// QuotaStep is one key's quota step for EvalQuotaManyAt.
type QuotaStep struct {
	Op    Op
	Zone  string
	Key   string
	Limit zones.QuotaLimit
	Cost  int64
}

// EvalQuotaAt is EvalAt for the quota script, checked against
// algorithms.Quota.
func (s *Strict) EvalQuotaAt(ctx context.Context, op Op, zone, key string, q zones.QuotaLimit, cost, nowUs int64) (zones.QuotaResult, error) {
	res, errs, err := s.EvalQuotaManyAt(ctx, []QuotaStep{{op, zone, key, q, cost}}, nowUs)
	if err != nil {
		return zones.QuotaResult{}, err
	}
	return res[0], errs[0]
}

// EvalQuotaManyAt is EvalManyAt for the quota script.
func (s *Strict) EvalQuotaManyAt(ctx context.Context, steps []QuotaStep, nowUs int64) (results []zones.QuotaResult, errs []error, err error) {
	keys, argv := make([]string, len(steps)), []any{nowUs}
	for i, st := range steps {
		keys[i] = s.QuotaKey(st.Zone, st.Key)
		argv = append(argv, st.Limit.Periods.Arg, st.Limit.Limit, st.Cost, string(st.Op))
	}
	result := func(r reply) zones.QuotaResult { return r.quota }
	return evalMany(ctx, s, s.quota, keys, argv, 3, parseQuotaStep, result)
}

// evalMany runs script once for keys, parsing n integers per key; result
// takes a key's result from its reply.
func evalMany[R any](ctx context.Context, s *Strict, script *redis.Script, keys []string, argv []any, n int,
	parse func([]any) reply, result func(reply) R) (results []R, errs []error, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	v, err := values(script.Run(ctx, s.client, keys, argv...), n*len(keys))
	for i := 0; err == nil && i < len(keys); i++ {
		rep := parse(v[n*i : n*i+n])
		results, errs = append(results, result(rep)), append(errs, rep.err)
	}
	return results, errs, err
}

// ResetsSubscribed reports whether the store is subscribed to resets and
// has dropped the cached denials of its last drop: until then any may go.
func (c *link) ResetsSubscribed() bool {
	return c.resets.live.Load() && !c.resets.missed.Load()
}

// HeldSlots is how many slots this instance holds and releases pending.
func (c *link) HeldSlots() (held, pending int) {
	c.slots.mu.Lock()
	defer c.slots.mu.Unlock()
	return len(c.slots.held), len(c.slots.releases)
}

// LeaseLifetime is the L of the bound: the longest a lease is held.
func (a *Async) LeaseLifetime() time.Duration { return time.Duration(a.life) }

// LastSync is when the last successful sync started (its snapshot time).
func (a *Async) LastSync() time.Time { return monotime.Time(a.lastSync.Load()) }

// Len is the number of records the store holds.
func (a *Async) Len() int {
	n := 0
	for _, z := range *a.zones.Load() {
		n += z.len()
	}
	return n
}

// HoldNextSync stops this region's next sync just before it is sent, as a
// SIGSTOP of the coordinator would: held receives a channel then, whose
// closing lets it go on with the fencing token it had.
func (r *Region) HoldNextSync() (held <-chan chan struct{}) {
	c := make(chan chan struct{}, 1)
	r.hold.Store(&c)
	return c
}

// CoordinatedZones is how many zones the coordinator keeps; read it after Close.
func (r *Region) CoordinatedZones() int { return len(r.coord.held) }

// Count notes decisions of key in zone for the region's demand without
// deciding, as a scope global decision does.
func (r *Region) Count(zone, key string, allowed bool, cost int64) {
	r.count(zone, key, allowed, cost, algorithms.Limit{}) // no span: the zone's
}

// CountWith is Count at limit (ns), as a zone's plan gives it.
func (r *Region) CountWith(zone, key string, allowed bool, cost int64, limit algorithms.Limit) {
	r.count(zone, key, allowed, cost, limit)
}

// SyncNow pushes this instance's counts, takes or renews the coordinator
// lock and, holding it, syncs with the global store once and reads back
// what it published, reporting whether it synced; never beside the
// region's own loops.
func (r *Region) SyncNow() bool {
	r.poll()
	now := monotime.Now()
	r.lock(now)
	if r.coord.token == 0 {
		return false
	}
	r.sync(now, false) // it pushed its counts just before: the collect holds them
	r.poll()
	return true
}

// Demand is what this instance counted of key in zone since its last poll
// (admitted and denied units), read without taking it.
func (r *Region) Demand(zone, key string) (admitted, denied int64) {
	if z := r.zone(zone); z != nil {
		if v, ok := z.counts.Load(key); ok {
			c := v.(*counter)
			return max(0, c.n[0].Load()), max(0, c.n[1].Load())
		}
	}
	return 0, 0
}
