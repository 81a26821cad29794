package distributed

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Errors returned by the store, besides Redis's own: ErrUnavailable while
// the breaker is open (Redis was not asked), ErrTimeout when Redis did not
// answer within Options.Timeout, ErrClosed after Close.
var (
	ErrUnavailable = errors.New("distributed: redis unavailable (breaker open)")
	ErrTimeout     = fmt.Errorf("distributed: redis did not answer in time: %w", context.DeadlineExceeded)
	ErrClosed      = errors.New("distributed: store closed")
	errBadReply    = errors.New("distributed: unexpected reply from the GCRA script")
)

//go:embed gcra.lua
var gcraScript string

// Strict is the strict-mode zones.Store: every decision is a step of
// gcra.lua in Redis. One Strict per Redis setting is shared by every
// handler (Options.Key) and closed when the last one goes.
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
	s := &Strict{link: c}
	s.ops.m = make(map[opKey]any)
	return s, nil
}

// strictMode keeps nothing of its own: the zones' deny caches are reset
// through their listeners.
type strictMode struct{}

func (strictMode) forgetRecord(zone, key string) {}
func (strictMode) synced() bool                  { return true }
func (strictMode) forgetDenials()                {}

// Destruct closes the store (caddy.Destructor, for caddy.UsagePool).
func (s *Strict) Destruct() error { return s.Close() }

// Offers says what a strict store offers besides its steps.
func (s *Strict) Offers() zones.Offers {
	return zones.Offers{Mode: "strict", BanSteps: true, Quotas: true, BanList: s.link, Slots: s.link, Overrides: s.overrides()}
}

// RedisKey is the Redis key of key in zone: <key_prefix><zone>:<key> (async
// mode's: <zone>.async:<key>). Zone names have no '.' or ':', so no key of
// one mode is the other's, nor the instances set.
func (s *Strict) RedisKey(zone, key string) string {
	return s.opts.KeyPrefix + zone + ":" + key
}

// Rate runs one gcra.lua step of a rate zone's key (zones.Store), through
// the batcher but for a peek (a PTTL without a ban: peekTTL). T is rounded
// down to a whole µs (at least 1). A ban rule and ahead apply in the same
// script step, so that bans and reservations hold fleet-wide.
func (s *Strict) Rate(ctx context.Context, zone, key string, st zones.RateStep) (zones.RateReply, error) {
	banned := st.Ban != zones.BanRule{}
	var op any // a constant or boxed once (see op): converting a variable would allocate
	switch {
	case st.Op == zones.OpDecide && (banned || st.Ahead > 0):
		op = s.op('b', st.Ban, st.Ahead)
	case st.Op == zones.OpDecide:
		op = string(OpDecide)
	case st.Op == zones.OpCheck && banned:
		op, st.Cost = s.op('B', st.Ban, 0), 1
	case st.Op == zones.OpPeek && !banned:
		return s.peekTTL(ctx, s.RedisKey(zone, key), micro(st.Limit))
	case st.Op == zones.OpCheck:
		op, st.Cost = string(OpPeek), 1 // a check consumes nothing, as a peek
	case st.Op == zones.OpPeek:
		op, st.Cost = "P0,0", 1
	case st.Op == zones.OpCharge:
		op = string(OpCharge)
	case st.Op == zones.OpRefund:
		op = string(OpRefund)
	case st.Op == zones.OpReset:
		return zones.RateReply{}, s.reset(ctx, s.RedisKey(zone, key), zone, key)
	default:
		return zones.RateReply{}, fmt.Errorf("distributed: unknown rate op %d", st.Op)
	}
	l := micro(st.Limit)
	rep, err := s.run(ctx, s.gcra, zone, s.RedisKey(zone, key), st.Op == zones.OpPeek, [5]any{"", l.EmissionInterval, l.Burst, st.Cost, op})
	if err != nil || st.Op == zones.OpRefund { // a refund's reply means nothing
		return zones.RateReply{}, err
	}
	var out zones.RateReply
	if code := -rep.step.ResetAfter - 8; !rep.step.Allowed && code >= 0 {
		// gcra.lua's ban reply: reset = -(8 + 2·level + started).
		out.Ban = zones.StoreBan{Banned: true, Started: code%2 == 1, Level: int(code / 2)}
		rep.step.ResetAfter = rep.step.RetryAfter
	}
	out.Result = nanos(rep.step)
	if wait := out.ResetAfter - l.Burst*l.EmissionInterval*1000; out.Allowed && st.Op == zones.OpDecide && st.Ahead > 0 && wait > 0 {
		out.Delay = wait // admitted for later: the reply's reset less the burst's span (see gcra.lua)
	}
	return out, nil
}

// ttlSlack is how far a key's PTTL, in µs, may run past its TAT − now:
// gcra.lua rounds the TTL it sets up to a whole ms, and Redis keeps
// expiries and answers PTTL in whole ms of its clock (one ms each, less
// the time between the script's start and its TIME).
const ttlSlack = 2000

// peekTTL peeks a key whose zone has no ban with one PTTL: every gcra.lua
// write gives such a key the TTL of its reset (TAT − now, rounded up to a
// ms), whatever the op and plan, and an absent key is full. Read as it is
// ttlSlack later, a unit comes back up to 3 ms early and a key never reads
// more spent than it is; its reset is the TTL, up to 2 ms late. A key with
// no expiry (-1) is not gcra.lua's and reads as fresh, as a decision would
// start it.
func (s *Strict) peekTTL(ctx context.Context, rkey string, l algorithms.Limit) (zones.RateReply, error) {
	v, err := s.ints(ctx, nil, rkey)
	if err != nil {
		return zones.RateReply{}, err
	}
	ms := v[0]
	r := l.Peek(max(0, ms*1000-ttlSlack), 0)
	r.ResetAfter = max(r.ResetAfter, ms*1000)
	return zones.RateReply{Result: nanos(r)}, nil
}

// run runs script (gcra.lua or quota.lua) for rkey through the batcher,
// noting a per-key error; a peek goes at once or in ctx's Gather.
func (c *link) run(ctx context.Context, script *redis.Script, zone, rkey string, peek bool, args [5]any) (reply, error) {
	if peek {
		var rep reply
		err := c.unbatched(ctx, rkey, func(ctx context.Context) error {
			var ok bool
			if rep, ok = c.gathered(ctx, script, rkey, args); !ok {
				rep = c.direct(ctx, script, rkey, args)
			}
			return rep.err
		})
		return rep, err
	}
	if c.isClosed() {
		return reply{}, ErrClosed
	}
	rep := c.call(ctx, script, rkey, args)
	if rep.err != nil {
		c.problems.note(zone, rep.err)
	}
	return rep, rep.err
}

// scriptCall is one call of a script in a pipeline (evalAll).
type scriptCall struct {
	keys []string
	args []any
	cmd  *redis.Cmd
}

// evalAll runs script once per call in one pipeline, again with its source
// for the calls whose script Redis lost; errors are per call.
func (c *link) evalAll(ctx context.Context, script *redis.Script, calls []*scriptCall) {
	pipe := c.client.Pipeline()
	for _, sc := range calls {
		sc.cmd = script.EvalSha(ctx, pipe, sc.keys, sc.args...)
	}
	_, _ = pipe.Exec(ctx)
	var retry redis.Pipeliner
	for _, sc := range calls {
		if redis.HasErrorPrefix(sc.cmd.Err(), "NOSCRIPT") {
			if retry == nil {
				retry = c.client.Pipeline()
			}
			sc.cmd = script.Eval(ctx, retry, sc.keys, sc.args...)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
}

// op is gcra.lua's ban op ('b' decide, 'B' check) for rule, with ahead for
// a decide that admits for later, or with no rule a delay zone's decide
// ("w<ahead µs>"); boxed once per rule: decisions allocate nothing for it.
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
	aheadUs := (ahead + 999) / 1000 // a delay of part of a µs reserves that µs
	switch {
	case rule == zones.BanRule{}:
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

func micro(l algorithms.Limit) algorithms.Limit {
	l.EmissionInterval = max(1, l.EmissionInterval/1000)
	return l
}

// Op is the op argument of gcra.lua and quota.lua (EvalAt's too).
type Op string

// The scripts' plain operations, mirroring algorithms.Limit's methods.
const (
	OpDecide Op = "d"
	OpRefund Op = "r"
	OpPeek   Op = "p"
	OpCharge Op = "c"
)

// nanos converts a result in µs to ns, less its TAT (Redis's clock).
func nanos(r algorithms.Result) algorithms.Result {
	r.TAT, r.RetryAfter, r.ResetAfter = 0, r.RetryAfter*1000, r.ResetAfter*1000
	return r
}

var (
	_ zones.Store   = (*Strict)(nil)
	_ zones.Slots   = (*link)(nil)
	_ zones.BanList = (*link)(nil)
)

// A Gather sends the peeks of one read across zones (rate_limit_status) in
// one round trip per Redis: each concurrent caller parks its first peek
// until every caller has parked one or finished, and the last to arrive
// sends them all as one batch. Later peeks and other calls go as usual.
type Gather struct {
	mu      sync.Mutex
	waiting int // callers neither parked nor finished
	parked  []parkedPeek
}

type parkedPeek struct {
	c *link
	r *request
}

type gatherCaller struct {
	g       *Gather
	arrived bool // parked a peek, or finished; under g.mu
}

type gatherKey struct{}

// NewGather returns a Gather of n callers.
func NewGather(n int) *Gather { return &Gather{waiting: n} }

// Caller returns the context a caller passes to its store calls and the
// func it calls when finished; each of g's n callers calls both once.
func (g *Gather) Caller(ctx context.Context) (context.Context, func()) {
	gc := &gatherCaller{g: g}
	return context.WithValue(ctx, gatherKey{}, gc), func() {
		all, _ := g.arrive(gc, parkedPeek{})
		send(all)
	}
}

// arrive counts gc in, parking its peek p if any (taken), and returns all
// the parked peeks when gc was the last.
func (g *Gather) arrive(gc *gatherCaller, p parkedPeek) (all []parkedPeek, taken bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gc.arrived {
		return nil, false
	}
	gc.arrived = true
	if p.r != nil {
		g.parked = append(g.parked, p)
	}
	if g.waiting--; g.waiting > 0 {
		return nil, true
	}
	return g.parked, true
}

// send sends parked peeks, one batch per link.
func send(parked []parkedPeek) {
	for len(parked) > 0 {
		c := parked[0].c
		b := &batcher{}
		rest := parked[:0]
		deadline := time.Now().Add(c.opts.Timeout)
		for _, p := range parked {
			if p.c != c {
				rest = append(rest, p)
				continue
			}
			if p.r.deadline.IsZero() || deadline.Before(p.r.deadline) {
				p.r.deadline = deadline
			}
			b.batch = append(b.batch, p.r)
		}
		parked = rest
		c.send(b)
	}
}

// gathered runs a peek of script for key through ctx's Gather, if one still
// waits for this caller's (ok). Another script's peek, or a PTTL (nil
// script), goes in a call of its own in the batch's pipeline and replies
// in reply.ints.
func (c *link) gathered(ctx context.Context, script *redis.Script, key string, args [5]any) (rep reply, ok bool) {
	gc, _ := ctx.Value(gatherKey{}).(*gatherCaller)
	if gc == nil {
		return reply{}, false
	}
	r := &request{script: script, keys: [1]string{key}, args: args, reply: make(chan reply, 1)}
	if d, has := ctx.Deadline(); has {
		r.deadline = d
	}
	all, taken := gc.g.arrive(gc, parkedPeek{c, r})
	if !taken {
		return reply{}, false
	}
	send(all)
	select {
	case rep = <-r.reply:
	case <-ctx.Done():
		rep = reply{err: ctx.Err()}
	case <-c.ctx.Done():
		rep = reply{err: ErrClosed}
	}
	return rep, true
}
