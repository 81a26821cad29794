package distributed

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Resets reach every instance through Redis pub/sub (docs/operations.md has
// the bound): a reset deletes the key and publishes "<zone>\x00<key>" on
// <key_prefix>resets, and every store makes its listeners forget the key.
// The resetting store forgets first and skips its own message: heard late,
// it would drop requests admitted after the reset, which Redis never counts.
// A store whose subscription dropped drops every cached denial once it
// decides through Redis again, not earlier: while the fail policy decides,
// the cache keeps blocked keys blocked under open.

const resubscribeEvery = 250 * time.Millisecond

// ResetListener is what a zone offers to hear of resets made elsewhere.
type ResetListener interface {
	Forget(key string) // drops what the instance holds about key
	ForgetDenials()    // resets may have been missed
}

type resets struct {
	mu        sync.Mutex
	listeners map[string][]*ResetListener
	moved     map[string][]chan<- struct{} // by zone, who hears of its overrides' changes
	missed    atomic.Bool                  // resets may have been missed since the last subscription
	live      atomic.Bool                  // the subscription is confirmed and has not failed since
	ownMu     sync.Mutex
	own       map[string]int // by message, own resets not heard back yet
}

// maxOwnResets bounds the resets awaited back (each is dropped at the next
// subscription anyway): past it, the store forgets on hearing its own.
const maxOwnResets = 10_000

func (r *resets) published(msg string) {
	r.ownMu.Lock()
	if r.own == nil || len(r.own) >= maxOwnResets {
		r.own = make(map[string]int)
	}
	r.own[msg]++
	r.ownMu.Unlock()
}

// heardOwn reports whether msg is one of this store's own resets, counting
// it heard.
func (r *resets) heardOwn(msg string) bool {
	r.ownMu.Lock()
	defer r.ownMu.Unlock()
	n := r.own[msg]
	if n > 1 {
		r.own[msg] = n - 1
	} else {
		delete(r.own, msg)
	}
	return n > 0
}

// subscribed drops the resets awaited back: what was published while the
// store was not subscribed never comes.
func (r *resets) subscribed() {
	r.ownMu.Lock()
	r.own = nil
	r.ownMu.Unlock()
}

// modeState is what a store's mode keeps of its own, as resets reach it.
type modeState interface {
	forgetRecord(zone, key string) // the key was reset, here or elsewhere
	synced() bool                  // the mode's view agrees with Redis (async: the last sync succeeded)
	forgetDenials()                // the deny cache the mode keeps (async records hold their zones')
}

// forgetMissed drops every cached denial once the store decides through
// Redis again after resets may have been missed.
func (c *link) forgetMissed() {
	if !c.resets.missed.Load() {
		return
	}
	if c.breaker.closed() && c.mode.synced() && c.resets.missed.CompareAndSwap(true, false) {
		c.logger.Debug("subscribed to resets again; dropping cached denials")
		c.forget("", "", true)
	}
}

func (c *link) resetsChannel() string { return c.opts.KeyPrefix + "resets" }

// OnReset makes l hear of every reset of a key in zone, made by this
// instance or another one sharing the Redis and key_prefix, until the
// returned function is called.
func (c *link) OnReset(zone string, l ResetListener) (remove func()) {
	return listen(&c.resets.mu, c.resets.listeners, zone, &l)
}

// listen adds v to m[zone] under mu until the returned function is called.
func listen[T comparable](mu *sync.Mutex, m map[string][]T, zone string, v T) (remove func()) {
	mu.Lock()
	m[zone] = append(m[zone], v)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		// In place: forget copies the listeners under the lock.
		m[zone] = slices.DeleteFunc(m[zone], func(w T) bool { return w == v })
		if len(m[zone]) == 0 {
			delete(m, zone)
		}
	}
}

// forget makes zone's listeners forget key, or (all) every listener its
// denials.
func (c *link) forget(zone, key string, all bool) {
	if all {
		c.mode.forgetDenials()
	} else {
		c.mode.forgetRecord(zone, key)
	}
	c.resets.mu.Lock()
	var ls []*ResetListener
	for z, zl := range c.resets.listeners {
		if all || z == zone {
			ls = append(ls, zl...)
		}
	}
	c.resets.mu.Unlock()
	for _, l := range ls {
		if all {
			(*l).ForgetDenials()
		} else {
			(*l).Forget(key)
		}
	}
}

// subscribeLoop receives resets on ps until Close closes ps (a blocked
// Receive does not watch its context).
func (c *link) subscribeLoop(ps *redis.PubSub) {
	defer c.wg.Done()
	// An error is remembered by ps: Receive subscribes again.
	_ = ps.Subscribe(c.ctx, c.resetsChannel())
	for {
		msg, err := ps.Receive(c.ctx)
		if err != nil {
			if c.ctx.Err() != nil {
				return
			}
			c.resets.live.Store(false) // what is published until Receive subscribes again is lost
			select {
			case <-time.After(resubscribeEvery):
			case <-c.ctx.Done():
				return
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				// The first one too: resets since the store opened were missed.
				c.resets.subscribed()
				c.resets.missed.Store(true)
				c.forgetMissed()
				c.resets.live.Store(true)
			}
		case *redis.Message:
			if zone, ok := strings.CutPrefix(m.Payload, overridesMovedMsg); ok {
				c.overridesMoved(zone)
				continue
			}
			zone, key, ok := strings.Cut(m.Payload, "\x00")
			if !ok {
				c.logger.Debug("ignoring a malformed reset message", zap.Int("bytes", len(m.Payload)))
				continue
			}
			if c.resets.heardOwn(m.Payload) {
				continue // forgotten before the key was deleted
			}
			c.forget(zone, key, false)
		}
	}
}
