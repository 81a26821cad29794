package distributed

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Resets reach every instance through Redis pub/sub. Reset deletes the key
// and publishes "<zone>\x00<key>" on <key_prefix>resets; every store is
// subscribed and makes its listeners forget the key (deny cache, fallback
// state, async record). The bound: a reset reaches every instance connected
// to Redis as fast as Redis delivers a message (milliseconds). Pub/sub does
// not keep messages for a subscriber that is away, so a store whose
// subscription dropped (Redis restarted, the connection broke, the
// subscriber fell behind) drops every cached denial once it is subscribed
// again and decides through Redis again (breaker closed, async view
// synced): within a heartbeat (1s) of that. The cache is a shortcut, and
// Redis answers for those keys again; dropping it earlier, while the fail
// policy still decides, would let blocked keys through under open.

// resubscribeEvery is the pause between attempts to subscribe again.
const resubscribeEvery = 250 * time.Millisecond

// ResetListener is what a zone offers to hear of resets made elsewhere.
type ResetListener interface {
	// Forget drops what the instance holds about key.
	Forget(key string)
	// ForgetDenials drops every cached denial (resets may have been
	// missed).
	ForgetDenials()
}

// resets holds a store's listeners by zone.
type resets struct {
	mu        sync.Mutex
	listeners map[string][]*ResetListener
	// record, when set (async mode), drops the store's own record.
	record func(zone, key string)
	// missed: resets may have been missed since the last subscription;
	// cached denials are dropped when the store decides through Redis.
	missed atomic.Bool
	// deciding reports whether the store decides through Redis (set by
	// async mode, which also needs a synced view); default: the breaker
	// is closed.
	deciding func() bool
}

// forgetMissed drops every cached denial if resets may have been missed
// and the store decides through Redis again.
func (s *Store) forgetMissed() {
	if !s.resets.missed.Load() {
		return
	}
	ok, _ := s.breaker.health()
	if ok && s.resets.deciding != nil {
		ok = s.resets.deciding()
	}
	if ok && s.resets.missed.CompareAndSwap(true, false) {
		s.logger.Debug("subscribed to resets again; dropping cached denials")
		s.forget("", "", true)
	}
}

func (s *Store) resetsChannel() string { return s.opts.KeyPrefix + "resets" }

// OnReset makes l hear of every reset of a key in zone, made by this
// instance or another one sharing the Redis and key_prefix, until the
// returned function is called.
func (s *Store) OnReset(zone string, l ResetListener) (remove func()) {
	p := &l
	s.resets.mu.Lock()
	if s.resets.listeners == nil {
		s.resets.listeners = make(map[string][]*ResetListener)
	}
	s.resets.listeners[zone] = append(s.resets.listeners[zone], p)
	s.resets.mu.Unlock()
	return func() {
		s.resets.mu.Lock()
		defer s.resets.mu.Unlock()
		ls := s.resets.listeners[zone]
		for i, q := range ls {
			if q == p {
				s.resets.listeners[zone] = append(ls[:i:i], ls[i+1:]...)
				break
			}
		}
		if len(s.resets.listeners[zone]) == 0 {
			delete(s.resets.listeners, zone)
		}
	}
}

// forget tells the listeners of zone (every zone when all) to forget key.
func (s *Store) forget(zone, key string, all bool) {
	if !all && s.resets.record != nil {
		s.resets.record(zone, key)
	}
	s.resets.mu.Lock()
	var ls []*ResetListener
	for z, zl := range s.resets.listeners {
		if all || z == zone {
			ls = append(ls, zl...)
		}
	}
	s.resets.mu.Unlock()
	for _, l := range ls {
		if all {
			(*l).ForgetDenials()
		} else {
			(*l).Forget(key)
		}
	}
}

// subscribeLoop receives resets on ps until Close, which closes ps (a
// blocked Receive does not watch its context).
func (s *Store) subscribeLoop(ps *redis.PubSub) {
	defer s.wg.Done()
	// An error here is remembered by ps: Receive connects and subscribes
	// again.
	_ = ps.Subscribe(s.ctx, s.resetsChannel())
	for {
		msg, err := ps.Receive(s.ctx)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			// The next Receive reconnects and subscribes again; what
			// was published meanwhile is lost.
			select {
			case <-time.After(resubscribeEvery):
			case <-s.done:
				return
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				// The first subscription too: resets made before it,
				// after the store opened, were not heard.
				s.resets.missed.Store(true)
				s.forgetMissed()
			}
		case *redis.Message:
			zone, key, ok := strings.Cut(m.Payload, "\x00")
			if !ok {
				s.logger.Debug("ignoring a malformed reset message", zap.Int("bytes", len(m.Payload)))
				continue
			}
			s.forget(zone, key, false)
		}
	}
}
