package distributed

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"

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

// Strict is the strict-mode implementation of zones.Store: every decision
// is a step of gcra.lua in Redis. It is safe for concurrent use; one Strict
// per Redis setting is shared by every handler (see Options.Key) and closed
// when the last one goes.
type Strict struct {
	*link
	ops struct { // gcra.lua's ban and delay ops, by rule (see op)
		sync.RWMutex
		m map[opKey]any
	}
}

// Open creates the store and starts its workers and heartbeat. It does not
// contact Redis: Caddy must start during a Redis outage, and the zones'
// fail policy covers it. Errors (bad addresses) never contain a password.
func Open(opts Options, logger *zap.Logger) (*Strict, error) {
	c, err := newLink(opts, logger)
	if err != nil {
		return nil, err
	}
	c.start(strictMode{})
	return &Strict{link: c}, nil
}

// strictMode keeps nothing of its own: every decision is Redis's, and the
// zones' deny caches are reset through their listeners.
type strictMode struct{}

func (strictMode) forgetRecord(zone, key string) {}
func (strictMode) synced() bool                  { return true }
func (strictMode) forgetDenials()                {}

// Close stops the workers and the heartbeat, removes this instance from the
// instances set (best effort, bounded by the timeout) and closes the client.
// Calls made after Close return ErrClosed.
func (s *Strict) Close() error { return s.close() }

// Destruct closes the store; it makes a Strict a caddy.Destructor for
// sharing through a caddy.UsagePool.
func (s *Strict) Destruct() error { return s.Close() }

// Offers says what a strict store offers besides its steps: bans kept
// with the decisions, quotas, the fleet-wide ban list and concurrency
// slots.
func (s *Strict) Offers() zones.Offers {
	return zones.Offers{Mode: "strict", BanSteps: true, Quotas: true, BanList: s.link, Slots: s.link}
}

// Rate runs one step of a rate zone's key in Redis (zones.Store): one
// gcra.lua op, through the batcher but for a peek. limit is in
// nanoseconds, like the result; Redis works in microseconds, so T is
// rounded down to a whole microsecond (at least 1).
func (s *Strict) Rate(ctx context.Context, zone, key string, st zones.RateStep) (zones.RateReply, error) {
	var rep zones.RateReply
	var err error
	banned := st.Ban != zones.BanRule{}
	switch {
	case st.Op == zones.OpDecide && banned && st.Ahead > 0:
		rep.Result, rep.Ban, err = s.decideBanAhead(ctx, zone, key, st.Limit, st.Cost, st.Ban, st.Ahead)
	case st.Op == zones.OpDecide && banned:
		rep.Result, rep.Ban, err = s.decideBan(ctx, zone, key, st.Limit, st.Cost, st.Ban)
	case st.Op == zones.OpDecide && st.Ahead > 0:
		rep.Result, err = s.decideAhead(ctx, zone, key, st.Limit, st.Cost, st.Ahead)
	case st.Op == zones.OpDecide:
		rep.Result, err = s.decide(ctx, zone, key, st.Limit, st.Cost)
	case st.Op == zones.OpCheck && banned:
		rep.Result, rep.Ban, err = s.checkBan(ctx, zone, key, st.Limit, st.Ban)
	case st.Op == zones.OpCheck:
		rep.Result, err = s.check(ctx, zone, key, st.Limit)
	case st.Op == zones.OpCharge:
		rep.Result, err = s.charge(ctx, zone, key, st.Limit, st.Cost)
	case st.Op == zones.OpRefund:
		err = s.refund(ctx, zone, key, st.Limit, st.Cost)
	case st.Op == zones.OpPeek && banned:
		rep.Result, rep.Ban, err = s.peekBan(ctx, zone, key, st.Limit)
	case st.Op == zones.OpPeek:
		rep.Result, err = s.peek(ctx, zone, key, st.Limit)
	case st.Op == zones.OpReset:
		err = s.resetKey(ctx, zone, key)
	default:
		err = fmt.Errorf("distributed: unknown rate op %d", st.Op)
	}
	return rep, err
}

// RedisKey is the Redis key holding the state of key in zone:
// <key_prefix><zone>:<key> (async mode's are <key_prefix><zone>.async:<key>).
// Zone names cannot contain '.' or ':', so no key of one mode is a key of
// the other, and no key is the instances set.
func (s *Strict) RedisKey(zone, key string) string {
	return s.opts.KeyPrefix + zone + ":" + key
}

// Decide runs one GCRA step for key in zone in Redis. limit is in
// nanoseconds, like the result; Redis works in microseconds, so T is
// rounded down to a whole microsecond (at least 1).
func (s *Strict) decide(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	return s.step(ctx, zone, key, scriptArgs(OpDecide, micro(limit), cost, ""))
}

// decideBan is decide in a zone with a ban (a step with a ban rule): a key
// banned in Redis is denied until the ban's end, and a denial starts the
// ban in the same script step, with the key's TTL reaching its end.
func (s *Strict) decideBan(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64, rule zones.BanRule) (algorithms.Result, zones.StoreBan, error) {
	l := micro(limit)
	return s.banStep(ctx, zone, key, [5]any{"", l.EmissionInterval, l.Burst, cost, s.op('b', rule, 0)})
}

// decideAhead is decide in a zone with delay (a step with ahead): a request
// whose allow time is at most ahead (ns) away is admitted for later in the
// same script step, its slot reserved in Redis, so that every instance's
// reservations of the key are spaced by its emission interval.
func (s *Strict) decideAhead(ctx context.Context, zone, key string, limit algorithms.Limit, cost, ahead int64) (algorithms.Result, error) {
	if s.isClosed() {
		return algorithms.Result{}, ErrClosed
	}
	l := micro(limit)
	rep := s.call(ctx, s.gcra, s.RedisKey(zone, key), [5]any{"", l.EmissionInterval, l.Burst, cost, s.op('w', zones.BanRule{}, ahead)})
	if rep.err != nil {
		s.problems.note(zone, rep.err)
		return algorithms.Result{}, rep.err
	}
	return withDelay(nanos(rep.step), l), nil
}

// decideBanAhead is decideBan in a zone with delay too.
func (s *Strict) decideBanAhead(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64, rule zones.BanRule, ahead int64) (algorithms.Result, zones.StoreBan, error) {
	l := micro(limit)
	r, b, err := s.banStep(ctx, zone, key, [5]any{"", l.EmissionInterval, l.Burst, cost, s.op('b', rule, ahead)})
	return withDelay(r, l), b, err
}

// withDelay sets the wait of r, an allowed step of a delay op in
// nanoseconds under l, the limit Redis decided with (µs): the reply's reset
// less the burst's span, when positive (see gcra.lua).
func withDelay(r algorithms.Result, l algorithms.Limit) algorithms.Result {
	if r.Allowed {
		if wait := r.ResetAfter - l.Burst*l.EmissionInterval*1000; wait > 0 {
			r.Delay = wait
		}
	}
	return r
}

// checkBan is check in a zone with a ban: a post-charged check that finds
// no quota starts the ban.
func (s *Strict) checkBan(ctx context.Context, zone, key string, limit algorithms.Limit, rule zones.BanRule) (algorithms.Result, zones.StoreBan, error) {
	l := micro(limit)
	return s.banStep(ctx, zone, key, [5]any{"", l.EmissionInterval, l.Burst, int64(1), s.op('B', rule, 0)})
}

// peekBan is peek with the key's ban, for the admin API: it bypasses the
// batcher and starts nothing.
func (s *Strict) peekBan(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, zones.StoreBan, error) {
	rkey := s.RedisKey(zone, key)
	var rep reply
	l := micro(limit)
	err := s.unbatched(ctx, rkey, func(ctx context.Context) error {
		rep = s.direct(ctx, s.gcra, rkey, [5]any{"", l.EmissionInterval, l.Burst, int64(1), "P0,0"})
		return rep.err
	})
	if err != nil {
		return algorithms.Result{}, zones.StoreBan{}, err
	}
	return banResult(rep)
}

func (s *Strict) banStep(ctx context.Context, zone, key string, args [5]any) (algorithms.Result, zones.StoreBan, error) {
	if s.isClosed() {
		return algorithms.Result{}, zones.StoreBan{}, ErrClosed
	}
	rep := s.call(ctx, s.gcra, s.RedisKey(zone, key), args)
	if rep.err != nil {
		s.problems.note(zone, rep.err)
		return algorithms.Result{}, zones.StoreBan{}, rep.err
	}
	return banResult(rep)
}

// banResult reads a ban op's reply.
func banResult(rep reply) (algorithms.Result, zones.StoreBan, error) {
	var b zones.StoreBan
	if code := -rep.step.ResetAfter - 8; !rep.step.Allowed && code >= 0 {
		// gcra.lua's ban reply: reset = -(8 + 2·level + started).
		b = zones.StoreBan{Banned: true, Started: code%2 == 1, Level: int(code / 2)}
		rep.step.ResetAfter = rep.step.RetryAfter
	}
	return nanos(rep.step), b, nil
}

// op is gcra.lua's op for a ban zone's decide ('b') or check ('B'),
// "<op><first µs>,<max µs>", with ",<ahead µs>" for a decide that admits
// for later, or a delay zone's decide ('w'), "w<ahead µs>"; boxed once per
// rule: a zone's decisions allocate nothing for it.
func (s *Strict) op(op byte, rule zones.BanRule, ahead int64) any {
	k := opKey{op, rule, ahead}
	s.ops.RLock()
	v, ok := s.ops.m[k]
	s.ops.RUnlock()
	if ok {
		return v
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	if s.ops.m == nil {
		s.ops.m = make(map[opKey]any)
	}
	aheadUs := (ahead + 999) / 1000 // a delay of part of a µs reserves that µs
	switch {
	case op == 'w':
		v = fmt.Sprintf("w%d", aheadUs)
	case ahead > 0:
		v = fmt.Sprintf("%c%d,%d,%d", op, max(1, rule.First.Microseconds()), max(rule.First, rule.Max).Microseconds(), aheadUs)
	default:
		v = fmt.Sprintf("%c%d,%d", op, max(1, rule.First.Microseconds()), max(rule.First, rule.Max).Microseconds())
	}
	s.ops.m[k] = v
	return v
}

type opKey struct {
	op    byte
	rule  zones.BanRule
	ahead int64
}

// Refund gives back cost for key in zone (see algorithms.Limit.Refund).
func (s *Strict) refund(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) error {
	_, err := s.step(ctx, zone, key, scriptArgs(OpRefund, micro(limit), cost, ""))
	return err
}

// Check reports the state of key in zone without consuming anything, as
// Peek does, through the batcher: a post-charged zone's check before the
// request.
func (s *Strict) check(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	return s.step(ctx, zone, key, scriptArgs(OpPeek, micro(limit), 1, ""))
}

// Charge adds cost to key in zone after the response, whatever the burst
// (see algorithms.Limit.Charge), through the batcher, and reports the key
// as it stands afterwards.
func (s *Strict) charge(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	return s.step(ctx, zone, key, scriptArgs(OpCharge, micro(limit), cost, ""))
}

// step runs one GCRA step (args: scriptArgs, with the limit in µs) through
// the batcher, returns its result in nanoseconds and notes a per-key error
// Redis reported. The callers build args with a constant op: converting a
// variable one to an interface would allocate on every decision.
func (s *Strict) step(ctx context.Context, zone, key string, args [5]any) (algorithms.Result, error) {
	if s.isClosed() {
		return algorithms.Result{}, ErrClosed
	}
	rep := s.call(ctx, s.gcra, s.RedisKey(zone, key), args)
	if rep.err != nil {
		s.problems.note(zone, rep.err)
		return algorithms.Result{}, rep.err
	}
	return nanos(rep.step), nil
}

// Peek reports the state of key in zone without consuming anything. It is
// for the admin API and bypasses the batcher.
func (s *Strict) peek(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	rkey := s.RedisKey(zone, key)
	var rep reply
	err := s.unbatched(ctx, rkey, func(ctx context.Context) error {
		rep = s.direct(ctx, s.gcra, rkey, scriptArgs(OpPeek, micro(limit), 1, ""))
		return rep.err
	})
	if err != nil {
		return algorithms.Result{}, err
	}
	return nanos(rep.step), nil
}

// Reset deletes the state of key in zone and tells every instance to
// forget what it holds about the key (see resets.go).
func (s *Strict) resetKey(ctx context.Context, zone, key string) error {
	return s.reset(ctx, s.RedisKey(zone, key), zone, key)
}

// micro converts a limit in nanoseconds to microseconds.
func micro(l algorithms.Limit) algorithms.Limit {
	l.EmissionInterval = max(1, l.EmissionInterval/1000)
	return l
}

// Op is the op argument of gcra.lua and quota.lua: what a step does to a
// key, in the store's own calls and in the testing seam's (EvalAt). A
// zones.Op becomes one of these, or a ban or delay op (see op).
type Op string

// The scripts' plain operations, mirroring algorithms.Limit's methods.
const (
	OpDecide Op = "d"
	OpRefund Op = "r"
	OpPeek   Op = "p"
	OpCharge Op = "c"
)

// scriptArgs builds ARGV for one key's gcra.lua call; now is "" (Redis
// TIME) or int64 µs. A batch shares ARGV[1] (now) and appends the other four
// for each key.
func scriptArgs(op Op, l algorithms.Limit, cost int64, now any) [5]any {
	return [5]any{now, l.EmissionInterval, l.Burst, cost, string(op)}
}

// nanos converts a result in microseconds (Redis's) to nanoseconds. Its TAT
// is left out: it lives in Redis, on Redis's clock.
func nanos(r algorithms.Result) algorithms.Result {
	return algorithms.Result{
		Allowed:    r.Allowed,
		Remaining:  r.Remaining,
		RetryAfter: r.RetryAfter * 1000,
		ResetAfter: r.ResetAfter * 1000,
	}
}

// Interface guards: what zones asks of a strict store.
var (
	_ zones.Store   = (*Strict)(nil)
	_ zones.Slots   = (*link)(nil)
	_ zones.BanList = (*link)(nil)
)
