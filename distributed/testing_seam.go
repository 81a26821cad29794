package distributed

// The testing seam: what the integration tests need of the stores besides
// zones.Store and what Caddy uses. They live in their own module (tests/),
// which reaches exported names only: the Lua-versus-Go agreement test runs
// gcra.lua and quota.lua with an explicit clock (EvalAt, EvalManyAt,
// EvalQuotaAt, EvalQuotaManyAt), and the Redis tests
// beat without waiting for the loop and read what a store holds in memory.
// Nothing here is on the request path; tests/ relies on these signatures.

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// EvalAt runs the GCRA script directly (no batcher, no breaker) with an
// explicit clock: limit, nowUs and the result are in microseconds, as Redis
// stores them. Production calls leave the clock to Redis TIME; EvalAt exists
// for the test that checks the script against algorithms.Limit, and for
// tools. Result.TAT is not filled in (read the key).
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

// EvalManyAt is EvalAt for many steps, in one call of the GCRA script, in
// order, as the batcher sends a batch. A step's error (a foreign value found
// and deleted) is in errs; err is the call's.
func (s *Strict) EvalManyAt(ctx context.Context, steps []Step, nowUs int64) (results []algorithms.Result, errs []error, err error) {
	keys, argv := make([]string, len(steps)), []any{nowUs}
	for i, st := range steps {
		keys[i] = s.RedisKey(st.Zone, st.Key)
		argv = append(argv, st.Limit.EmissionInterval, st.Limit.Burst, st.Cost, string(st.Op))
	}
	reps, err := s.evalMany(ctx, s.gcra, keys, argv, 2, parseStep)
	for _, rep := range reps {
		results, errs = append(results, rep.step), append(errs, rep.err)
	}
	return results, errs, err
}

// QuotaStep is one key's quota step for EvalQuotaManyAt.
type QuotaStep struct {
	Op    Op
	Zone  string
	Key   string
	Limit zones.QuotaLimit
	Cost  int64
}

// EvalQuotaAt runs the quota script directly (no batcher, no breaker) with
// an explicit clock in microseconds, for the test that checks it against
// algorithms.Quota.
func (s *Strict) EvalQuotaAt(ctx context.Context, op Op, zone, key string, q zones.QuotaLimit, cost, nowUs int64) (zones.QuotaResult, error) {
	res, errs, err := s.EvalQuotaManyAt(ctx, []QuotaStep{{op, zone, key, q, cost}}, nowUs)
	if err != nil {
		return zones.QuotaResult{}, err
	}
	return res[0], errs[0]
}

// EvalQuotaManyAt runs steps in one call of the quota script, in order, as
// the batcher sends a batch, with an explicit clock (see EvalQuotaAt). A
// step's error is in errs; err is the call's.
func (s *Strict) EvalQuotaManyAt(ctx context.Context, steps []QuotaStep, nowUs int64) (results []zones.QuotaResult, errs []error, err error) {
	keys, argv := make([]string, len(steps)), []any{nowUs}
	for i, st := range steps {
		keys[i] = s.QuotaKey(st.Zone, st.Key)
		argv = append(argv, st.Limit.Periods.Arg, st.Limit.Limit, st.Cost, string(st.Op))
	}
	reps, err := s.evalMany(ctx, s.quota, keys, argv, 3, parseQuotaStep)
	for _, rep := range reps {
		results, errs = append(results, rep.quota.result()), append(errs, rep.err)
	}
	return results, errs, err
}

// evalMany runs script once for keys with argv, bounded by the timeout, and
// reads n integers of its reply per key with parse.
func (s *Strict) evalMany(ctx context.Context, script *redis.Script, keys []string, argv []any, n int, parse func([]any) reply) ([]reply, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	v, err := values(script.Run(ctx, s.client, keys, argv...), n*len(keys))
	if err != nil {
		return nil, err
	}
	reps := make([]reply, len(keys))
	for i := range reps {
		reps[i] = parse(v[n*i : n*i+n])
	}
	return reps, nil
}

// Heartbeat beats now (see heartbeat) instead of waiting for the loop, and
// returns the number of live instances.
func (c *link) Heartbeat(ctx context.Context) (int, error) { return c.heartbeat(ctx) }

// ResetsSubscribed reports whether the store is subscribed to resets and
// has dropped the cached denials its subscription drops (resets.go): a
// denial cached from then on lasts until its time, a reset, or the next
// time the subscription drops. Until then any cached denial may go.
func (c *link) ResetsSubscribed() bool {
	return c.resets.live.Load() && !c.resets.missed.Load()
}

// HeldSlots is how many slots this instance holds in Redis and how many
// releases have not reached Redis yet.
func (c *link) HeldSlots() (held, pending int) {
	c.slots.mu.Lock()
	defer c.slots.mu.Unlock()
	return len(c.slots.held), len(c.slots.releases)
}

// LeaseLifetime is the longest a lease is held before it is renewed or
// handed back: the L of the bound.
func (a *Async) LeaseLifetime() time.Duration { return time.Duration(a.life) }

// LastSync is when the last successful sync started (its snapshot time).
func (a *Async) LastSync() time.Time { return monotime.Time(a.lastSync.Load()) }

// Len is the number of records the store holds, in every zone.
func (a *Async) Len() int {
	n := 0
	for _, z := range *a.zones.Load() {
		n += z.len()
	}
	return n
}

// HoldNextSync stops this region's next sync with the global store just
// before it is sent, as a SIGSTOP of the coordinator would: held receives
// a channel once the sync is stopped there, and closing that channel lets
// it go on, with the fencing token it had.
func (r *Region) HoldNextSync() (held <-chan chan struct{}) {
	c := make(chan chan struct{}, 1)
	r.hold.Store(&c)
	return c
}

// CoordinatedZones is the number of zones the coordinator keeps state of
// (holdings, reports): read it after Close.
func (r *Region) CoordinatedZones() int { return len(r.coord.held) }

// Count notes decisions of key in zone for the region's demand, as a scope
// global decision through Wrap's store does, without deciding: for
// benchmarks and tests that drive many keys.
func (r *Region) Count(zone, key string, allowed bool, cost int64) {
	z := r.zone(zone)
	if z == nil {
		return
	}
	r.count(zone, key, allowed, cost, algorithms.Limit{EmissionInterval: z.interval.Load(), Burst: z.burst.Load()})
}

// CountWith is Count for a key decided at limit (ns), as a zone's plan
// gives it.
func (r *Region) CountWith(zone, key string, allowed bool, cost int64, limit algorithms.Limit) {
	r.count(zone, key, allowed, cost, limit)
}

// SyncNow pushes this instance's counts, takes or renews the region's
// coordinator lock and, when it holds it, syncs with the global store once
// and reads back what it published; it reports whether it synced. It is
// for benchmarks and tests whose SyncInterval is longer than they run: it
// must not run alongside the region's own loops.
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

// Demand is what this instance counted of key in zone for the region's
// demand since its last poll (admitted and denied units), read without
// taking it: for tests of which steps count.
func (r *Region) Demand(zone, key string) (admitted, denied int64) {
	if z := r.zone(zone); z != nil {
		if v, ok := z.counts.Load(key); ok {
			c := v.(*counter)
			return max(0, c.n[0].Load()), max(0, c.n[1].Load())
		}
	}
	return 0, 0
}
