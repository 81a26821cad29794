package zones

// Concurrency zones: at most Concurrency requests of a key in flight. A
// local slot is one unit of a per-key counter that exists only while above
// zero (memory bounded by the keys in flight and max_keys: a new key is
// denied until one finishes); a store's slots expire after the lease unless
// renewed.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/internal/keytable"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// DefaultLease is how long a store's slot outlives its holder's last
// renewal, by default.
const DefaultLease = 30 * time.Second

// MinLease is the shortest lease: renewals run every lease/3 and must fit
// in that on a loaded machine.
const MinLease = time.Second

// ConcurrencyRetryAfter is the Retry-After of a concurrency denial: nothing
// says when a request in flight will finish, so clients try again soon.
const ConcurrencyRetryAfter = time.Second

// concurrencyState is a concurrency zone's in-process part, kept across
// reloads (State is pooled by name): requests in flight stay counted. A
// reload that changes max_keys starts a generation of tables, where every
// slot is taken from then on; older slots are released where they were
// taken (Slot.table) and count against the limit until then. An old
// generation only empties, and the sweeper drops it once empty.
type concurrencyState struct {
	gens atomic.Pointer[[]*slotTables] // oldest first; never empty
	mu   sync.Mutex                    // serialises changes of gens
}

// slotTables is one generation's tables of requests in flight per key.
type slotTables struct {
	maxKeys  int
	local    *Table // local mode: requests in flight per key
	fallback *Table // fail_policy local: the same, at this instance's part
}

func newSlotTables(maxKeys int) *slotTables {
	return &slotTables{maxKeys: maxKeys, local: NewTable(maxKeys), fallback: NewTable(maxKeys)}
}

func newConcurrencyState(maxKeys int) *concurrencyState {
	c := new(concurrencyState)
	c.gens.Store(&[]*slotTables{newSlotTables(maxKeys)})
	return c
}

func (c *concurrencyState) current() (*slotTables, []*slotTables) {
	g := *c.gens.Load()
	return g[len(g)-1], g[:len(g)-1]
}

// useMaxKeys starts a generation when max_keys changed.
func (c *concurrencyState) useMaxKeys(maxKeys int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := *c.gens.Load()
	if g[len(g)-1].maxKeys == maxKeys {
		return
	}
	next := append(g[:len(g):len(g)], newSlotTables(maxKeys))
	c.gens.Store(&next)
}

func (c *concurrencyState) sweep(int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := *c.gens.Load()
	keep := make([]*slotTables, 0, len(g))
	for i, t := range g {
		t.local.Shrink()
		t.fallback.Shrink()
		if i == len(g)-1 || t.local.Len()+t.fallback.Len() > 0 {
			keep = append(keep, t)
		}
	}
	if len(keep) < len(g) {
		c.gens.Store(&keep)
	}
}

func (c *concurrencyState) len() int {
	n := 0
	for _, t := range *c.gens.Load() {
		n += t.local.Len() + t.fallback.Len()
	}
	return n
}

// heldBefore is what key holds in the old generations' tables chosen by which.
func heldBefore(old []*slotTables, which func(*slotTables) *Table, key string) int64 {
	var n int64
	for _, t := range old {
		n += which(t).slots(key)
	}
	return n
}

func localTable(t *slotTables) *Table    { return t.local }
func fallbackTable(t *slotTables) *Table { return t.fallback }

// MaxConcurrency is the largest concurrency a zone may have.
const MaxConcurrency = 1 << 30

// IsConcurrency reports whether the zone limits requests in flight.
func (c Config) IsConcurrency() bool { return c.Concurrency > 0 || c.IsAdaptive() }

func (c Config) validateConcurrency() error {
	switch {
	case c.Concurrency > MaxConcurrency:
		return fmt.Errorf("concurrency must be a whole number from 1 to %d", MaxConcurrency)
	case c.Concurrency <= 0:
		return errors.New("lease only applies to concurrency zones: add e.g. concurrency 4, or remove lease")
	case c.Events != 0 || c.Window != 0 || c.Burst != 0 || c.PerRequest:
		return errors.New("concurrency replaces events, window and burst: remove them, or put the rate limit in a zone of its own")
	case c.Lease != 0 && c.Lease < MinLease:
		return fmt.Errorf("lease must be at least %v (renewals run every lease/3)", MinLease)
	}
	return nil
}

// Slot is a slot a request holds in a concurrency zone; the zero Slot holds
// nothing.
type Slot struct {
	zone     *Zone
	table    *Table // the in-process counter it was taken in, if any
	key      string
	id       string       // the store's slot id, if taken in the store
	adaptive *adaptiveKey // adaptive zones: the key's state, and the priority class
	class    int
}

// Held reports whether the slot must be released.
func (s Slot) Held() bool { return s.zone != nil }

// Acquire takes a slot of key for a request about to be served: an allowed
// decision comes with a Slot to Release when it ends.
func (z *Zone) Acquire(ctx context.Context, key string) (Decision, Slot) {
	if z.IsAdaptive() {
		d, s, _ := z.acquireAdaptive(key, MaxClasses, monotime.Now(), nil)
		return d, s
	}
	return z.acquire(ctx, key, z.Concurrency)
}

// acquire is Acquire at limit requests in flight (an override's).
func (z *Zone) acquire(ctx context.Context, key string, limit int64) (Decision, Slot) {
	if z.store == nil {
		return z.acquireIn(localTable, key, limit, SourceLocal, nil)
	}
	id, inUse, err := z.offers.Slots.Acquire(ctx, z.Name, key, limit, cmp.Or(z.Lease, DefaultLease))
	switch {
	case err != nil:
		return z.failSlot(key, err)
	case id == "":
		return slotDenied(SourceStore, nil), Slot{}
	}
	z.state.inFlight.Add(1)
	return Decision{Allowed: true, Remaining: max(0, limit-inUse), Source: SourceStore},
		Slot{zone: z, key: key, id: id}
}

// acquireIn takes a slot in the current generation's table which, at most
// limit per key counting the key's slots in older generations (which only
// empty: this may count a slot released meanwhile, never miss one).
func (z *Zone) acquireIn(which func(*slotTables) *Table, key string, limit int64, src Source, err error) (Decision, Slot) {
	cur, old := z.state.conc.current()
	before := heldBefore(old, which, key)
	t := which(cur)
	inUse, ok := t.acquireSlot(key, limit-before)
	if !ok {
		return slotDenied(src, err), Slot{}
	}
	z.state.inFlight.Add(1)
	return Decision{Allowed: true, Remaining: limit - before - inUse, Source: src, Err: err},
		Slot{zone: z, table: t, key: key}
}

// failSlot applies the fail policy to a slot the store could not give:
// open admits without a slot; local counts the request in the fallback
// table at this instance's part, max(1, ⌊concurrency / N⌋), and releases it
// there, so a store that comes back neither leaks nor double-counts it.
func (z *Zone) failSlot(key string, err error) (Decision, Slot) {
	var slot Slot
	d := z.failPolicy(err, Decision{Remaining: z.Concurrency}, func() Decision {
		part := max(1, z.Concurrency/int64(max(1, z.store.Instances())))
		var d Decision
		d, slot = z.acquireIn(fallbackTable, key, part, SourceFailLocal, err)
		return d
	})
	switch d.Source {
	case SourceFailOpen:
		z.state.inFlight.Add(1)
		slot = Slot{zone: z, key: key}
	case SourceFailClosed:
		d.RetryAfter, d.ResetAfter = ConcurrencyRetryAfter, ConcurrencyRetryAfter
	}
	return d, slot
}

func slotDenied(src Source, err error) Decision {
	return Decision{RetryAfter: ConcurrencyRetryAfter, ResetAfter: ConcurrencyRetryAfter, Source: src, Err: err}
}

// Release gives back a slot without waiting on the store.
func (z *Zone) Release(s Slot) {
	if s.zone == nil {
		return
	}
	switch {
	case s.adaptive != nil:
		z.ReleaseAfter(s, monotime.Now(), -1, false)
		return
	case s.table != nil:
		s.table.releaseSlot(s.key)
	case s.id != "":
		z.offers.Slots.Release(z.Name, s.key, s.id)
	}
	z.state.inFlight.Add(-1)
}

// InFlight is the number of the zone's requests in flight in this process.
func (z *Zone) InFlight() int64 { return z.state.inFlight.Load() }

// SlotsInUse reports the slots key holds (with a store: every instance's).
func (z *Zone) SlotsInUse(ctx context.Context, key string) (int64, error) {
	if z.IsAdaptive() {
		_, n, _ := z.KeyLimit(key)
		return n, nil
	}
	if z.store == nil {
		cur, old := z.state.conc.current()
		return cur.local.slots(key) + heldBefore(old, localTable, key), nil
	}
	return z.offers.Slots.Slots(ctx, z.Name, key)
}

// acquireSlot counts one more request of key if fewer than limit are in
// flight, and returns the count. A new key is refused when its shard is
// full: counts carry information until zero, so none is evicted.
func (t *Table) acquireSlot(key string, limit int64) (int64, bool) {
	var n int64
	taken := false
	room := t.kt.Update(key, 0, func(held int64, _ bool) (int64, keytable.Op) {
		if n = held; held >= limit {
			return 0, keytable.Keep
		}
		n, taken = held+1, true
		return n, keytable.StoreIfRoom
	})
	return n, room && taken // !room: a new key refused
}

func (t *Table) releaseSlot(key string) {
	t.kt.Update(key, 0, func(n int64, _ bool) (int64, keytable.Op) {
		if n > 1 {
			return n - 1, keytable.Store
		}
		return 0, keytable.Delete
	})
}

func (t *Table) slots(key string) int64 {
	n, _ := t.kt.Get(key)
	return n
}
