package distributed

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Batching: callers put requests on a queue; each of a few workers takes one
// (blocking), then whatever else is already queued (not waiting for more), and
// sends them all as one pipeline. An idle store therefore adds no delay, and a
// busy one sends one round trip for up to maxBatch decisions.
//
// When nothing is queued and fewer than idleCallers calls are running
// directly, a caller skips the queue and runs its script itself: that saves
// the goroutine hand-offs, which cost as much as the round trip on a quiet
// store (see BenchmarkStrictDecide).
const (
	idleCallers = 2
	workers     = 4
	maxBatch    = 256
	queueDepth  = 4096
)

// request is one script call waiting for a worker. Requests are pooled with
// their reply channel and timer; a caller that gives up on its request (time
// out, cancellation) leaves it to the garbage collector instead, since a
// worker may still reply to it.
type request struct {
	script   *redis.Script // gcra.lua, or concurrency.lua's acquire
	keys     [1]string
	args     [5]any // T, B, cost, op, now
	deadline time.Time
	reply    chan reply // capacity 1: a worker never blocks on it
	timer    *time.Timer
}

type reply struct {
	vals [4]int64 // allowed, remaining, retry_after_us, reset_after_us
	err  error
}

var requests = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &request{reply: make(chan reply, 1), timer: t}
}}

// call runs the GCRA script for one key through the batcher and waits at
// most until deadline (the earlier of ctx's and now+Timeout).
func (s *Store) call(ctx context.Context, key string, args [5]any) ([4]int64, error) {
	return s.callScript(ctx, s.script, key, args)
}

// callScript is call for any single-key script whose reply is four
// integers.
func (s *Store) callScript(ctx context.Context, script *redis.Script, key string, args [5]any) ([4]int64, error) {
	ok, probe := s.breaker.allow()
	if !ok {
		return [4]int64{}, ErrUnavailable
	}
	var vals [4]int64
	var err error
	select {
	case s.idle <- struct{}{}:
		if len(s.queue) == 0 {
			vals, err = s.directScript(ctx, script, key, args)
			<-s.idle
			break
		}
		<-s.idle
		vals, err = s.enqueue(ctx, script, key, args)
	default:
		vals, err = s.enqueue(ctx, script, key, args)
	}
	s.breaker.record(probe, err)
	return vals, err
}

// direct runs the script at once, bounded by the timeout. On an idle store
// this saves the hand-off to a worker, which costs a goroutine wake-up.
func (s *Store) direct(ctx context.Context, key string, args [5]any) ([4]int64, error) {
	return s.directScript(ctx, s.script, key, args)
}

func (s *Store) directScript(ctx context.Context, script *redis.Script, key string, args [5]any) ([4]int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	keys := [1]string{key}
	rep := parseReply(script.Run(ctx, s.client, keys[:], args[:]...))
	return rep.vals, rep.err
}

func (s *Store) enqueue(ctx context.Context, script *redis.Script, key string, args [5]any) ([4]int64, error) {
	r := requests.Get().(*request)
	r.script, r.keys[0], r.args = script, key, args
	r.deadline = time.Now().Add(s.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(r.deadline) {
		r.deadline = d
	}
	r.timer.Reset(time.Until(r.deadline))
	select {
	case s.queue <- r:
	case <-r.timer.C:
		r.timer.Stop()
		r.keys[0], r.args = "", [5]any{}
		requests.Put(r) // never queued: safe to reuse
		return [4]int64{}, ErrTimeout
	case <-ctx.Done():
		r.timer.Stop()
		r.keys[0], r.args = "", [5]any{}
		requests.Put(r)
		return [4]int64{}, ctx.Err()
	case <-s.done:
		r.timer.Stop()
		return [4]int64{}, ErrClosed
	}
	select {
	case rep := <-r.reply:
		r.timer.Stop()
		r.keys[0], r.args = "", [5]any{}
		requests.Put(r)
		return rep.vals, rep.err
	case <-r.timer.C:
		return [4]int64{}, ErrTimeout
	case <-ctx.Done():
		return [4]int64{}, ctx.Err()
	}
}

// worker sends queued requests as pipelines until the store closes.
func (s *Store) worker() {
	defer s.wg.Done()
	batch := make([]*request, 0, maxBatch)
	cmds := make([]*redis.Cmd, 0, maxBatch)
	for {
		select {
		case r := <-s.queue:
			batch = append(batch[:0], r)
		case <-s.done:
			return
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-s.queue:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		cmds = s.send(batch, cmds)
		clear(batch)
	}
}

// send runs batch as one pipeline (two if Redis lost the script) and replies
// to every request. Requests already past their deadline are dropped: their
// callers have gone.
func (s *Store) send(batch []*request, cmds []*redis.Cmd) []*redis.Cmd {
	now := time.Now()
	live := batch[:0]
	var latest time.Time
	for _, r := range batch {
		if r.deadline.After(now) {
			live = append(live, r)
			if r.deadline.After(latest) {
				latest = r.deadline
			}
		}
	}
	if len(live) == 0 {
		return cmds
	}
	ctx, cancel := context.WithDeadline(s.ctx, latest)
	defer cancel()

	cmds = cmds[:0]
	if len(live) == 1 { // an idle store: a plain command costs less than a pipeline
		r := live[0]
		cmds = append(cmds, r.script.EvalSha(ctx, s.client, r.keys[:], r.args[:]...))
	} else {
		pipe := s.client.Pipeline()
		for _, r := range live {
			cmds = append(cmds, r.script.EvalSha(ctx, pipe, r.keys[:], r.args[:]...))
		}
		_, _ = pipe.Exec(ctx) // errors are per command
	}

	var retry []int
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if retry != nil {
		pipe := s.client.Pipeline()
		for _, i := range retry {
			r := live[i]
			cmds[i] = r.script.Eval(ctx, pipe, r.keys[:], r.args[:]...)
		}
		_, _ = pipe.Exec(ctx)
	}

	for i, r := range live {
		r.reply <- parseReply(cmds[i])
	}
	clear(cmds)
	return cmds
}

// parseReply reads the script's {allowed, remaining, retry, reset}.
func parseReply(c *redis.Cmd) reply {
	v, err := c.Result()
	if err != nil {
		return reply{err: err}
	}
	a, ok := v.([]any)
	if !ok || len(a) != 4 {
		return reply{err: errBadReply}
	}
	var rep reply
	for i, x := range a {
		n, ok := x.(int64)
		if !ok {
			return reply{err: errBadReply}
		}
		rep.vals[i] = n
	}
	return rep
}
