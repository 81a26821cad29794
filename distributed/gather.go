package distributed

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Gather sends the peeks of one read that spans zones (the
// rate_limit_status handler) in one round trip per Redis: each of its
// concurrent callers parks its first peek until every caller has parked
// one or finished, and the last to arrive sends them all as one batch. A
// caller's later peeks and other calls go as without a Gather.
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

// Caller returns the context one of g's callers passes to its store calls,
// and the func it calls when finished. Each of g's n callers must call
// both once.
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

// gathered runs a peek of script for key through ctx's Gather, if it has
// one that still waits for this caller's; ok is false otherwise. Another
// script's peek (not gcra.lua's or quota.lua's), or with a nil script a
// PTTL, goes in a call of its own in the batch's pipeline and replies two
// integers (reply.ints), one for a PTTL.
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
