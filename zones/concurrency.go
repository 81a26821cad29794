package zones

// Concurrency zones: at most Concurrency requests of a key in flight at once.
//
// A request takes a slot before it is served and gives it back when the
// handler returns (Zone.Acquire, Zone.Release). In local mode a slot is one
// unit of a per-key counter in the zone's in-flight table; the entry exists
// only while the count is above zero, so memory is bounded by the keys in
// flight (and by max_keys: when that many keys are in flight, a new key is
// denied until one finishes). With a store, slots live in the store (see
// Slots) and expire after the zone's lease unless renewed.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/internal/keytable"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// DefaultLease is how long a slot held in the store outlives the last
// renewal of the instance that took it, when lease is not set.
const DefaultLease = 30 * time.Second

// MinLease is the shortest lease: renewals run every lease/3 and must fit in
// that on a loaded machine.
const MinLease = time.Second

// ConcurrencyRetryAfter is the Retry-After of a concurrency denial: nothing
// says when a request in flight will finish, so clients try again soon.
const ConcurrencyRetryAfter = time.Second

// concurrencyState is the in-process part of a concurrency zone, shared like
// State by every handler that defines the zone, and kept across reloads
// whatever its concurrency or max_keys (the root package pools a
// concurrency zone's State by name): requests still in flight stay counted.
//
// The counts live in generations of tables, one per max_keys: a reload that
// changes max_keys starts a new generation, sized by it, where every slot is
// taken from then on; the slots taken before are released in the table they
// were taken in (Slot.table), and count against the limit until then. An
// old generation only empties, and is dropped once empty (by the sweeper).
type concurrencyState struct {
	gens     atomic.Pointer[[]*slotTables] // oldest first; never empty
	mu       sync.Mutex                    // serialises changes of gens
	inFlight atomic.Int64                  // requests of this zone in flight in this process
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

// current is the generation slots are taken in, and the older ones.
func (c *concurrencyState) current() (*slotTables, []*slotTables) {
	g := *c.gens.Load()
	return g[len(g)-1], g[:len(g)-1]
}

// useMaxKeys makes maxKeys the bound of the keys slots are taken for from
// now on, starting a generation when it changed.
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

// sweep shrinks the tables and drops the old generations left empty.
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

// len is the number of keys the tables hold.
func (c *concurrencyState) len() int {
	n := 0
	for _, t := range *c.gens.Load() {
		n += t.local.Len() + t.fallback.Len()
	}
	return n
}

// heldBefore is what key holds in the old generations' table chosen by
// which: slots taken before max_keys last changed.
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

// IsConcurrency reports whether the zone limits requests in flight rather
// than a rate.
func (c Config) IsConcurrency() bool { return c.Concurrency > 0 || c.IsAdaptive() }

// validateConcurrency is validate for a zone that sets concurrency or lease.
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
	_, err := c.checkKeys()
	return err
}

// LeaseOrDefault is the zone's lease, DefaultLease when not set.
func (c Config) LeaseOrDefault() time.Duration {
	if c.Lease > 0 {
		return c.Lease
	}
	return DefaultLease
}

// Slot is a slot a request holds in a concurrency zone. The zero Slot holds
// nothing; Release on it does nothing.
type Slot struct {
	zone  *Zone
	table *Table // the in-process counter it was taken in, if any
	key   string
	id    string // the store's slot id, if taken in the store
	// adaptive zones: the key's state the slot was taken in, and the
	// request's priority class
	adaptive *adaptiveKey
	class    int
}

// Held reports whether the slot must be released.
func (s Slot) Held() bool { return s.zone != nil }

// Acquire takes a slot of key for a request about to be served. Without a
// store it counts the request in the zone's in-flight table; with one, the
// store holds the slot and the zone's fail policy decides when it cannot.
// An allowed decision comes with a Slot to Release when the request ends.
func (z *Zone) Acquire(ctx context.Context, key string) (Decision, Slot) {
	if z.IsAdaptive() {
		d, s, _ := z.acquireAdaptive(key, MaxClasses, monotime.Now(), nil)
		return d, s
	}
	return z.acquire(ctx, key, z.Concurrency)
}

// acquire is Acquire at limit requests in flight (an override's).
func (z *Zone) acquire(ctx context.Context, key string, limit int64) (Decision, Slot) {
	c := z.state.conc
	if z.store == nil {
		return z.acquireIn(localTable, key, limit, SourceLocal, nil)
	}
	id, inUse, err := z.offers.Slots.Acquire(ctx, z.Name, key, limit, z.LeaseOrDefault())
	switch {
	case err != nil:
		return z.failSlot(key, err)
	case id == "":
		return slotDenied(SourceStore, nil), Slot{}
	}
	c.inFlight.Add(1)
	return Decision{Allowed: true, Remaining: max(0, limit-inUse), Source: SourceStore},
		Slot{zone: z, key: key, id: id}
}

// acquireIn takes a slot in an in-process table (which, of the current
// generation), at most limit per key counting the slots the key still holds
// in older generations.
func (z *Zone) acquireIn(which func(*slotTables) *Table, key string, limit int64, src Source, err error) (Decision, Slot) {
	cur, old := z.state.conc.current()
	// Old generations only empty: this may count a slot released
	// meanwhile, never miss one.
	before := heldBefore(old, which, key)
	t := which(cur)
	inUse, ok := t.acquireSlot(key, limit-before)
	if !ok {
		return slotDenied(src, err), Slot{}
	}
	z.state.conc.inFlight.Add(1)
	return Decision{Allowed: true, Remaining: limit - before - inUse, Source: src, Err: err},
		Slot{zone: z, table: t, key: key}
}

// failSlot applies the zone's fail policy to a slot the store could not
// give: open admits without a slot anywhere, closed denies, local counts the
// request in this instance's fallback table at its part of the limit,
// ⌊concurrency / N⌋ and at least 1 (N = live instances last seen). Slots
// taken in the fallback table are released there, so a store that comes back
// neither leaks nor double-counts them (it does not see them either).
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
		z.state.conc.inFlight.Add(1)
		slot = Slot{zone: z, key: key}
	case SourceFailClosed:
		d.RetryAfter, d.ResetAfter = ConcurrencyRetryAfter, ConcurrencyRetryAfter
	}
	return d, slot
}

func slotDenied(src Source, err error) Decision {
	return Decision{RetryAfter: ConcurrencyRetryAfter, ResetAfter: ConcurrencyRetryAfter, Source: src, Err: err}
}

// Release gives back a slot Acquire returned. It never waits on the store.
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
	z.state.conc.inFlight.Add(-1)
}

// InFlight is the number of this zone's requests in flight in this process.
func (z *Zone) InFlight() int64 {
	if a := z.state.adaptive; a != nil {
		return a.inFlight.Load()
	}
	if z.state.conc == nil {
		return 0
	}
	return z.state.conc.inFlight.Load()
}

// SlotsInUse reports the slots key holds: in the store when the zone has one
// (every instance's), else in this process.
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

// acquireSlot counts one more request in flight for key if fewer than limit
// are, and returns the count after the call. A key not in the table is
// refused when its shard is full: unlike TATs, counts of requests in flight
// carry information until they reach zero, so nothing may be evicted.
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
	if !room { // only a key the table did not hold: none in flight
		return 0, false
	}
	return n, taken
}

// releaseSlot counts one request of key less in flight; the key leaves the
// table at zero.
func (t *Table) releaseSlot(key string) {
	t.kt.Update(key, 0, func(n int64, _ bool) (int64, keytable.Op) {
		if n > 1 {
			return n - 1, keytable.Store
		}
		return 0, keytable.Delete
	})
}

// slots is the count of requests of key in flight.
func (t *Table) slots(key string) int64 {
	n, _ := t.kt.Get(key)
	return n
}
