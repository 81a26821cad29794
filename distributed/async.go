package distributed

// Async mode: decide in-process, reconcile with Redis in the background.
//
// # Scheme
//
// Each instance keeps, per (zone, key), an allowance: tokens it may admit on
// its own until its next sync. A request is decided against it with no Redis
// call. Every sync_interval, one pipelined batch of single-key scripts
// (async.lua) reports, for every key the instance holds, the cost it
// admitted that Redis has not counted yet and the allowance it did not use,
// and takes a new lease: ⌈spare/N⌉ tokens, reserved in the key's GCRA state
// (its TAT moves forward) before they are spent. N is the number of live
// instances (heartbeat), spare the tokens the fleet has left.
//
// A key this instance has never synced is decided against a fresh share,
// max(1, ⌊B/N⌋), which Redis does not know about until the first sync; that
// sync counts what it admitted and reserves the rest like a lease. For a
// hold of 2·(sync_interval + a sync's time bound), at least 1s, after a key
// starts an episode (it is written while full), leases leave aside one fresh share per
// live instance that has not reported the key yet, so a burst that reaches every instance at once stays within
// the limit. A record is dropped when Redis says the key is full and the
// instance has no traffic for it, so an instance takes a fresh share at most
// once per key per episode (from full to full again).
//
// # Bound
//
// With burst B, emission interval T, sync interval I and N instances, the
// fleet admits over any interval of length d at most
//
//	B + ⌊(d + I)/T⌋ + (N−1)·max(1, ⌊B/N⌋)
//
// Leases are GCRA admissions in Redis, so leases reserved in any window of
// length d+I number at most B + (d+I)/T (strict mode's bound), and a lease is
// spent within one sync interval of being reserved. The last term is the
// fresh shares of instances that first see a key already spent elsewhere
// after its hold: at most one per instance per episode, and none for a burst
// that reaches every instance within one sync interval, which therefore stays
// within B + ⌊(d+I)/T⌋. Floor and ceiling rounding never add: a lease is
// reserved before it is handed out.
//
// Undershoot: an instance with no traffic for a key hands its lease back at
// its next sync and parks at most ⌈spare/N²⌉ (at least one token, so that a
// burst after a quiet spell is not denied until the next sync): idle
// instances together hold at most about 1/N of what is left. Traffic
// concentrated on one instance gets ⌈spare/N⌉ per sync, so it reaches what
// is left of the budget over a few syncs, not at once.
//
// Quiet keys: a record idle for one sync parks a small lease; idle at the
// next one too, it hands everything back, takes nothing and goes dormant: no
// sync looks at it until it has traffic. Its next request, if the fleet had
// tokens at its last sync, syncs it alone on the request path (wake: one
// script call, bounded by the timeout, concurrent requests waiting for it);
// if the key was blocked, it is denied locally until the fleet's next token.
// So a key seen once costs Redis three scripts, not one per interval until
// it refills, and a dormant key's request is never denied for want of a
// lease. A dormant record holds no lease, so the bound is unchanged; it
// stays (evicted first when the zone is full), since a dropped record would
// take a fresh share again.
//
// # Failure
//
// A sync that cannot list every record within its time bound (a flood of
// keys) is not a failure: see send. A sync that fails leaves the records
// alone: the instance keeps deciding
// from its stale view, at most its current allowance. When the last sync
// failed and the last successful one is older than 2·sync_interval plus the
// sync's timeout, Decide returns an error (ErrUnavailable when the breaker
// is open, else ErrStale) and the zone applies its fail policy. Errors that
// mean Redis cannot serve (no answer, OOM, NOPERM...) fail the sync and
// count in the store's breaker, so an outage is logged once and Health
// reports it. A sync merely delayed (a starved machine) keeps the view: its
// allowances are leases Redis counts, and the fail policy would admit more.
//
// An error about one key (a value tally did not write, which the script
// deletes) fails that key's report only: it is logged (sampled), the key's
// next decision goes to the fail policy (so the metric counts it), and the
// report is sent again, on a fresh key, by the next sync.
//
// A sync that times out after Redis ran its scripts loses their replies.
// Each report carries a sequence number, and Redis keeps, per instance, the
// last one it applied with its lease: the next sync sends the same report
// again and gets the same lease back, so a lost reply is never counted twice.
//
// # Keys
//
// A key is a hash {t: TAT µs, c: episode start µs, m:<instance>: 1...}
// whose TTL is its resetAfter, set in the same script as every write: every
// key written expires on its own. Its name is <key_prefix><zone>.async:<key>,
// never the name of a strict-mode key (a string), so a reload from one mode
// to the other with the same key_prefix finds no value of the wrong type.
//
// Times kept in-process (records, lastSync, nextSync) are monotonic
// (internal/monotime); Redis TIME times everything in Redis.

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"hash/maphash"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

//go:embed async.lua
var asyncScript string

// ErrStale: an async store has not synced with Redis for too long to keep
// deciding from its local view.
var ErrStale = errors.New("distributed: async view is stale (no successful sync with redis)")

// Async tuning.
const (
	// syncChunk is the most script calls sent in one pipeline, and
	// firstSyncChunk the most in a sync's first one: small, so that Redis
	// answers it within the timeout even when busy, which tells a busy
	// Redis (the rest waits for the next sync) from one that is down.
	syncChunk      = 250
	firstSyncChunk = 50
	// asyncMaxKeys caps the records an async store keeps for a zone that
	// did not say (SetMaxKeys).
	asyncMaxKeys = 1_000_000
	// asyncZoneSep joins zone and key in async keys (see RedisKey).
	asyncZoneSep = ".async:"
)

// Async is the async-mode implementation of zones.Store: decisions are made
// in-process and reconciled with Redis every SyncInterval (see the package
// comment of this file for the scheme and its bound). It reuses Store's
// client, key prefix, breaker, heartbeat, Peek and Reset.
type Async struct {
	*Store
	interval time.Duration
	hold     int64 // µs: the script's hold (see OpenAsync)
	stale    int64 // ns: beyond this since the last sync, Decide errors
	script   *redis.Script
	maxKeys  int

	zonesMu sync.Mutex
	zones   atomic.Pointer[map[string]*asyncZone] // copy on write
	caps    map[string]int                        // max_keys by zone; guarded by zonesMu

	seq        atomic.Uint64 // the last report's sequence number
	lastSync   atomic.Int64  // monotime when the last successful sync started
	nextSync   atomic.Int64  // monotime when the next sync is due
	syncFailed atomic.Bool   // the last sync attempt failed

	syncMu   sync.Mutex // one sync at a time (the loop, Close's last one)
	stop     chan struct{}
	loopDone chan struct{}
	closed   sync.Once
}

// OpenAsync opens a Store for opts and starts the sync loop. Like Open, it
// does not contact Redis.
func OpenAsync(opts Options, logger *zap.Logger) (*Async, error) {
	return openAsync(opts, asyncMaxKeys, logger)
}

func openAsync(opts Options, maxKeys int, logger *zap.Logger) (*Async, error) {
	a := &Async{}
	s, err := open(opts, logger, func(s *Store) {
		s.zoneSep = asyncZoneSep
		s.resets.record = a.dropRecord
		s.resets.deciding = func() bool { return !a.syncFailed.Load() }
	})
	if err != nil {
		return nil, err
	}
	interval := s.opts.SyncInterval
	// Field by field: the store's goroutines may already read zones and
	// syncFailed through the hooks above.
	a.Store = s
	a.interval = interval
	// An instance that admitted a fresh share reports it by its next sync,
	// or the one after if that one fails: within two intervals and two
	// sync bounds of the episode's start, and at least a second, for syncs
	// delayed on a loaded machine. Until then leases keep its share aside.
	// A report later than the hold lands after leases were handed out: up
	// to (N−1) extra shares (the bound's last term). The price of a long
	// hold: a key only one instance sees gets about 1/N of its burst for
	// the hold's length.
	a.hold = max(time.Second, 2*interval+2*backgroundTimeout(s.opts)).Microseconds()
	a.stale = int64(2*interval + backgroundTimeout(s.opts))
	a.script = redis.NewScript(asyncScript)
	a.maxKeys = maxKeys
	a.stop = make(chan struct{})
	a.loopDone = make(chan struct{})
	a.caps = make(map[string]int)
	empty := map[string]*asyncZone{}
	a.zones.Store(&empty)
	now := monotime.Now()
	a.lastSync.Store(now) // a stale view may be used for 2 intervals from the start
	a.nextSync.Store(now + int64(interval))
	go a.loop()
	return a, nil
}

// Mode reports "async" (zones.Zone.Mode, for the admin API).
func (a *Async) Mode() string { return "async" }

// SyncInterval is how often the store reconciles with Redis.
func (a *Async) SyncInterval() time.Duration { return a.interval }

// LastSync is when the last successful sync started (its snapshot time).
func (a *Async) LastSync() time.Time { return monotime.Time(a.lastSync.Load()) }

// Close stops the sync loop, reports what this instance admitted and hands
// back its leases in a last sync (bounded by the sync timeout), then closes
// the Store.
func (a *Async) Close() error {
	var err error
	a.closed.Do(func() {
		close(a.stop)
		<-a.loopDone
		ctx, cancel := context.WithTimeout(context.Background(), backgroundTimeout(a.opts))
		_ = a.sync(ctx, false)
		cancel()
		err = a.Store.Close()
	})
	return err
}

// Destruct closes the store (caddy.Destructor, for caddy.UsagePool).
func (a *Async) Destruct() error { return a.Close() }

// Decide decides one request for key in zone from this instance's allowance,
// without calling Redis. limit is in nanoseconds, like the result.
// Remaining is this instance's allowance, not the fleet's.
func (a *Async) Decide(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	return a.step(ctx, zone, key, limit, func(r *record, now, nextSync int64) algorithms.Result {
		return r.decide(now, nextSync, limit, cost)
	})
}

// Check reports, without consuming, whether this instance's allowance for
// key has a unit left (a post-charged zone's check before the request).
func (a *Async) Check(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	return a.step(ctx, zone, key, limit, func(r *record, now, nextSync int64) algorithms.Result {
		return r.check(now, nextSync, limit)
	})
}

// Charge takes cost from this instance's allowance after the response; what
// the allowance does not cover is reported at the next sync and counted in
// Redis past the burst (the key goes into debt).
func (a *Async) Charge(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	return a.step(ctx, zone, key, limit, func(r *record, now, nextSync int64) algorithms.Result {
		r.charge(cost)
		return r.check(now, nextSync, limit)
	})
}

// step runs f on key's record (created with a fresh share), under its
// shard's lock, when the local view is fresh enough to decide from. A
// dormant record is woken first when the fleet had tokens at its last sync.
func (a *Async) step(ctx context.Context, zone, key string, limit algorithms.Limit, f func(r *record, now, nextSync int64) algorithms.Result) (algorithms.Result, error) {
	now := monotime.Now()
	if now-a.lastSync.Load() > a.stale && a.syncFailed.Load() {
		if ok, _ := a.breaker.health(); !ok {
			return algorithms.Result{}, ErrUnavailable
		}
		return algorithms.Result{}, ErrStale
	}
	if a.Store.isClosed() {
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
	if r.dormant && r.retryAt <= now {
		var err error
		if r, err = a.wake(ctx, z, s, key, r, limit); err != nil {
			s.mu.Unlock()
			return algorithms.Result{}, err
		}
		now = monotime.Now()
	}
	res := f(r, now, a.nextSync.Load())
	s.mu.Unlock()
	return res, nil
}

// wake syncs a dormant record alone, on the request path, so that a key
// quiet for a while gets a lease instead of a denial (a dormant record holds
// none, and no sync looks at it): one script call, bounded by the timeout
// and through the breaker, as in strict mode. Concurrent requests for the
// key wait for the first one's call. A dormant record whose key was blocked
// at its last sync is not woken before the fleet's next token: it denies
// locally, at no cost. Called and returns with s locked; the record
// returned is key's (another one if a reset replaced it).
func (a *Async) wake(ctx context.Context, z *asyncZone, s *asyncShard, key string, r *record, limit algorithms.Limit) (*record, error) {
	ctx, cancel := a.bound(ctx)
	defer cancel()
	for range 3 { // a final report in flight is sent again first
		if r == nil {
			r = &record{allow: freshShare(limit.Burst, a.Instances())}
			z.insert(s, key, r)
		}
		if !r.dormant || r.retryAt > monotime.Now() {
			return r, nil
		}
		if w := r.waking; w != nil {
			s.mu.Unlock()
			select {
			case <-w:
			case <-ctx.Done():
			}
			s.mu.Lock()
			if err := ctx.Err(); err != nil {
				return nil, ErrTimeout
			}
			r = s.m[key]
			continue
		}
		if !r.hasUnacked {
			r.limit = limit
			r.unacked = sent{limit: limit, allow: r.allow, pending: r.pending, reserved: r.reserved, seq: a.seq.Add(1)}
			r.hasUnacked = true
		}
		st := r.unacked
		w := make(chan struct{})
		r.waking = w
		s.mu.Unlock()
		rep, err := a.syncOne(ctx, z.name, key, st)
		s.mu.Lock()
		r.waking = nil
		close(w)
		if err != nil {
			return nil, err
		}
		if s.m[key] == r && r.hasUnacked && r.unacked.seq == st.seq {
			r.apply(st, rep, monotime.Now(), st.limit.Burst, freshShare(st.limit.Burst, a.Instances()))
		}
		r = s.m[key]
	}
	if r == nil {
		r = &record{allow: freshShare(limit.Burst, a.Instances())}
		z.insert(s, key, r)
	}
	return r, nil
}

// syncOne sends one report alone (a wake), bounded by ctx and through the
// breaker.
func (a *Async) syncOne(ctx context.Context, zone, key string, st sent) (syncReply, error) {
	ok, probe := a.breaker.allow()
	if !ok {
		return syncReply{}, ErrUnavailable
	}
	n := int64(a.Instances())
	res := parseReply(a.script.Run(ctx, a.client, []string{a.RedisKey(zone, key)}, a.syncArgs(st, n, true)...))
	err := res.err
	if errors.Is(err, context.DeadlineExceeded) {
		err = ErrTimeout
	}
	a.breaker.record(probe, err)
	if err != nil {
		a.problems.note(zone, err)
		return syncReply{}, err
	}
	v := res.vals
	return syncReply{lease: v[0], avail: v[1], retry: v[2] * 1000, reset: v[3] * 1000}, nil
}

// Refund gives cost back to this instance's allowance.
func (a *Async) Refund(_ context.Context, zone, key string, _ algorithms.Limit, cost int64) error {
	if a.Store.isClosed() {
		return ErrClosed
	}
	z := a.zone(zone)
	s := z.shard(key)
	s.mu.Lock()
	if r := s.m[key]; r != nil {
		r.refund(cost)
	}
	s.mu.Unlock()
	return nil
}

// Reset forgets key in zone here, deletes it in Redis and tells the other
// instances, which drop their records of it (see resets.go).
func (a *Async) Reset(ctx context.Context, zone, key string) error {
	a.dropRecord(zone, key)
	return a.Store.Reset(ctx, zone, key)
}

// dropRecord forgets this instance's record of key in zone: the key was
// reset (here or elsewhere), and its next request starts a fresh share.
func (a *Async) dropRecord(zone, key string) {
	zones := a.zones.Load()
	if zones == nil {
		return // a reset heard before openAsync finished: no records yet
	}
	z := (*zones)[zone]
	if z == nil {
		return
	}
	s := z.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// peekScript reads a key's TAT and Redis's clock, in µs.
var peekScript = redis.NewScript(`
local t = redis.call('TIME')
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), tonumber(redis.call('HGET', KEYS[1], 't')) or 0}
`)

// Peek reports the fleet's view of key in zone as Redis holds it: leases
// count as spent, what instances admitted since their last sync does not.
func (a *Async) Peek(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	if a.Store.isClosed() {
		return algorithms.Result{}, ErrClosed
	}
	ok, probe := a.breaker.allow()
	if !ok {
		return algorithms.Result{}, ErrUnavailable
	}
	ctx, cancel := a.bound(ctx)
	defer cancel()
	v, err := peekScript.Run(ctx, a.client, []string{a.RedisKey(zone, key)}).Int64Slice()
	a.breaker.record(probe, err)
	if err != nil {
		return algorithms.Result{}, err
	}
	if len(v) != 2 {
		return algorithms.Result{}, errBadReply
	}
	r := micro(limit).Peek(v[1], v[0])
	return resultNanos([4]int64{b2i(r.Allowed), r.Remaining, r.RetryAfter, r.ResetAfter}), nil
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// freshShare is what an instance may admit for a key it has never synced:
// its share of a full burst among n instances, at least 1.
func freshShare(burst int64, n int) int64 {
	return max(1, burst/int64(max(1, n)))
}

// record is one instance's view of one key. Guarded by its shard's lock.
type record struct {
	limit algorithms.Limit // ns, as the last decision gave it
	// allow is what this instance may still admit before its next sync.
	allow int64
	// pending is cost admitted and not yet counted in Redis.
	pending int64
	// reserved: allow is a lease Redis counts as spent (the key has
	// synced); otherwise it is a fresh share Redis knows nothing about and
	// every admission adds to pending.
	reserved bool
	// used: decided or refunded since the last snapshot.
	used bool
	// retryAt and resetAt (Unix ns, local clock) are when, as of the last
	// sync, the fleet has one token back and the key is full again.
	retryAt, resetAt int64
	// unacked is the last report taken for a sync whose reply has not been
	// adopted; while set, every sync sends it again, unchanged, with its
	// sequence number, and Redis applies it at most once.
	unacked    sent
	hasUnacked bool
	// syncErr is an error Redis gave about this key alone in the last
	// sync; the key's next decision returns it, so the zone applies its
	// fail policy (and counts it) once per failed sync.
	syncErr error
	// idleSyncs counts the consecutive syncs that found the record idle;
	// at dormantAfter the next one hands its whole lease back and takes
	// none, and the record is dormant: no sync until a request needs it
	// (see wake).
	idleSyncs int
	dormant   bool
	waking    chan struct{} // closed when a wake in flight ends
}

// dormantAfter is the number of idle syncs (each parking a small lease) a
// record has before its next sync hands everything back and it goes
// dormant. A key seen once costs Redis dormantAfter+2 scripts, not one per
// interval until it refills.
const dormantAfter = 1

// decide admits cost from the allowance, or denies until the next sync or
// the fleet's next token, whichever is later.
func (r *record) decide(now, nextSync int64, l algorithms.Limit, cost int64) algorithms.Result {
	r.limit, r.used = l, true
	if r.allow < cost {
		return r.result(now, nextSync, l, false)
	}
	r.allow -= cost
	if !r.reserved {
		r.pending += cost
	}
	return r.result(now, nextSync, l, true)
}

// check reports whether the allowance has a unit left, consuming nothing.
func (r *record) check(now, nextSync int64, l algorithms.Limit) algorithms.Result {
	r.limit, r.used = l, true
	return r.result(now, nextSync, l, r.allow >= 1)
}

// result describes the record as it stands: what is left when allowed;
// when denied, a wait until the next sync or the fleet's next token,
// whichever is later.
func (r *record) result(now, nextSync int64, l algorithms.Limit, allowed bool) algorithms.Result {
	if allowed {
		return algorithms.Result{
			Allowed:    true,
			Remaining:  r.allow,
			ResetAfter: max(r.resetAt-now, 0) + r.pending*l.EmissionInterval,
		}
	}
	retry := max(r.retryAt-now, nextSync-now, 1)
	return algorithms.Result{
		RetryAfter: retry,
		ResetAfter: max(r.resetAt-now+r.pending*l.EmissionInterval, retry),
	}
}

// charge takes cost from the allowance after the fact, whatever is left:
// on a fresh share all of it is pending (Redis knows nothing yet); on a
// lease, what the lease does not cover is, and the next sync counts it in
// Redis past the burst.
func (r *record) charge(cost int64) {
	r.used = true
	spent := min(cost, r.allow)
	r.allow -= spent
	if r.reserved {
		r.pending += cost - spent
	} else {
		r.pending += cost
	}
}

// refund gives cost back to the allowance.
func (r *record) refund(cost int64) {
	r.used = true
	r.allow += cost
	if !r.reserved {
		r.pending = max(0, r.pending-cost)
	}
}

// sent is what a sync reported for a record, taken under its shard's lock.
type sent struct {
	limit          algorithms.Limit
	allow, pending int64
	reserved, idle bool
	final          bool   // hand the whole lease back, take none: the record goes dormant
	seq            uint64 // unique per report, store-wide
}

// snapshot takes what the next sync reports for r, and whether r needs a
// sync at all: a key that has nothing to report, no lease to hand back and
// no token coming before the next sync is skipped (a blocked key costs
// Redis nothing until it refills).
//
// A report whose reply was lost (a sync that failed or timed out, perhaps
// after Redis applied it) is sent again unchanged: Redis recognises its
// sequence number and replays the reply instead of counting it twice.
// Decisions made meanwhile are reported by the sync after it is adopted.
func (r *record) snapshot(now, interval int64, seq *atomic.Uint64) (sent, bool) {
	if r.hasUnacked {
		return r.unacked, true
	}
	s := sent{limit: r.limit, allow: r.allow, pending: r.pending, reserved: r.reserved, idle: !r.used && r.pending == 0}
	if r.reserved && s.idle && (r.dormant || r.allow == 0 && r.retryAt > now+interval) {
		return s, false
	}
	s.final = s.idle && s.reserved && r.idleSyncs >= dormantAfter
	r.used = false
	s.seq = seq.Add(1)
	r.unacked, r.hasUnacked = s, true
	return s, true
}

// delta is the cost the sync reports: admitted and not counted, minus the
// unused lease it hands back. The unused part of a fresh share is reserved
// instead (it is added), so that what the instance admits from it while the
// sync is in flight is counted before any other instance's lease.
func (s sent) delta() int64 {
	if s.reserved {
		return s.pending - s.allow
	}
	return s.pending + s.allow
}

// syncReply is the script's answer for one key, times in ns.
type syncReply struct {
	lease, avail, retry, reset int64
}

// apply adopts a sync's reply. Decisions made while the sync was in flight
// stay counted: on a lease they came out of the lease the sync handed back,
// so they come out of the new one (or stay pending); on a fresh share they
// came out of the part the sync reserved, which the record keeps. It reports
// whether the record carries no information any more and should be dropped:
// the key is full in Redis and the instance had no traffic for it, before or
// during the sync.
//
// When Redis forgot the key (it was full and this instance idle, so no lease
// came back) but requests arrived while the sync was in flight, the record
// carries on as a fresh one, which counts them: keeping it reserved with no
// lease denied the key's next requests until the following sync although
// the fleet had its whole burst (0.5-4% spurious 429s at 2% of the limit).
func (r *record) apply(s sent, rep syncReply, now, burst, fresh int64) (drop bool) {
	var allow, pending int64
	if s.reserved {
		allow = rep.lease + r.allow - s.allow
		pending = r.pending - s.pending
	} else {
		allow = rep.lease + r.allow
		pending = r.pending - s.pending - (s.allow - r.allow)
	}
	if allow < 0 {
		pending -= allow
		allow = 0
	}
	r.allow, r.pending, r.reserved = allow, max(0, pending), true
	r.retryAt, r.resetAt = now+rep.retry, now+rep.reset
	r.hasUnacked = false
	if s.idle {
		r.idleSyncs++
	} else {
		r.idleSyncs = 0
	}
	r.dormant = s.final && !r.used && r.pending == 0 && r.allow == 0
	forgotten := s.reserved && s.idle && rep.lease == 0 && rep.avail >= burst
	if forgotten && r.used {
		r.reserved = false
		r.allow = max(0, fresh-r.pending)
		return false
	}
	return forgotten && r.pending == 0
}

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
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

func newAsyncZone(name string, maxKeys int) *asyncZone {
	n := 1
	for n < 64 && n*2*256 <= maxKeys {
		n *= 2
	}
	z := &asyncZone{name: name, seed: maphash.MakeSeed(), shards: make([]asyncShard, n), mask: uint64(n - 1)}
	z.shardCap.Store(int64(max(1, maxKeys/n)))
	for i := range z.shards {
		z.shards[i].m = make(map[string]*record)
	}
	return z
}

func (z *asyncZone) shard(key string) *asyncShard {
	return &z.shards[maphash.String(z.seed, key)&z.mask]
}

// insert adds r for key to a locked shard, making room first when the shard
// is full: from a sample, a record with nothing pending goes first (losing
// it loses at most an unused lease: undershoot), else the one with least
// pending. The key is cloned so the map never pins a request's buffer.
func (z *asyncZone) insert(s *asyncShard, key string, r *record) {
	if int64(len(s.m)) >= z.shardCap.Load() {
		victim, least, seen := "", int64(-1), 0
		for k, v := range s.m {
			if least < 0 || v.pending < least {
				victim, least = k, v.pending
			}
			if seen++; least == 0 || seen == evictionSample {
				break
			}
		}
		delete(s.m, victim)
	}
	s.m[strings.Clone(key)] = r
}

// evictionSample is how many records a full shard looks at to make room.
const evictionSample = 16

// zone returns the records of zone, creating them on first use. The lookup
// of an existing zone takes no lock and allocates nothing.
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
	m := make(map[string]*asyncZone, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	maxKeys := a.maxKeys
	if n := a.caps[name]; n > 0 {
		maxKeys = n
	}
	z := newAsyncZone(strings.Clone(name), maxKeys)
	m[z.name] = z
	a.zones.Store(&m)
	return z
}

// SetMaxKeys caps the records the store keeps for zone (its max_keys): a
// full shard evicts to make room, as zones.Table does. A zone created
// before keeps its shards and takes the new cap for its next insertions.
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
	n := 0
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// Len is the number of records the store holds, in every zone.
func (a *Async) Len() int {
	n := 0
	for _, z := range *a.zones.Load() {
		for i := range z.shards {
			s := &z.shards[i]
			s.mu.Lock()
			n += len(s.m)
			s.mu.Unlock()
		}
	}
	return n
}

// loop syncs every interval until Close. The first sync comes after a
// random part of an interval, so a fleet started together does not sync in
// step.
func (a *Async) loop() {
	defer close(a.loopDone)
	first := time.NewTimer(time.Duration(rand.Int64N(int64(a.interval)) + 1))
	select {
	case <-first.C:
	case <-a.stop:
		first.Stop()
		return
	}
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		a.nextSync.Store(monotime.Now() + int64(a.interval))
		_ = a.sync(a.ctx, true)
		select {
		case <-t.C:
		case <-a.stop:
			return
		}
	}
}

// item is one record in a sync.
type item struct {
	z    *asyncZone
	s    *asyncShard
	key  string
	r    *record
	sent sent
	keys []string
	args []any
	cmd  *redis.Cmd
}

// sync reports every record to Redis and adopts the replies; take is false
// for the last sync at Close, which hands leases back and takes none. With
// nothing to report, a PING keeps LastSync meaningful: Redis answered.
// Each pipeline Redis must answer within the background timeout (see send).
func (a *Async) sync(ctx context.Context, take bool) error {
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	start := monotime.Now()
	items := a.snapshot(start)
	slices.SortStableFunc(items, func(x, y item) int { return cmp.Compare(b2i(x.sent.idle), b2i(y.sent.idle)) })
	ok, probe := a.breaker.allow()
	if !ok {
		a.restore(items)
		a.syncFailed.Store(true)
		return ErrUnavailable
	}
	var err error
	if len(items) == 0 {
		ctx, cancel := context.WithTimeout(ctx, backgroundTimeout(a.opts))
		err = a.client.Ping(ctx).Err()
		cancel()
	} else {
		err = a.send(ctx, items, take)
	}
	a.breaker.record(probe, err)
	a.syncFailed.Store(err != nil)
	if err != nil {
		return err
	}
	a.lastSync.Store(start)
	return nil
}

// snapshot lists the records that need a sync, with what to report.
func (a *Async) snapshot(now int64) []item {
	var items []item
	for _, z := range *a.zones.Load() {
		for i := range z.shards {
			s := &z.shards[i]
			s.mu.Lock()
			for k, r := range s.m {
				if st, need := r.snapshot(now, int64(a.interval), &a.seq); need {
					items = append(items, item{z: z, s: s, key: k, r: r, sent: st})
				}
			}
			s.mu.Unlock()
		}
	}
	return items
}

// restore marks records of a sync that did not happen as used again, so the
// next sync does not take them for idle.
func (a *Async) restore(items []item) {
	for _, it := range items {
		it.s.mu.Lock()
		if !it.sent.idle {
			it.r.used = true
		}
		it.s.mu.Unlock()
	}
}

// send runs the script for every item, syncChunk per pipeline, and adopts
// each reply. It returns the first error that says Redis cannot serve (for
// the breaker); items whose call failed keep their state for the next sync,
// and an error about one key alone goes to that key's next decision.
//
// Redis must answer each pipeline within the background timeout; a sync
// starts no new pipeline once it has taken that long in all, nor after one
// failed, so the items not done wait for the next sync (their reports are
// sent again, unchanged), items with traffic first (sync sorts them). A
// pipeline that times out after Redis answered the sync's first (small)
// one, or part of itself, means Redis is busy, not down: the sync stops
// there without an error.
// A flood of keys thus slows syncs down and is never taken for an outage.
func (a *Async) send(ctx context.Context, items []item, take bool) error {
	n := int64(a.Instances())
	timeout := backgroundTimeout(a.opts)
	budget := time.Now().Add(timeout)
	for lo, size := 0, firstSyncChunk; lo < len(items); lo, size = lo+size, syncChunk {
		if lo > 0 && time.Now().After(budget) {
			a.restore(items[lo:])
			break
		}
		chunk := items[lo:min(lo+size, len(items))]
		answered, err := a.sendChunk(ctx, timeout, chunk, n, take)
		if err != nil {
			a.restore(items[lo+len(chunk):])
			if (lo > 0 || answered > 0) && (errors.Is(err, context.DeadlineExceeded) || isTimeout(err)) {
				// Redis answered this sync's first pipeline, or part of
				// this one, before the timeout: it is busy, not down.
				return nil
			}
			return err
		}
	}
	return nil
}

// isTimeout reports whether err is a network timeout (a pipeline Redis did
// not answer in time).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sendChunk runs one pipeline of items, bounded by timeout, and adopts the
// replies; it returns how many Redis answered and the first error that says
// Redis cannot serve.
func (a *Async) sendChunk(ctx context.Context, timeout time.Duration, chunk []item, n int64, take bool) (answered int, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var firstErr error
	pipe := a.client.Pipeline()
	for i := range chunk {
		it := &chunk[i]
		it.keys = []string{a.RedisKey(it.z.name, it.key)}
		it.args = a.syncArgs(it.sent, n, take)
		it.cmd = pipe.EvalSha(ctx, a.script.Hash(), it.keys, it.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var retry redis.Pipeliner
	for i := range chunk {
		it := &chunk[i]
		if redis.HasErrorPrefix(it.cmd.Err(), "NOSCRIPT") {
			if retry == nil {
				retry = a.client.Pipeline()
			}
			it.cmd = retry.Eval(ctx, asyncScript, it.keys, it.args...)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	now := monotime.Now()
	for i := range chunk {
		it := &chunk[i]
		rep := parseReply(it.cmd)
		if rep.err != nil {
			if unreachable(rep.err) {
				if firstErr == nil {
					firstErr = rep.err
				}
			} else {
				a.problems.note(it.z.name, rep.err)
				it.s.mu.Lock()
				it.r.syncErr = rep.err
				it.s.mu.Unlock()
			}
			a.restore(chunk[i : i+1])
			continue
		}
		answered++
		a.adopt(it, rep.vals, now)
	}
	return answered, firstErr
}

// syncArgs is async.lua's ARGV for one report (take is false at Close; a
// final report takes nothing either).
func (a *Async) syncArgs(st sent, n int64, take bool) []any {
	l := micro(st.limit)
	return []any{l.EmissionInterval, l.Burst, n, st.delta(), b2i(st.idle),
		a.hold, freshShare(l.Burst, int(n)), b2i(take && !st.final), a.instanceID, st.seq}
}

// adopt applies one reply to its record, if the record is still the one
// that was sent (Reset or eviction may have replaced it).
func (a *Async) adopt(it *item, v [4]int64, now int64) {
	rep := syncReply{lease: v[0], avail: v[1], retry: v[2] * 1000, reset: v[3] * 1000}
	it.s.mu.Lock()
	fresh := freshShare(it.sent.limit.Burst, a.Instances())
	// A wake (or this sync) may have adopted the same report already.
	r := it.r
	if it.s.m[it.key] == r && r.hasUnacked && r.unacked.seq == it.sent.seq && r.apply(it.sent, rep, now, it.sent.limit.Burst, fresh) {
		delete(it.s.m, it.key)
	}
	it.s.mu.Unlock()
}
