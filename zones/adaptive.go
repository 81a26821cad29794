package zones

// Adaptive concurrency zones: the limit per key follows the upstream's
// latency toward the zone's target (algorithms.Adaptive, sampled as
// Zone.ReleaseAfter gives places back), shared by priority classes
// (algorithms.Classes). They are per instance by nature (New drops the
// store): instances in front of one upstream each converge on their share,
// since each sees the latency all of them cause.

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// MaxAdaptiveTarget is the longest latency target: an upstream slower than
// that at its p90 is not protected by counting its requests.
const MaxAdaptiveTarget = time.Minute

// MaxClasses is the most priority classes an adaptive zone may have.
const MaxClasses = 16

// AdaptiveKeyIdle is how long a key with nothing in flight keeps its learned
// limit: longer than a reload or a quiet spell, short enough that keys seen
// once do not pile up.
const AdaptiveKeyIdle = 10 * time.Minute

// IsAdaptive reports whether the zone's concurrency limit follows latency.
func (c Config) IsAdaptive() bool { return c.Adaptive.Target > 0 }

func (c Config) validateAdaptive() error {
	a := c.Adaptive
	switch {
	case c.Concurrency != 0 || c.Lease != 0:
		return errors.New("adaptive replaces concurrency (a fixed limit) and lease: remove them")
	case c.Events != 0 || c.Window != 0 || c.Burst != 0 || c.PerRequest:
		return errors.New("adaptive replaces events, window and burst: remove them, or put the rate limit in a zone of its own")
	case time.Duration(a.Target) > MaxAdaptiveTarget:
		return fmt.Errorf("adaptive latency must be at most %v", MaxAdaptiveTarget)
	case a.Min < 1 || a.Min > MaxConcurrency:
		return fmt.Errorf("adaptive min must be a whole number from 1 to %d", MaxConcurrency)
	case a.Max < a.Min || a.Max > MaxConcurrency:
		return fmt.Errorf("adaptive max must be a whole number from min (%d) to %d", a.Min, MaxConcurrency)
	case c.Classes < 0 || c.Classes > MaxClasses:
		return fmt.Errorf("priority takes at most %d classes", MaxClasses)
	}
	return nil
}

// adaptiveState is an adaptive zone's state, pooled by the zone's name: a
// reload keeps every key's learned limit and requests in flight.
type adaptiveState struct {
	mu       sync.RWMutex
	keys     map[string]*adaptiveKey
	p90      atomic.Int64 // the latest closed window's p90 latency (ns), any key
	unloaded atomic.Int64 // the latest closed window's unloaded latency (ns), any key
	warned   atomic.Bool  // onSlow was called, and no window met the target since
	onSlow   atomic.Pointer[func(time.Duration)]
}

// adaptiveKey is one key's limit and requests in flight, under its mutex.
type adaptiveKey struct {
	mu      sync.Mutex
	ctl     algorithms.Adaptive
	classes algorithms.Classes
	used    int64 // the last admission or release (monotime)
	// Zones with delay: the requests waiting, by class in arrival order,
	// and since when the queue has not been empty.
	waiters    [][]*adaptiveWaiter
	queueSince int64
}

type adaptiveWaiter struct {
	class   int
	granted chan struct{} // buffered: the release that admits it never blocks
}

func newAdaptiveState() *adaptiveState {
	return &adaptiveState{keys: map[string]*adaptiveKey{}}
}

// key is key's state, created at now if max_keys leaves room, else nil.
func (s *adaptiveState) key(c Config, key string, now int64) *adaptiveKey {
	s.mu.RLock()
	k := s.keys[key]
	s.mu.RUnlock()
	if k != nil {
		return k
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k = s.keys[key]; k != nil {
		return k
	}
	if len(s.keys) >= c.maxKeys() {
		return nil
	}
	k = &adaptiveKey{ctl: algorithms.NewAdaptive(c.Adaptive, now), classes: algorithms.NewClasses(max(1, c.Classes), now), used: now}
	s.keys[key] = k
	return k
}

// sweep drops the keys with nothing in flight unused for AdaptiveKeyIdle.
func (s *adaptiveState) sweep(now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, k := range s.keys {
		k.mu.Lock()
		idle := k.classes.InFlight(-1) == 0 && now-k.used > int64(AdaptiveKeyIdle)
		k.mu.Unlock()
		if idle {
			delete(s.keys, name)
		}
	}
}

func (s *adaptiveState) len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.keys)
}

// acquireAdaptive admits a request of key and priority class at now, or
// sheds it (waits, in a zone with delay); either way it counts as demand.
func (z *Zone) acquireAdaptive(key string, class int, now int64, done <-chan struct{}) (Decision, Slot, int64) {
	s := z.state.adaptive
	k := s.key(z.Config, key, now)
	if k == nil {
		return slotDenied(SourceLocal, nil), Slot{}, z.Adaptive.Min
	}
	k.mu.Lock()
	if n := max(1, z.Classes); k.classes.Len() != n {
		k.classes.Resize(n, now) // a reload changed the classes
	}
	k.used = max(k.used, now)
	total := k.classes.InFlight(-1)
	k.ctl.Want(total + 1)
	limit := min(k.ctl.Limit(), z.Adaptive.Max)
	ok, d := k.classes.Admit(class, limit, now), slotDenied(SourceLocal, nil)
	if !ok && z.Delay > 0 && !z.DryRun {
		d, ok = z.wait(k, class, done)
		total = k.classes.InFlight(-1) - 1
	}
	k.mu.Unlock()
	if !ok {
		return d, Slot{}, limit
	}
	z.state.inFlight.Add(1)
	return Decision{Allowed: true, Remaining: max(0, limit-total-1), Source: SourceLocal},
		Slot{zone: z, key: key, adaptive: k, class: class}, limit
}

// wait makes a request of class that found no place in k (mutex held, and
// on return) wait for one while the zone's queue has room: at most delay,
// or the target under a standing queue (not empty for max(target, 100ms)):
// CoDel's idea, a queue that never drains is shed. Without a place, the
// decision: shed, or Gone (the client left).
func (z *Zone) wait(k *adaptiveKey, class int, done <-chan struct{}) (Decision, bool) {
	shed := slotDenied(SourceLocal, nil)
	if !z.takeQueuePlace() {
		shed.QueueFull = true
		return shed, false
	}
	defer z.EndWait()
	now := monotime.Now()
	bound := z.Delay
	if k.queueSince != 0 && now-k.queueSince >= max(z.Adaptive.Target, algorithms.AdaptiveMinWindow) {
		bound = min(bound, time.Duration(z.Adaptive.Target))
	}
	class = min(max(class, 0), k.classes.Len()-1)
	w := &adaptiveWaiter{class: class, granted: make(chan struct{}, 1)}
	for len(k.waiters) < k.classes.Len() {
		k.waiters = append(k.waiters, nil)
	}
	k.waiters[class] = append(k.waiters[class], w)
	if k.queueSince == 0 {
		k.queueSince = now
	}
	k.mu.Unlock()
	t := time.NewTimer(bound)
	var gone bool
	select {
	case <-w.granted:
	case <-t.C:
	case <-done:
		gone = true
	}
	t.Stop()
	k.mu.Lock()
	if !k.dequeue(w) { // granted, maybe meanwhile: it holds a place
		if !gone {
			return Decision{}, true
		}
		k.classes.Done(class, monotime.Now())
		k.handOff(min(k.ctl.Limit(), z.Adaptive.Max), monotime.Now())
	}
	shed.Gone = gone
	return shed, false
}

// takeQueuePlace takes a place in the zone's queue if it has room, never
// past it even for a moment (EndWait gives it back).
func (z *Zone) takeQueuePlace() bool {
	for w, limit := &z.state.waiting, z.QueueSize(); ; {
		n := w.Load()
		if n >= limit {
			return false
		}
		if w.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// dequeue takes w out of k's waiters: false when it was granted a place.
func (k *adaptiveKey) dequeue(w *adaptiveWaiter) bool {
	q := k.waiters[w.class]
	i := slices.Index(q, w)
	if i < 0 {
		return false
	}
	k.waiters[w.class] = slices.Delete(q, i, i+1)
	k.noteEmpty()
	return true
}

// handOff gives the places free under limit to the waiters, highest class
// first, each class in arrival order.
func (k *adaptiveKey) handOff(limit, now int64) {
	for c := range k.waiters {
		for len(k.waiters[c]) > 0 && k.classes.Admit(c, limit, now) {
			w := k.waiters[c][0]
			k.waiters[c][0] = nil
			k.waiters[c] = k.waiters[c][1:]
			w.granted <- struct{}{}
		}
		if len(k.waiters[c]) > 0 {
			break // a lower class does not pass a higher one waiting
		}
	}
	k.noteEmpty()
}

func (k *adaptiveKey) noteEmpty() {
	for _, q := range k.waiters {
		if len(q) > 0 {
			return
		}
	}
	k.queueSince = 0
}

// ReleaseAfter gives back a slot as Release does; an adaptive zone samples
// latency (upstream call start to response headers). A negative latency is
// no sample (the client left); a failed request (a 5xx, a proxy error, a
// timeout) is a sample of overload whatever its latency.
func (z *Zone) ReleaseAfter(s Slot, now int64, latency time.Duration, failed bool) {
	k := s.adaptive
	if k == nil {
		z.Release(s)
		return
	}
	st := z.state.adaptive
	k.mu.Lock()
	k.classes.Done(s.class, now)
	k.used = max(k.used, now)
	var unloaded, p90 int64
	if latency >= 0 && k.ctl.Observe(z.Adaptive, now, int64(latency), failed) {
		p90, unloaded = k.ctl.LastP90(), k.ctl.Unloaded()
		st.p90.Store(p90)
		st.unloaded.Store(unloaded)
	}
	if k.queueSince != 0 {
		k.handOff(min(k.ctl.Limit(), z.Adaptive.Max), now)
	}
	k.mu.Unlock()
	z.state.inFlight.Add(-1)
	switch {
	case p90 > 0 && p90 <= z.Adaptive.Target:
		st.warned.Store(false)
	case unloaded > 0 && !st.warned.Swap(true):
		if f := st.onSlow.Load(); f != nil {
			(*f)(time.Duration(unloaded))
		}
	}
}

// OnSlowUpstream makes f called with the upstream's unloaded latency when it
// is above the target, once until a window meets the target again.
func (z *Zone) OnSlowUpstream(f func(unloaded time.Duration)) {
	if s := z.state.adaptive; s != nil {
		s.onSlow.Store(&f)
	}
}

// AdaptiveUnloaded is the upstream's unloaded latency learned at the latest
// window, any key, when it is above the target; else 0.
func (z *Zone) AdaptiveUnloaded() time.Duration {
	if s := z.state.adaptive; s != nil {
		return time.Duration(s.unloaded.Load())
	}
	return 0
}

// AdaptiveLimit is the sum of the zone's keys' current limits and the p90
// latency of the latest window closed; 0, 0 for another kind of zone.
func (z *Zone) AdaptiveLimit() (limit int64, p90 time.Duration) {
	s := z.state.adaptive
	if s == nil {
		return 0, 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, k := range s.keys {
		k.mu.Lock()
		limit += min(k.ctl.Limit(), z.Adaptive.Max)
		k.mu.Unlock()
	}
	return limit, time.Duration(s.p90.Load())
}

// limitOf is an adaptive zone's limit for key now (min for a new key).
func (z *Zone) limitOf(key string) int64 {
	if l, _, ok := z.KeyLimit(key); ok {
		return l
	}
	return z.Adaptive.Min
}

// KeyLimit is key's adaptive limit and requests in flight, if the zone
// holds state for it.
func (z *Zone) KeyLimit(key string) (limit, inFlight int64, ok bool) {
	s := z.state.adaptive
	if s == nil {
		return 0, 0, false
	}
	s.mu.RLock()
	k := s.keys[key]
	s.mu.RUnlock()
	if k == nil {
		return 0, 0, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return min(k.ctl.Limit(), z.Adaptive.Max), k.classes.InFlight(-1), true
}
