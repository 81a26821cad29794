package distributed

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"strings"
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
var asyncLua string

// asyncScript syncs keys; peekScript reads a key as the admin API shows it:
// {Redis's clock, its TAT (async.lua's field t; 0: no key)}, in µs.
var (
	asyncScript = redis.NewScript(asyncLua)
	peekScript  = redis.NewScript(`local t = redis.call('TIME')
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), tonumber(redis.call('HGET', KEYS[1], 't')) or 0}`)
)

// ErrStale: an async store has not synced with Redis for too long to keep
// deciding from its local view.
var ErrStale = errors.New("distributed: async view is stale (no successful sync with redis)")

const (
	// syncChunk is the most keys in one pipeline (about 6ms of Redis CPU),
	// firstSyncChunk in a sync's first: small, so that a busy Redis
	// answers it within the timeout, which tells busy from down.
	syncChunk      = 1000
	firstSyncChunk = 50
	asyncMaxKeys   = 1_000_000 // records kept for a zone with no max_keys
	asyncZoneSep   = ".async:" // see RedisKey
	// leaseLifetime is a lease's lifetime L in sync intervals: a key far
	// below its limit is synced about once per L, and the bound's window
	// grows from d+I to d+L (the extra capped by the leases held, about two
	// bursts). At 100ms, 100k such keys cost Redis 0.4 core (0.55-0.6 at 20).
	leaseLifetime = 30
)

// Async is the async-mode zones.Store: decisions are made in-process and
// reconciled with Redis every Options.SyncInterval (docs/async.md).
type Async struct {
	*link
	hold    int64 // µs: the script's hold (see OpenAsync)
	life    int64 // ns: a lease's lifetime, leaseLifetime sync intervals
	stale   int64 // ns: beyond this since the last sync, Decide errors
	maxKeys int

	zonesMu sync.Mutex
	zones   atomic.Pointer[map[string]*asyncZone] // copy on write
	caps    map[string]int                        // max_keys by zone; guarded by zonesMu

	seq        atomic.Uint64 // the last report's sequence number
	lastSync   atomic.Int64  // monotime when the last successful sync started
	nextSync   atomic.Int64  // monotime when the next sync is due
	syncFailed atomic.Bool   // the last sync attempt failed

	epochMu sync.Mutex
	epochs  map[int]int64 // the epoch last seen, by hash slot (0 off a Cluster); see sawEpoch

	syncMu   sync.Mutex // one sync at a time (the loop, Close's last one)
	stop     chan struct{}
	loopDone chan struct{}
	closed   sync.Once
}

// OpenAsync opens an async store and starts its sync loop, without
// contacting Redis.
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
		// An instance reports a fresh share it admitted within two syncs
		// (two intervals and sync bounds, at least a second); leases keep
		// its share aside until then. A later report lands after leases
		// were handed out: up to (N−1) extra shares (the bound's last
		// term). A key only one instance sees gets about 1/N of its burst
		// for the hold.
		hold:     max(time.Second, 2*interval+2*backgroundTimeout(c.opts)).Microseconds(),
		stale:    int64(2*interval + backgroundTimeout(c.opts)),
		life:     leaseLifetime * int64(interval),
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

// Offers says what an async store offers besides its steps.
func (a *Async) Offers() zones.Offers {
	return zones.Offers{Mode: "async", Quotas: true, Records: a, BanList: a.link, Slots: a.link, Overrides: a.overrides()}
}

// Rate runs one step of a rate zone's key (zones.Store) on this instance's
// allowance (Remaining is this instance's), without calling Redis. What a
// charge does not cover is counted in Redis past the burst at the next
// sync. A peek reads the fleet's view in Redis (leases count as spent,
// what instances admitted since their last sync does not); a reset also
// drops every instance's record.
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
		v, err := a.ints(ctx, peekScript, a.RedisKey(zone, key)) // Redis's clock and the key's TAT, in µs
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
// back its leases in a last, bounded sync, then closes the connection.
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

// step runs a decide, check or charge on key's record (created with a fresh
// share) when the local view is fresh enough, waking a dormant record
// first when the fleet had tokens at its last sync. A denial is cached
// until its retry time less ahead.
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
		insert(z, s.m, key, r)
	}
	if err := r.syncErr; err != nil {
		r.syncErr = nil
		s.mu.Unlock()
		return algorithms.Result{}, err
	}
	if since := r.failedSince; a.cluster && since != 0 && now-since > a.stale {
		// Syncs have not reached the key's master for too long; the
		// other masters' keys are unaffected.
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
// while b, its Redis's breaker, is open.
func staleErr(b *breaker) error {
	if !b.closed() {
		return ErrUnavailable
	}
	return ErrStale
}

func (a *Async) shardOf(zone, key string) *asyncShard {
	if z := (*a.zones.Load())[zone]; z != nil {
		return z.shard(key)
	}
	return nil
}

// Peek is what key's record would decide for a unit-cost request at now
// (zones.Records), consuming, creating and waking nothing. ok is false for
// a key with no record and for a dormant record the next request wakes:
// the store's own peek answers for those.
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

// DeniedUntil is the deny cache kept in key's record (zones.Records).
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
// (zones.Records; record.fallbackStep); only a charge or an admission
// creates a record, with no allowance.
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
		insert(z, s.m, key, r)
	}
	return r.fallbackStep(now, limit, share, op, cost, ahead)
}

func (a *Async) forgetDenials() {
	a.eachShard(func(_ *asyncZone, s *asyncShard) {
		for _, r := range s.m {
			r.deniedUntil = 0
		}
	})
}

// RedisKey is the Redis key holding the state of key in zone:
// <key_prefix><zone>.async:<key> (see Strict.RedisKey).
func (a *Async) RedisKey(zone, key string) string {
	return a.opts.KeyPrefix + zone + asyncZoneSep + key
}

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

func (a *Async) synced() bool { return !a.syncFailed.Load() }

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Async mode's records by zone: a sharded map per zone, capped by max_keys.

// asyncZone holds one zone's records, sharded like zones.Table.
type asyncZone struct {
	name     string
	seed     maphash.Seed
	shards   []asyncShard
	mask     uint64
	shardCap atomic.Int64 // a reload may change max_keys
}

type asyncShard struct {
	mu sync.Mutex
	m  map[string]*record
	q  map[string]*quotaRecord // a quota zone's leases (quota_async.go)
	_  [32]byte                // keep neighbouring shards' locks off one cache line
}

func (z *asyncZone) shard(key string) *asyncShard {
	return &z.shards[maphash.String(z.seed, key)&z.mask]
}

// unlocked runs f, a call for one record, with s unlocked and *inFlight
// set: requests for the record meanwhile wait for it (await).
func (s *asyncShard) unlocked(inFlight *chan struct{}, f func()) {
	w := make(chan struct{})
	*inFlight = w
	s.mu.Unlock()
	f()
	s.mu.Lock()
	*inFlight = nil
	close(w)
}

// await waits, with s unlocked, until the call in flight w ends; ErrTimeout
// when ctx ends first.
func (s *asyncShard) await(ctx context.Context, w chan struct{}) error {
	s.mu.Unlock()
	select {
	case <-w:
	case <-ctx.Done():
	}
	s.mu.Lock()
	if ctx.Err() != nil {
		return ErrTimeout
	}
	return nil
}

// evictionSample is how many records a full shard looks at to make room.
const evictionSample = 16

// insert adds r for key to m, a map of a locked shard of z, making room
// first when it is full: of a sample, the record that costs least to lose
// goes (the first that costs nothing). The key is cloned so the map never
// pins a request's buffer.
func insert[R interface{ lossCost() int64 }](z *asyncZone, m map[string]R, key string, r R) {
	if int64(len(m)) >= z.shardCap.Load() {
		victim, least, seen := "", int64(-1), 0
		for k, v := range m {
			if c := v.lossCost(); least < 0 || c < least {
				victim, least = k, c
			}
			if seen++; least == 0 || seen == evictionSample {
				break
			}
		}
		delete(m, victim)
	}
	m[strings.Clone(key)] = r
}

// lossCost: a record with nothing pending costs nothing to evict (at most an
// unused lease is lost: undershoot), else what is pending.
func (r *record) lossCost() int64 { return r.pending }

// zone returns the records of zone, created on first use; the lookup takes
// no lock and allocates nothing.
func (a *Async) zone(name string) *asyncZone {
	if z := (*a.zones.Load())[name]; z != nil {
		return z
	}
	a.zonesMu.Lock()
	defer a.zonesMu.Unlock()
	old := *a.zones.Load()
	if z := old[name]; z != nil {
		return z
	}
	m := maps.Clone(old)
	maxKeys := a.maxKeys
	if n := a.caps[name]; n > 0 {
		maxKeys = n
	}
	n := 1
	for n < 64 && n*2*256 <= maxKeys {
		n *= 2
	}
	z := &asyncZone{name: strings.Clone(name), seed: maphash.MakeSeed(), shards: make([]asyncShard, n), mask: uint64(n - 1)}
	z.shardCap.Store(int64(max(1, maxKeys/n)))
	for i := range z.shards {
		z.shards[i].m = make(map[string]*record)
		z.shards[i].q = make(map[string]*quotaRecord)
	}
	m[z.name] = z
	a.zones.Store(&m)
	return z
}

// SetMaxKeys caps the records the store keeps for zone (its max_keys); a
// zone created before keeps its shards and takes the new cap.
func (a *Async) SetMaxKeys(zone string, maxKeys int) {
	if maxKeys <= 0 {
		return
	}
	a.zonesMu.Lock()
	a.caps[strings.Clone(zone)] = maxKeys
	a.zonesMu.Unlock()
	z := a.zone(zone)
	z.shardCap.Store(int64(max(1, maxKeys/len(z.shards))))
}

// Keys is the number of records the store holds for zone.
func (a *Async) Keys(zone string) int {
	z := (*a.zones.Load())[zone]
	if z == nil {
		return 0
	}
	return z.len()
}

func (z *asyncZone) len() (n int) {
	z.eachShard(func(s *asyncShard) { n += len(s.m) + len(s.q) })
	return n
}

// eachShard calls f with every shard of z, locked.
func (z *asyncZone) eachShard(f func(*asyncShard)) {
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		f(s)
		s.mu.Unlock()
	}
}

// eachShard calls f with every shard of every zone, locked.
func (a *Async) eachShard(f func(*asyncZone, *asyncShard)) {
	for _, z := range *a.zones.Load() {
		z.eachShard(func(s *asyncShard) { f(z, s) })
	}
}

var (
	_ zones.Store   = (*Async)(nil)
	_ zones.Records = (*Async)(nil)
)
