// Package distributed is tally's Redis store: the shared GCRA state that
// every Caddy instance of a fleet decides against.
//
// Every decision is a step of one Lua script (gcra.lua, the twin of
// algorithms.Limit), atomic in Redis and timed by Redis TIME, so decisions
// are exact across any number of instances; one call decides a whole batch
// (grouped by hash slot on Redis Cluster, which needs no hash tags). The
// key's value is its TAT in microseconds, written with a TTL equal to its
// resetAfter: every key the store writes expires on its own.
//
// Three things keep it fast and safe:
//   - batching: concurrent decisions share one script call (batch.go), with
//     no added wait when idle;
//   - a deadline: every call returns within Options.Timeout, queueing
//     included, with ErrTimeout if Redis has not answered;
//   - a breaker (breaker.go): after 5 consecutive failures calls fail at
//     once with ErrUnavailable for a second, then one probe tests Redis.
//     On a Cluster each master has its own, so a dead master costs only
//     the keys it serves, until the slot map names its promoted replica.
//
// The zone applies its fail policy to any error.
package distributed

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Errors returned by the store, besides Redis's own.
var (
	// ErrUnavailable: the breaker is open; Redis was not asked.
	ErrUnavailable = errors.New("distributed: redis unavailable (breaker open)")
	// ErrTimeout: Redis did not answer within Options.Timeout.
	ErrTimeout = fmt.Errorf("distributed: redis did not answer in time: %w", context.DeadlineExceeded)
	// ErrClosed: the store was closed.
	ErrClosed   = errors.New("distributed: store closed")
	errBadReply = errors.New("distributed: unexpected reply from the GCRA script")
)

// foreign reports whether err is a script's report that it found, and
// deleted, a value tally did not write at one of its keys.
func foreign(err error) bool { return redis.HasErrorPrefix(err, "TALLYFOREIGN") }

//go:embed gcra.lua
var gcraScript string

// Op selects what the GCRA script does to a key (see EvalAt).
type Op string

// The script's operations, mirroring algorithms.Limit's methods.
const (
	OpDecide Op = "d"
	OpRefund Op = "r"
	OpPeek   Op = "p"
	OpCharge Op = "c"
)

// Store is the Redis implementation of zones.Store. It is safe for
// concurrent use; one Store per Redis setting is shared by every handler
// (see Options.Key) and closed when the last one goes.
type Store struct {
	opts    Options
	client  redis.UniversalClient
	script  *redis.Script
	cluster bool // a batch's GCRA steps go in one call per hash slot
	logger  *zap.Logger
	breaker breaker      // the whole setting; on a Cluster, calls not about one key
	nodes   nodeBreakers // on a Cluster, one breaker per master (breaker.go)

	queue chan *request
	idle  chan struct{} // slots for calls that skip the idle queue

	instanceID string // this store's: async reports, concurrency slots
	member     string // this process's, in the instances set
	instances  atomic.Int64
	beats      beats
	// zoneSep joins zone and key in a Redis key: ":" in strict mode,
	// asyncZoneSep in async mode, so the modes' keys (a string, a hash)
	// never meet at one name.
	zoneSep string

	problems problems
	resets   resets
	pubsub   *redis.PubSub

	slots slots // concurrency slots this instance holds (concurrency.go)

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	done   chan struct{}
	closed sync.Once
	wg     sync.WaitGroup
}

// Open creates the store and starts its workers and heartbeat. It does not
// contact Redis: Caddy must start during a Redis outage, and the zones'
// fail policy covers it. Errors (bad addresses) never contain a password.
func Open(opts Options, logger *zap.Logger) (*Store, error) {
	return open(opts, logger, nil)
}

// open is Open with a hook that sets up the store for its mode before any
// of its goroutines starts.
func open(opts Options, logger *zap.Logger, setup func(*Store)) (*Store, error) {
	opts = opts.withDefaults()
	uopts, err := opts.universalOptions()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{
		opts:       opts,
		client:     redis.NewUniversalClient(uopts),
		script:     redis.NewScript(gcraScript),
		logger:     logger,
		queue:      make(chan *request, queueDepth),
		idle:       make(chan struct{}, idleCallers),
		instanceID: hex.EncodeToString(id[:]),
		member:     cmp.Or(opts.Instance, processMember),
		ctx:        ctx,
		cancel:     cancel,
		done:       make(chan struct{}),
	}
	_, s.cluster = s.client.(*redis.ClusterClient)
	s.breaker.logger = logger
	s.breaker.redis = opts.Redacted()
	s.breaker.hint = opts.hint
	if opts.SentinelMaster != "" {
		dials := &masterDials{}
		s.client.AddHook(dials)
		s.breaker.master = dials.last
	}
	s.nodes.init(s.client, &s.breaker)
	s.problems.logger = logger
	s.zoneSep = ":"
	s.instances.Store(1)
	s.slots.init()
	if setup != nil {
		setup(s)
	}
	s.register()
	s.wg.Add(workers + 3)
	for range workers {
		go s.worker()
	}
	go s.heartbeatLoop()
	go s.slotLoop()
	s.pubsub = s.client.Subscribe(ctx) // no channel yet: no connection
	go s.subscribeLoop(s.pubsub)
	return s, nil
}

// Close stops the workers and the heartbeat, removes this instance from the
// instances set (best effort, bounded by the timeout) and closes the client.
// Calls made after Close return ErrClosed.
func (s *Store) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.done)
		s.cancel()
		_ = s.pubsub.Close()
		s.wg.Wait()
		last := s.unregister()
		if ok, _ := s.breakerFor(s.instancesKey()).health(); ok && last {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
			s.client.ZRem(ctx, s.instancesKey(), s.member)
			cancel()
		}
		err = s.client.Close()
	})
	return err
}

// Destruct closes the store; it makes a Store a caddy.Destructor for
// sharing through a caddy.UsagePool.
func (s *Store) Destruct() error { return s.Close() }

// Mode reports "strict" (zones.ModeStore, for the admin API).
func (s *Store) Mode() string { return "strict" }

// Health reports whether Redis is considered reachable and, when it is not,
// since when (the earliest open breaker opened then). On a Cluster it is
// false while any master serving slots is unreachable; Outages says which.
func (s *Store) Health() (ok bool, openSince time.Time) {
	ok = true
	for _, o := range s.Outages() {
		if ok || o.Since.Before(openSince) {
			ok, openSince = false, o.Since
		}
	}
	return ok, openSince
}

// Outages lists what the store cannot reach now: on a Cluster, each master
// still serving slots whose breaker is open (a master replaced by its
// replica is dropped, logged once); otherwise the whole setting, as one
// outage naming, on Sentinel, the master it was connected to.
func (s *Store) Outages() []NodeOutage {
	down := s.nodes.retire(s.ctx)
	if ok, since := s.breaker.health(); !ok {
		down = append(down, NodeOutage{Node: s.breaker.outageNode(), Since: since})
	}
	return down
}

// breakerFor is the breaker guarding calls about key: on a Cluster, that of
// the master serving key's slot; otherwise the store's.
func (s *Store) breakerFor(key string) *breaker { return s.nodes.breakerFor(s.ctx, key, &s.breaker) }

// RedisKey is the Redis key holding the state of key in zone:
// <key_prefix><zone>:<key> in strict mode, <key_prefix><zone>.async:<key> in
// async mode. Zone names cannot contain '.' or ':', so no key of one mode
// is a key of the other, and no key is the instances set.
func (s *Store) RedisKey(zone, key string) string {
	return s.opts.KeyPrefix + zone + s.zoneSep + key
}

// slotsKey is the Redis key of key's concurrency slots in zone:
// <key_prefix><zone>:<key> in either mode (a concurrency zone has no GCRA
// state, so its name never meets one).
func (s *Store) slotsKey(zone, key string) string {
	return s.opts.KeyPrefix + zone + ":" + key
}

// LastProblem is the last per-key error Redis reported (a value tally did
// not write, found at one of its keys and deleted) and when, or "" if none
// since the store opened. Outages are reported by Health instead.
func (s *Store) LastProblem() (string, time.Time) { return s.problems.last() }

// Decide runs one GCRA step for key in zone in Redis. limit is in
// nanoseconds, like the result; Redis works in microseconds, so T is
// rounded down to a whole microsecond (at least 1).
func (s *Store) Decide(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	if s.isClosed() {
		return algorithms.Result{}, ErrClosed
	}
	v, err := s.call(ctx, s.RedisKey(zone, key), scriptArgs(OpDecide, micro(limit), cost, ""))
	if err != nil {
		s.problems.note(zone, err)
		return algorithms.Result{}, err
	}
	return resultNanos(v), nil
}

// Refund gives back cost for key in zone (see algorithms.Limit.Refund).
func (s *Store) Refund(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) error {
	if s.isClosed() {
		return ErrClosed
	}
	_, err := s.call(ctx, s.RedisKey(zone, key), scriptArgs(OpRefund, micro(limit), cost, ""))
	s.problems.note(zone, err)
	return err
}

// Check reports the state of key in zone without consuming anything, as
// Peek does, through the batcher: a post-charged zone's check before the
// request.
func (s *Store) Check(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	if s.isClosed() {
		return algorithms.Result{}, ErrClosed
	}
	v, err := s.call(ctx, s.RedisKey(zone, key), scriptArgs(OpPeek, micro(limit), 1, ""))
	if err != nil {
		s.problems.note(zone, err)
		return algorithms.Result{}, err
	}
	return resultNanos(v), nil
}

// Charge adds cost to key in zone after the response, whatever the burst
// (see algorithms.Limit.Charge), through the batcher, and reports the key
// as it stands afterwards.
func (s *Store) Charge(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	if s.isClosed() {
		return algorithms.Result{}, ErrClosed
	}
	v, err := s.call(ctx, s.RedisKey(zone, key), scriptArgs(OpCharge, micro(limit), cost, ""))
	if err != nil {
		s.problems.note(zone, err)
		return algorithms.Result{}, err
	}
	return resultNanos(v), nil
}

// Peek reports the state of key in zone without consuming anything. It is
// for the admin API and bypasses the batcher.
func (s *Store) Peek(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	v, err := s.unbatched(ctx, s.RedisKey(zone, key), scriptArgs(OpPeek, micro(limit), 1, ""))
	if err != nil {
		return algorithms.Result{}, err
	}
	return resultNanos(v), nil
}

// Reset deletes the state of key in zone and tells every instance to
// forget what it holds about the key (see resets.go).
func (s *Store) Reset(ctx context.Context, zone, key string) error {
	if s.isClosed() {
		return ErrClosed
	}
	b := s.breakerFor(s.RedisKey(zone, key))
	ok, probe := b.allow()
	if !ok {
		return ErrUnavailable
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	pipe := s.client.Pipeline()
	pipe.Del(ctx, s.RedisKey(zone, key))
	pipe.Publish(ctx, s.resetsChannel(), zone+"\x00"+key)
	_, err := pipe.Exec(ctx)
	b.record(probe, err)
	return err
}

// Instances is the number of live instances sharing this Redis that the
// last successful heartbeat saw; 1 before the first one. During an outage
// it keeps the last value.
func (s *Store) Instances() int { return int(s.instances.Load()) }

// EvalAt runs the GCRA script directly (no batcher, no breaker) with an
// explicit clock: limit, nowUs and the result are in microseconds, as Redis
// stores them. Production calls leave the clock to Redis TIME; EvalAt exists
// for the test that checks the script against algorithms.Limit, and for
// tools. Result.TAT is not filled in (read the key).
func (s *Store) EvalAt(ctx context.Context, op Op, zone, key string, limit algorithms.Limit, cost, nowUs int64) (algorithms.Result, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	args := scriptArgs(op, limit, cost, nowUs)
	rep := parseStepReply(s.script.Run(ctx, s.client, []string{s.RedisKey(zone, key)}, args[:]...))
	if rep.err != nil {
		return algorithms.Result{}, rep.err
	}
	v := rep.vals
	return algorithms.Result{Allowed: v[0] == 1, Remaining: v[1], RetryAfter: v[2], ResetAfter: v[3]}, nil
}

// Step is one key's GCRA step for EvalManyAt.
type Step struct {
	Op    Op
	Zone  string
	Key   string
	Limit algorithms.Limit // in microseconds
	Cost  int64
}

// EvalManyAt runs steps in one call of the GCRA script, in order, as the
// batcher sends a batch, with an explicit clock (microseconds, as EvalAt).
// A step's error (a foreign value found and deleted) is in errs; err is the
// call's. It exists for the test that checks the script against
// algorithms.Limit; Result.TAT is not filled in.
func (s *Store) EvalManyAt(ctx context.Context, steps []Step, nowUs int64) (results []algorithms.Result, errs []error, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	keys := make([]string, len(steps))
	argv := []any{nowUs}
	for i, st := range steps {
		keys[i] = s.RedisKey(st.Zone, st.Key)
		a := scriptArgs(st.Op, st.Limit, st.Cost, nowUs)
		argv = append(argv, a[1:]...)
	}
	v, err := s.script.Run(ctx, s.client, keys, argv...).Slice()
	if err != nil {
		return nil, nil, err
	}
	if len(v) != 2*len(steps) {
		return nil, nil, errBadReply
	}
	results, errs = make([]algorithms.Result, len(steps)), make([]error, len(steps))
	for i := range steps {
		rep := parseStep(v[2*i : 2*i+2])
		errs[i] = rep.err
		results[i] = algorithms.Result{Allowed: rep.vals[0] == 1, Remaining: rep.vals[1], RetryAfter: rep.vals[2], ResetAfter: rep.vals[3]}
	}
	return results, errs, nil
}

// unbatched runs the script without the batcher, through the breaker and
// bounded by the timeout.
func (s *Store) unbatched(ctx context.Context, key string, args [5]any) ([4]int64, error) {
	if s.isClosed() {
		return [4]int64{}, ErrClosed
	}
	b := s.breakerFor(key)
	ok, probe := b.allow()
	if !ok {
		return [4]int64{}, ErrUnavailable
	}
	vals, err := s.direct(ctx, key, args)
	b.record(probe, err)
	return vals, err
}

// bound limits ctx to the store's timeout.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.Timeout)
}

func (s *Store) isClosed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// micro converts a limit in nanoseconds to microseconds.
func micro(l algorithms.Limit) algorithms.Limit {
	l.EmissionInterval = max(1, l.EmissionInterval/1000)
	return l
}

// scriptArgs builds ARGV for one key's gcra.lua call; now is "" (Redis
// TIME) or int64 µs. A batch shares ARGV[1] (now) and appends the other four
// for each key.
func scriptArgs(op Op, l algorithms.Limit, cost int64, now any) [5]any {
	return [5]any{now, l.EmissionInterval, l.Burst, cost, string(op)}
}

// resultNanos converts the script's reply to a Result in nanoseconds.
func resultNanos(v [4]int64) algorithms.Result {
	return algorithms.Result{
		Allowed:    v[0] == 1,
		Remaining:  v[1],
		RetryAfter: v[2] * 1000,
		ResetAfter: v[3] * 1000,
	}
}

// Interface guards: what zones asks of a strict store.
var (
	_ zones.Store     = (*Store)(nil)
	_ zones.SlotStore = (*Store)(nil)
	_ zones.ModeStore = (*Store)(nil)
)
