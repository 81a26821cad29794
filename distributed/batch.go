package distributed

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Batching (docs/distributed.md, strict mode): each worker takes one queued
// request, then whatever else is queued (up to maxBatch), and sends them in
// one round trip: an idle store adds no delay. A batch's GCRA steps are one
// gcra.lua call, its quota steps one quota.lua call, per hash slot on a
// Cluster, one pipeline per master (see send); other scripts ride along.
// With nothing queued and fewer than idleCallers direct calls, a caller runs
// its script itself: on a quiet store the goroutine hand-offs cost as much
// as the round trip (BenchmarkStrictDecide).
//
// Few calls in flight make big batches: Redis runs scripts one at a time, so
// another call in flight hides no latency once it is busy. With 2 workers
// and 1 idle caller, 16 callers send 3.6 decisions per call instead of 2.1
// (4 workers, 2 idle callers): 1.63-1.83x redis_rate's decisions/s instead
// of 1.24-1.39x.
const (
	idleCallers = 1
	workers     = 2
	maxBatch    = 256
	queueDepth  = 4096
)

// request is one script call waiting for a worker; pooled, except one its
// caller gave up on (a worker may still reply to it).
type request struct {
	script   *redis.Script // gcra.lua, quota.lua, concurrency.lua's acquire; nil: PTTL (a Gather's)
	keys     [1]string
	args     [5]any // gcra.lua: now, T, B, cost, op; quota.lua: now, bounds, limit, cost, op
	slot     int    // the key's hash slot (Cluster only; set by the worker)
	deadline time.Time
	reply    chan reply // capacity 1: a worker never blocks on it
	timer    *time.Timer
}

// reply answers one request; which result is set depends on the script.
type reply struct {
	step  algorithms.Result // gcra.lua: the GCRA step, in µs (TAT not filled in)
	quota zones.QuotaResult // quota.lua: the quota step
	ints  [2]int64          // another script's two integers; a PTTL's in ints[0]
	err   error
}

var requests = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &request{reply: make(chan reply, 1), timer: t}
}}

// call runs script for one key through the key's breaker and the batcher,
// and waits at most until the earlier of ctx's deadline and now+Timeout.
func (c *link) call(ctx context.Context, script *redis.Script, key string, args [5]any) reply {
	b := c.breakerFor(key)
	ok, probe := b.allow()
	if !ok {
		return reply{err: ErrUnavailable}
	}
	var rep reply
	select {
	case c.idle <- struct{}{}:
		if len(c.queue) == 0 {
			rep = c.direct(ctx, script, key, args)
			<-c.idle
			break
		}
		<-c.idle
		rep = c.enqueue(ctx, script, key, args)
	default:
		rep = c.enqueue(ctx, script, key, args)
	}
	b.record(probe, rep.err)
	return rep
}

// direct runs the script at once, bounded by the timeout.
func (c *link) direct(ctx context.Context, script *redis.Script, key string, args [5]any) reply {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	keys := [1]string{key}
	n, parse := c.parser(script)
	a, err := values(script.Run(ctx, c.client, keys[:], args[:]...), n)
	if err != nil {
		return reply{err: err}
	}
	return parse(a)
}

// parser is how script's reply reads for one key: n integers, read by parse.
func (c *link) parser(script *redis.Script) (n int, parse func([]any) reply) {
	switch script {
	case c.gcra:
		return 2, parseStep
	case c.quota:
		return 3, parseQuotaStep
	}
	return 2, parseInts
}

func (c *link) enqueue(ctx context.Context, script *redis.Script, key string, args [5]any) reply {
	r := requests.Get().(*request)
	r.script, r.keys[0], r.args = script, key, args
	r.deadline = time.Now().Add(c.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(r.deadline) {
		r.deadline = d
	}
	r.timer.Reset(time.Until(r.deadline))
	recycle := func(rep reply) reply {
		r.timer.Stop()
		r.keys[0], r.args = "", [5]any{}
		requests.Put(r)
		return rep
	}
	select {
	case c.queue <- r:
	case <-r.timer.C:
		return recycle(reply{err: ErrTimeout}) // never queued: safe to reuse
	case <-ctx.Done():
		return recycle(reply{err: ctx.Err()})
	case <-c.ctx.Done():
		r.timer.Stop()
		return reply{err: ErrClosed}
	}
	select {
	case rep := <-r.reply:
		return recycle(rep)
	case <-r.timer.C:
		return reply{err: ErrTimeout}
	case <-ctx.Done():
		return reply{err: ctx.Err()}
	}
}

// batcher is one worker's reusable buffers.
type batcher struct {
	batch []*request
	calls []batchCall
	keys  []string
	argv  []any
}

// batchCall is one script call of a batch and the requests it answers: a
// run of GCRA or of quota steps, or one request of another script.
type batchCall struct {
	cmd  *redis.Cmd
	reqs []*request
}

// worker sends queued requests in batches until the store closes.
func (c *link) worker() {
	defer c.wg.Done()
	b := &batcher{
		batch: make([]*request, 0, maxBatch),
		keys:  make([]string, 0, maxBatch),
		argv:  make([]any, 0, 1+4*maxBatch),
	}
	for {
		select {
		case r := <-c.queue:
			b.batch = append(b.batch[:0], r)
		case <-c.ctx.Done():
			return
		}
	drain:
		for len(b.batch) < maxBatch {
			select {
			case r := <-c.queue:
				b.batch = append(b.batch, r)
			default:
				break drain
			}
		}
		c.send(b)
		clear(b.batch)
	}
}

// send runs b.batch in one round trip (two if Redis lost a script) and
// replies to every request; requests past their deadline are dropped. On a
// Cluster each master's calls go in a pipeline of their own, run
// concurrently, not waited for: a master that hangs costs only its own keys,
// never the healthy masters' of this batch or later ones. The goroutines are
// bounded by the callers waiting and end by their requests' latest deadline.
func (c *link) send(b *batcher) {
	now := time.Now()
	live := b.batch[:0]
	var latest time.Time
	for _, r := range b.batch {
		if r.deadline.After(now) {
			live = append(live, r)
			if r.deadline.After(latest) {
				latest = r.deadline
			}
		}
	}
	if len(live) == 0 {
		return
	}

	// GCRA steps, then quota steps (by slot on a Cluster), then the others.
	calls := b.calls[:0]
	n := 0
	for _, script := range [2]*redis.Script{c.gcra, c.quota} {
		from := n
		for i, r := range live {
			if i >= n && r.script == script {
				live[n], live[i] = live[i], live[n]
				n++
			}
		}
		run := live[from:n]
		if c.cluster && len(run) > 1 {
			for _, r := range run {
				r.slot = hashSlot(r.keys[0])
			}
			slices.SortFunc(run, func(a, b *request) int { return cmp.Compare(a.slot, b.slot) })
		}
		for i := 0; i < len(run); {
			j := i + 1
			for j < len(run) && (!c.cluster || run[j].slot == run[i].slot) {
				j++
			}
			calls = append(calls, batchCall{reqs: run[i:j]})
			i = j
		}
	}
	for i := n; i < len(live); i++ {
		calls = append(calls, batchCall{reqs: live[i : i+1]})
	}

	if c.cluster {
		c.sendByMaster(b, calls, latest)
	} else {
		ctx, cancel := context.WithDeadline(c.ctx, latest)
		if len(calls) == 1 { // a plain command costs less than a pipeline
			calls[0].cmd = b.eval(ctx, c.client, &calls[0], false)
		} else {
			pipe := c.client.Pipeline()
			for i := range calls {
				calls[i].cmd = b.eval(ctx, pipe, &calls[i], false)
			}
			_, _ = pipe.Exec(ctx) // errors are per command
		}
		c.finish(ctx, b, calls)
		cancel()
	}
	clear(calls)
	b.calls = calls
}

// sendByMaster runs each master's calls in a pipeline of their own,
// concurrently (see send). The requests are copied out of b, which the
// worker reuses at once. Only a client that never had a slot map asks a
// node for one, bounded by the batch's latest deadline.
func (c *link) sendByMaster(b *batcher, calls []batchCall, latest time.Time) {
	lookup, cancel := context.WithDeadline(c.ctx, latest)
	defer cancel()
	type master struct { // "": the client has no slot map yet
		addr   string
		calls  []batchCall
		latest time.Time // of its requests' deadlines
	}
	var groups []master
	for _, call := range calls {
		addr := ""
		if m, err := c.nodes.cluster.MasterForKey(lookup, call.reqs[0].keys[0]); err == nil {
			addr = m.Options().Addr
		}
		i := slices.IndexFunc(groups, func(g master) bool { return g.addr == addr })
		if i < 0 {
			groups = append(groups, master{addr: addr})
			i = len(groups) - 1
		}
		g := &groups[i]
		call.reqs = slices.Clone(call.reqs)
		g.calls = append(g.calls, call)
		for _, r := range call.reqs {
			if r.deadline.After(g.latest) {
				g.latest = r.deadline
			}
		}
	}
	for _, g := range groups {
		ctx, cancel := context.WithDeadline(c.ctx, g.latest)
		pipe := c.client.Pipeline()
		for i := range g.calls {
			g.calls[i].cmd = b.eval(ctx, pipe, &g.calls[i], false)
		}
		c.wg.Go(func() {
			defer cancel()
			_, _ = pipe.Exec(ctx) // errors are per command
			c.finish(ctx, nil, g.calls)
		})
	}
}

// finish retries with EVAL, in one pipeline, the calls whose script Redis
// lost, and replies to every request of calls. b's buffers build the
// retries (nil: new ones, if needed).
func (c *link) finish(ctx context.Context, b *batcher, calls []batchCall) {
	var pipe redis.Pipeliner
	for i := range calls {
		if redis.HasErrorPrefix(calls[i].cmd.Err(), "NOSCRIPT") {
			if pipe == nil {
				pipe = c.client.Pipeline()
			}
			if b == nil {
				b = &batcher{}
			}
			calls[i].cmd = b.eval(ctx, pipe, &calls[i], true)
		}
	}
	if pipe != nil {
		_, _ = pipe.Exec(ctx)
	}

	for _, call := range calls {
		if r := call.reqs[0]; r.script == nil { // a PTTL, alone in its call
			v, err := call.cmd.Int64()
			r.reply <- reply{ints: [2]int64{v}, err: err}
			continue
		}
		n, parse := c.parser(call.reqs[0].script)
		a, err := values(call.cmd, n*len(call.reqs))
		for i, r := range call.reqs {
			if err != nil {
				r.reply <- reply{err: err}
			} else {
				r.reply <- parse(a[n*i : n*i+n])
			}
		}
	}
}

// eval adds c's call to cmdable: EVALSHA, EVAL (full, when Redis lost the
// script), or PTTL for a request with no script. A batched call's ARGV is
// the shared now ("": Redis TIME) and each request's four arguments.
func (b *batcher) eval(ctx context.Context, cmdable interface {
	redis.Scripter
	Do(ctx context.Context, args ...any) *redis.Cmd
}, c *batchCall, full bool) *redis.Cmd {
	r := c.reqs[0]
	if r.script == nil {
		return cmdable.Do(ctx, "PTTL", r.keys[0])
	}
	keys, argv := r.keys[:], r.args[:]
	if len(c.reqs) > 1 {
		b.keys, b.argv = b.keys[:0], append(b.argv[:0], "")
		for _, r := range c.reqs {
			b.keys = append(b.keys, r.keys[0])
			b.argv = append(b.argv, r.args[1:]...)
		}
		keys, argv = b.keys, b.argv
		defer func() { clear(b.keys); clear(b.argv) }()
	}
	if full {
		return r.script.Eval(ctx, cmdable, keys, argv...)
	}
	return r.script.EvalSha(ctx, cmdable, keys, argv...)
}

// values reads cmd's reply, a flat array of want values: every script
// replies a fixed number per key, in order (see parser). An error (Redis's,
// or a bad reply) answers every key of the call.
func values(cmd *redis.Cmd, want int) ([]any, error) {
	v, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != want {
		return nil, errBadReply
	}
	return a, nil
}

// parseStep reads one key's {r, reset} of gcra.lua (see its header).
func parseStep(a []any) reply {
	r, ok := a[0].(int64)
	reset, ok2 := a[1].(int64)
	switch {
	case !ok || !ok2:
		return reply{err: errBadReply}
	case reset == -1:
		return reply{err: errForeignType}
	case reset == -2:
		return reply{err: errForeignValue}
	case r < 0:
		return reply{step: algorithms.Result{RetryAfter: -r, ResetAfter: reset}}
	}
	return reply{step: algorithms.Result{Allowed: true, Remaining: r, ResetAfter: reset}}
}

// parseInts reads another script's two integers (concurrency.lua's
// acquisition: {taken, in use}).
func parseInts(a []any) reply {
	x, ok := a[0].(int64)
	y, ok2 := a[1].(int64)
	if !ok || !ok2 {
		return reply{err: errBadReply}
	}
	return reply{ints: [2]int64{x, y}}
}

// scriptError is a per-key error a script reported in its reply: a
// redis.Error, so that it counts as Redis answering (not an outage).
type scriptError string

func (e scriptError) Error() string { return string(e) }
func (scriptError) RedisError()     {}

const (
	errForeignType  = scriptError("TALLYFOREIGN a value of another type was at a tally key; deleted")
	errForeignValue = scriptError("TALLYFOREIGN a value that is not a TAT was at a tally key; deleted")
)

// hashSlot is Redis Cluster's slot of key: CRC16 (XMODEM) of the key, or
// of its non-empty hash tag, mod 16384.
func hashSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}
