package distributed

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

//go:embed async.lua
var asyncScript string

//go:embed async_peek.lua
var asyncPeekLua string

// peekScript reads a key's TAT and Redis's clock, in µs.
var peekScript = redis.NewScript(asyncPeekLua)

// ErrStale: an async store has not synced with Redis for too long to keep
// deciding from its local view.
var ErrStale = errors.New("distributed: async view is stale (no successful sync with redis)")

// Async tuning.
const (
	// syncChunk is the most keys sent in one pipeline, and
	// firstSyncChunk the most in a sync's first one: small, so that Redis
	// answers it within the timeout even when busy, which tells a busy
	// Redis (the rest waits for the next sync) from one that is down.
	// 1,000 keys are about 6ms of Redis CPU.
	syncChunk      = 1000
	firstSyncChunk = 50
	// asyncMaxKeys caps the records an async store keeps for a zone that
	// did not say (SetMaxKeys).
	asyncMaxKeys = 1_000_000
	// asyncZoneSep joins zone and key in async keys (see RedisKey).
	asyncZoneSep = ".async:"
	// leaseLifetime is a lease's lifetime L in sync intervals: a key far
	// below its limit is synced about once per L, not once per interval,
	// and the bound's window grows from d+I to d+L (the extra capped by
	// the leases instances hold, about two bursts). At 100ms, 100k such
	// keys cost Redis about 38k reports a second at ~10µs each (async.lua's
	// HMGET, HSET, PEXPIRE and arithmetic per key on a 2-core machine):
	// 0.4 core; at 20 intervals it was 0.55-0.6.
	leaseLifetime = 30
)

// Async is the async-mode implementation of zones.Store: decisions are made
// in-process and reconciled with Redis every Options.SyncInterval (see
// docs/async.md for the scheme and its bound). It shares nothing
// with Strict but the connection: client, breakers, heartbeat,
// resets and concurrency slots.
type Async struct {
	*link
	hold    int64 // µs: the script's hold (see OpenAsync)
	life    int64 // ns: a lease's lifetime, leaseLifetime sync intervals
	stale   int64 // ns: beyond this since the last sync, Decide errors
	script  *redis.Script
	maxKeys int

	zonesMu sync.Mutex
	zones   atomic.Pointer[map[string]*asyncZone] // copy on write
	caps    map[string]int                        // max_keys by zone; guarded by zonesMu

	seq        atomic.Uint64 // the last report's sequence number
	lastSync   atomic.Int64  // monotime when the last successful sync started
	nextSync   atomic.Int64  // monotime when the next sync is due
	syncFailed atomic.Bool   // the last sync attempt failed

	epochMu sync.Mutex
	epochs  map[int]int64 // the epoch last seen, by hash slot (0 off a Cluster); see async_epoch.go

	syncMu   sync.Mutex // one sync at a time (the loop, Close's last one)
	stop     chan struct{}
	loopDone chan struct{}
	closed   sync.Once
}

// OpenAsync opens an async store for opts and starts its sync loop. Like
// Open, it does not contact Redis.
func OpenAsync(opts Options, logger *zap.Logger) (*Async, error) {
	return openAsync(opts, asyncMaxKeys, logger)
}

func openAsync(opts Options, maxKeys int, logger *zap.Logger) (*Async, error) {
	c, err := newLink(opts, logger)
	if err != nil {
		return nil, err
	}
	interval := c.opts.SyncInterval
	a := &Async{
		link: c,
		// An instance that admitted a fresh share reports it by its next
		// sync, or the one after if that one fails: within two intervals
		// and two sync bounds of the episode's start, and at least a
		// second, for syncs delayed on a loaded machine. Until then leases
		// keep its share aside. A report later than the hold lands after
		// leases were handed out: up to (N−1) extra shares (the bound's
		// last term). The price of a long hold: a key only one instance
		// sees gets about 1/N of its burst for the hold's length.
		hold:     max(time.Second, 2*interval+2*backgroundTimeout(c.opts)).Microseconds(),
		stale:    int64(2*interval + backgroundTimeout(c.opts)),
		life:     leaseLifetime * int64(interval),
		script:   redis.NewScript(asyncScript),
		maxKeys:  maxKeys,
		caps:     make(map[string]int),
		epochs:   make(map[int]int64),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	a.zones.Store(&map[string]*asyncZone{})
	now := monotime.Now()
	a.lastSync.Store(now) // a stale view may be used for 2 intervals from the start
	a.nextSync.Store(now + int64(interval))
	c.start(a)
	go a.loop()
	return a, nil
}

// Offers says what an async store offers besides its steps: its records
// of keys, quotas, the fleet-wide ban list, concurrency slots and the
// zones' overrides. Bans are the zones' own (listed for the other
// instances), not kept with the decisions.
func (a *Async) Offers() zones.Offers {
	return zones.Offers{Mode: "async", Quotas: true, Records: a, BanList: a.link, Slots: a.link, Overrides: a.overrides()}
}

// Rate runs one step of a rate zone's key (zones.Store) on this instance's
// allowance, without calling Redis: Remaining is this instance's
// allowance, not the fleet's. What a charge does not cover is reported at
// the next sync and counted in Redis past the burst; a decide with ahead
// admits for later as record.decideAhead says. A peek reads the fleet's
// view in Redis (leases count as spent, what instances admitted since
// their last sync does not); a reset also drops every instance's record.
// A step's ban rule is not for this store: Offers says so.
func (a *Async) Rate(ctx context.Context, zone, key string, st zones.RateStep) (zones.RateReply, error) {
	switch st.Op {
	case zones.OpDecide, zones.OpCheck, zones.OpCharge:
		res, err := a.step(ctx, zone, key, st)
		return zones.RateReply{Result: res}, err
	case zones.OpRefund:
		if a.isClosed() {
			return zones.RateReply{}, ErrClosed
		}
		s := a.zone(zone).shard(key)
		s.mu.Lock()
		if r := s.m[key]; r != nil {
			r.refund(st.Cost)
		}
		s.mu.Unlock()
		return zones.RateReply{}, nil
	case zones.OpPeek:
		v, err := a.ints(ctx, peekScript, a.RedisKey(zone, key), 2) // Redis's clock and the key's TAT, in µs
		if err != nil {
			return zones.RateReply{}, err
		}
		return zones.RateReply{Result: nanos(micro(st.Limit).Peek(v[1], v[0]))}, nil
	case zones.OpReset:
		a.forgetRecord(zone, key)
		return zones.RateReply{}, a.reset(ctx, a.RedisKey(zone, key), zone, key)
	}
	return zones.RateReply{}, fmt.Errorf("distributed: unknown rate op %d", st.Op)
}

// Close stops the sync loop, reports what this instance admitted and hands
// back its leases in a last sync (bounded by the sync timeout), then closes
// the connection.
func (a *Async) Close() error {
	var err error
	a.closed.Do(func() {
		close(a.stop)
		<-a.loopDone
		ctx, cancel := context.WithTimeout(context.Background(), backgroundTimeout(a.opts))
		_ = a.sync(ctx, false)
		cancel()
		a.syncQuotas(context.Background(), true) // bounded by the sync timeout itself
		err = a.link.Close()
	})
	return err
}

// Destruct closes the store (caddy.Destructor, for caddy.UsagePool).
func (a *Async) Destruct() error { return a.Close() }

// step runs st (a decide, check or charge) on key's record (created with a
// fresh share), under its shard's lock, when the local view is fresh
// enough to decide from. A dormant record is woken first when the fleet had
// tokens at its last sync. A denial is cached in the record until its retry
// time, less ahead (a zone with delay admits for later from then).
func (a *Async) step(ctx context.Context, zone, key string, st zones.RateStep) (algorithms.Result, error) {
	limit, ahead := st.Limit, int64(0)
	if st.Op == zones.OpDecide {
		ahead = max(0, st.Ahead)
	}
	now := monotime.Now()
	if now-a.lastSync.Load() > a.stale && a.syncFailed.Load() {
		return algorithms.Result{}, staleErr(&a.breaker)
	}
	if a.isClosed() {
		return algorithms.Result{}, ErrClosed
	}
	z := a.zone(zone)
	s := z.shard(key)
	s.mu.Lock()
	r := s.m[key]
	if r == nil {
		r = &record{allow: freshShare(limit.Burst, a.Instances())}
		z.insert(s, key, r)
	}
	if err := r.syncErr; err != nil {
		r.syncErr = nil
		s.mu.Unlock()
		return algorithms.Result{}, err
	}
	if since := r.failedSince; a.cluster && since != 0 && now-since > a.stale {
		// Syncs have not reached the key's master for too long; the
		// other masters' keys are unaffected. (On one server the whole
		// view goes stale at once, above.)
		s.mu.Unlock()
		return algorithms.Result{}, staleErr(a.breakerFor(a.RedisKey(zone, key)))
	}
	if r.dormant && r.retryAt <= now {
		var err error
		if r, err = a.wake(ctx, z, s, key, r, limit); err != nil {
			s.mu.Unlock()
			return algorithms.Result{}, err
		}
		now = monotime.Now()
	}
	var res algorithms.Result
	switch st.Op {
	case zones.OpDecide:
		res = r.decideAhead(now, a.nextSync.Load(), limit, st.Cost, ahead) // a decide when ahead is 0
	case zones.OpCharge:
		r.charge(st.Cost)
		fallthrough
	case zones.OpCheck:
		res = r.check(now, a.nextSync.Load(), limit)
	}
	if !res.Allowed && r.allow < 1 {
		r.deniedUntil = now + res.RetryAfter - ahead
	}
	s.mu.Unlock()
	return res, nil
}

// staleErr is the error of a view too stale to decide from: ErrUnavailable
// while b, the breaker of its Redis, is open.
func staleErr(b *breaker) error {
	if ok, _ := b.health(); !ok {
		return ErrUnavailable
	}
	return ErrStale
}

// shardOf is key's shard in zone, nil when the store has no record of zone.
func (a *Async) shardOf(zone, key string) *asyncShard {
	if z := (*a.zones.Load())[zone]; z != nil {
		return z.shard(key)
	}
	return nil
}

// Peek is what key's record would decide for a unit-cost request at now
// (zones.Records): its allowance left when it has a unit, else the wait
// until the next sync or the fleet's next token, as record.result reports
// them to the requests it decides. It consumes, creates and wakes nothing.
// ok is false for a key with no record (its next request gets a fresh
// share) and for a dormant record the next request wakes through Redis:
// the store's own peek (the fleet's view) answers for those.
func (a *Async) Peek(zone, key string, now int64, limit algorithms.Limit) (algorithms.Result, bool) {
	s := a.shardOf(zone, key)
	if s == nil {
		return algorithms.Result{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.m[key]
	if r == nil || (r.dormant && r.retryAt <= now) {
		return algorithms.Result{}, false
	}
	return r.result(now, a.nextSync.Load(), limit, r.allow >= 1), true
}

// DeniedUntil is the deny cache kept in key's record (zones.Records):
// when its last denial with no unit left ends, if it is in force at now.
func (a *Async) DeniedUntil(zone, key string, now int64) (int64, bool) {
	s := a.shardOf(zone, key)
	if s == nil {
		return 0, false
	}
	s.mu.Lock()
	var until int64
	if r := s.m[key]; r != nil {
		until = r.deniedUntil
	}
	s.mu.Unlock()
	return until, until > now
}

// Fallback runs one step of fail_policy local in key's record
// (zones.Records; see record.fallbackStep), creating the record, with
// no allowance, for a key it has none of. Only a charge or an admission
// creates one.
func (a *Async) Fallback(zone, key string, now int64, limit, share algorithms.Limit, op zones.Op, cost, ahead int64) algorithms.Result {
	z := a.zone(zone)
	s := z.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.m[key]
	if r == nil {
		if op == zones.OpCheck || op == zones.OpPeek || op == zones.OpRefund {
			return share.Peek(0, now)
		}
		if op == zones.OpDecide {
			if res := share.Decide(0, now, cost); !res.Allowed {
				return res // a cost over the share's burst
			}
		}
		r = &record{limit: limit}
		z.insert(s, key, r)
	}
	return r.fallbackStep(now, limit, share, op, cost, ahead)
}

// forgetDenials drops the deny cache of every record (resets may have been
// missed).
func (a *Async) forgetDenials() {
	a.eachShard(func(_ *asyncZone, s *asyncShard) {
		for _, r := range s.m {
			r.deniedUntil = 0
		}
	})
}

// RedisKey is the Redis key holding the state of key in zone:
// <key_prefix><zone>.async:<key>, never the name of a strict-mode key (see
// Strict.RedisKey).
func (a *Async) RedisKey(zone, key string) string {
	return a.opts.KeyPrefix + zone + asyncZoneSep + key
}

// forgetRecord forgets this instance's record of key in zone: the key was
// reset (here or elsewhere), and its next request starts a fresh share.
func (a *Async) forgetRecord(zone, key string) {
	s := a.shardOf(zone, key)
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.m, key)
	delete(s.q, key)
	s.mu.Unlock()
}

// synced reports whether the last sync succeeded: cached denials dropped
// after missed resets wait for it (see resets.go).
func (a *Async) synced() bool { return !a.syncFailed.Load() }

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Interface guards: what zones asks of an async store.
var (
	_ zones.Store   = (*Async)(nil)
	_ zones.Records = (*Async)(nil)
)
