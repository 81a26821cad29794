package zones

import (
	"cmp"
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Overrides: an operator's runtime exceptions to a zone's limit, for one
// key, a key prefix or the IP-shaped keys in a CIDR: a plan to decide under
// (the key's state is kept and re-read under it), or exempt, or deny.
// Precedence: an exact key, the narrowest CIDR (after ipv4_prefix/ipv6_prefix
// masking), the longest prefix, the request's plan placeholder, the zone's.

// MaxOverrides is the most overrides a zone holds.
const MaxOverrides = 10_000

// Override is one override of a zone's limit.
type Override struct {
	ID string
	// Exactly one of Key, Prefix and CIDR says which keys it covers.
	Key     string
	Prefix  string
	CIDR    netip.Prefix
	Exempt  bool  // the key is admitted without consuming
	Deny    bool  // the key is denied
	Plan    Plan  // neither exempt nor deny: the limit the key is decided under
	Expires int64 // when the override lapses (Unix ns), 0 for never
}

func (o *Override) expired(now int64) bool { return o.Expires != 0 && o.Expires <= now }

// DenyRetryAfter is the Retry-After of a deny override without expiry.
const DenyRetryAfter = time.Hour

// ConcurrencyPlan is the plan of n requests in flight per key.
func ConcurrencyPlan(n int64) Plan {
	return Plan{Events: n, Burst: n, limit: algorithms.Limit{EmissionInterval: 1, Burst: n}}
}

// OverrideSet is an immutable set of overrides, read with one atomic load. A
// change makes a new set sharing all but O(log N) of the old one's nodes; a
// lookup costs one trie walk for the key, one per CIDR length present and
// one per prefix length present, without allocating.
type OverrideSet struct {
	n        int
	ids      *trie[string, placed]
	keys     *trie[string, []placed] // each sorted by change, latest last
	prefixes *trie[string, []placed]
	cidrs    *trie[netip.Prefix, []placed]
	prefLens []lenCount    // longest first
	cidrLens [2][]lenCount // by Is6: IPv4, IPv6; narrowest (longest) first
}

type placed struct {
	version int64
	o       *Override
}

type lenCount struct{ n, count int }

// ErrOverrideMatch is returned for an override that covers nothing.
var ErrOverrideMatch = errors.New("an override covers exactly one key, prefix or CIDR")

// NewOverrideSet indexes list (nil: empty), in the order of its changes.
func NewOverrideSet(list []*Override) (*OverrideSet, error) {
	var s *OverrideSet
	for i, o := range list {
		var err error
		if s, err = s.With(o, int64(i)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// With is the set with o in place of the override of its id, at the change
// version: of the overrides with one match, the latest version's (then the
// greatest id's) is in force. s is unchanged.
func (s *OverrideSet) With(o *Override, version int64) (*OverrideSet, error) {
	if n := btoi(o.Key != "") + btoi(o.Prefix != "") + btoi(o.CIDR.IsValid()); n != 1 {
		return nil, ErrOverrideMatch
	}
	s = s.Without(o.ID)
	c := OverrideSet{}
	if s != nil {
		c = *s
	}
	p := placed{version, o}
	c.ids = c.ids.set(0, hashString(o.ID), o.ID, &p)
	c.n++
	c.edit(o, func(list []placed) []placed { return addPlaced(list, p) })
	return &c, nil
}

// Without is the set without the override id (nil when none is left).
func (s *OverrideSet) Without(id string) *OverrideSet {
	if s == nil {
		return nil
	}
	hid := hashString(id)
	p, ok := s.ids.lookup(hid, id)
	if !ok {
		return s
	}
	if s.n == 1 {
		return nil
	}
	c := *s
	c.ids = c.ids.set(0, hid, id, nil)
	c.n--
	c.edit(p.o, func(list []placed) []placed { return dropPlaced(list, id) })
	return &c
}

// edit replaces the list of the overrides with o's match by f of it, and
// counts the match's length in or out when the list fills or empties.
func (c *OverrideSet) edit(o *Override, f func([]placed) []placed) {
	var moved int
	switch {
	case o.Key != "":
		c.keys, _ = change(c.keys, hashString(o.Key), o.Key, f)
	case o.Prefix != "":
		c.prefixes, moved = change(c.prefixes, hashString(o.Prefix), o.Prefix, f)
		c.prefLens = countLen(c.prefLens, len(o.Prefix), moved)
	default:
		m := o.CIDR.Masked()
		c.cidrs, moved = change(c.cidrs, hashPrefix(m), m, f)
		lens := &c.cidrLens[btoi(m.Addr().Is6())]
		*lens = countLen(*lens, m.Bits(), moved)
	}
}

// addPlaced inserts p in list, kept sorted by version, then id.
func addPlaced(list []placed, p placed) []placed {
	i, _ := slices.BinarySearchFunc(list, p, func(a, b placed) int {
		return cmp.Or(cmp.Compare(a.version, b.version), strings.Compare(a.o.ID, b.o.ID))
	})
	return slices.Insert(slices.Clip(list), i, p)
}

func dropPlaced(list []placed, id string) []placed {
	return slices.DeleteFunc(slices.Clone(list), func(p placed) bool { return p.o.ID == id })
}

// countLen is lens (longest first) with the count of n moved by d, and
// without n when none is left.
func countLen(lens []lenCount, n, d int) []lenCount {
	if d == 0 {
		return lens
	}
	i, found := slices.BinarySearchFunc(lens, n, func(l lenCount, n int) int { return cmp.Compare(n, l.n) })
	if !found {
		return slices.Insert(slices.Clip(lens), i, lenCount{n, d})
	}
	out := slices.Clone(lens)
	if out[i].count += d; out[i].count == 0 {
		out = slices.Delete(out, i, i+1)
	}
	return out
}

func (s *OverrideSet) Len() int {
	if s == nil {
		return 0
	}
	return s.n
}

// Lookup is the override in force for key at now (Unix ns), by precedence,
// nil when none; an expired one is passed over.
func (s *OverrideSet) Lookup(key string, now int64) *Override { return s.lookup(key, key, now) }

// latest is the last changed of list in force at now (a lapsed one gives way).
func latest(list []placed, now int64) *Override {
	for i := len(list) - 1; i >= 0; i-- {
		if !list[i].o.expired(now) {
			return list[i].o
		}
	}
	return nil
}

// lookup matches prefixes on raw.
func (s *OverrideSet) lookup(key, raw string, now int64) *Override {
	if s.keys != nil {
		if o := latest(s.keys.get(hashString(key), key), now); o != nil {
			return o
		}
		// An address's override is stored canonical, a request's key as built.
		if strings.IndexByte(key, ':') >= 0 && maybeIP(key) {
			var b [64]byte
			if a, err := netip.ParseAddr(key); err == nil && string(a.Unmap().AppendTo(b[:0])) != key {
				return s.lookup(a.Unmap().String(), raw, now)
			}
		}
	}
	if s.cidrs != nil {
		if o := s.lookupCIDR(key, now); o != nil {
			return o
		}
	}
	for _, l := range s.prefLens {
		if l.n > len(raw) {
			continue
		}
		p := raw[:l.n]
		if o := latest(s.prefixes.get(hashString(p), p), now); o != nil {
			return o
		}
	}
	return nil
}

// maybeIP reports whether key may be an address or a prefix: parsing one
// that is not costs its error's allocation.
func maybeIP(key string) bool { return strings.Trim(key, "0123456789abcdefABCDEF:./") == "" }

// lookupCIDR is the narrowest CIDR override holding key, an address or a
// masked prefix ("10.1.2.0/24"; only CIDRs as wide or wider cover it).
func (s *OverrideSet) lookupCIDR(key string, now int64) *Override {
	if !maybeIP(key) {
		return nil
	}
	var p netip.Prefix
	var err error
	if strings.IndexByte(key, '/') >= 0 {
		p, err = netip.ParsePrefix(key)
	} else {
		var a netip.Addr
		a, err = netip.ParseAddr(key)
		p = netip.PrefixFrom(a, a.Unmap().BitLen())
	}
	if err != nil {
		return nil
	}
	addr, bits := p.Addr().Unmap(), p.Bits()
	for _, l := range s.cidrLens[btoi(addr.Is6())] {
		if l.n > bits {
			continue
		}
		p, err := addr.Prefix(l.n)
		if err != nil {
			continue
		}
		if o := latest(s.cidrs.get(hashPrefix(p), p), now); o != nil {
			return o
		}
	}
	return nil
}

// Overrides holds a zone's current override set, swapped whole (nil when
// empty, for the one atomic load of a zone with none).
type Overrides struct {
	set atomic.Pointer[OverrideSet]
}

func (o *Overrides) Load() *OverrideSet { return o.set.Load() }

func (o *Overrides) Store(s *OverrideSet) {
	if s.Len() == 0 {
		s = nil
	}
	o.set.Store(s)
}

// UseOverrides makes the zone resolve its keys' overrides from o, once,
// before it decides.
func (z *Zone) UseOverrides(o *Overrides) { z.overrides = o }

// Override is the override in force for key (as stored) now.
func (z *Zone) Override(key string) *Override { return z.OverrideOf(key, "") }

// OverrideOf is Override of key, stored from raw, the key as built: prefixes
// match a key stored hashed on raw, so they cover long keys too (raw "": key).
func (z *Zone) OverrideOf(key, raw string) *Override {
	if z.overrides == nil {
		return nil
	}
	s := z.overrides.set.Load()
	if s == nil {
		return nil
	}
	if raw == "" || !strings.HasPrefix(key, HashedKeyPrefix) {
		raw = key
	}
	return s.lookup(key, raw, time.Now().UnixNano())
}

// OverrideCount counts lapsed overrides until they are swept.
func (z *Zone) OverrideCount() int {
	if z.overrides == nil {
		return 0
	}
	return z.overrides.set.Load().Len()
}

// OverrideStore is how a store keeps zones' overrides fleet-wide: the
// caller's records with a version and a log of changes, so a change writes
// one record and each instance reads back only what changed since its
// version (O(1) store work at any number of overrides). A store that lost
// its data says so with a new epoch, never as "every override was removed":
// the instances then Restore their copies.
type OverrideStore struct {
	// Put stores o (Version unused), replacing the override of its id, and
	// returns its version; ErrTooManyOverrides at MaxOverrides.
	Put    func(ctx context.Context, zone string, o StoredOverride) (int64, error)
	Delete func(ctx context.Context, zone, id string) (found bool, err error)
	// Read is what changed since at (the zero OverridesAt: everything).
	Read func(ctx context.Context, zone string, at OverridesAt) (OverridesRead, error)
	// Restore writes each of list whose id the store lacks (copies of what
	// it lost, or overrides carried from another store); it returns how many.
	Restore func(ctx context.Context, zone string, list []StoredOverride) (int, error)
	// Moved makes moved hear, without blocking (a buffer of 1), of each
	// change of zone's overrides by any instance, until remove.
	Moved func(zone string, moved chan<- struct{}) (remove func())
}

// StoredOverride is one override as a store holds it.
type StoredOverride struct {
	ID      string
	Expires time.Time // zero: never
	Version int64     // orders the changes of a zone's overrides
	Record  []byte    // nil in a read: the override was removed
}

// OverridesAt is the point of a zone's overrides an instance has read:
// the store's epoch ("" before the first read) and version.
type OverridesAt struct {
	Epoch   string
	Version int64
}

// OverridesRead is what an OverrideStore's Read found.
type OverridesRead struct {
	At OverridesAt
	// All: Changes is the whole set (the reader was at another epoch or too
	// far behind), else what changed since, in order.
	All     bool
	Changes []StoredOverride
}

// ErrTooManyOverrides: a Put on a zone that holds MaxOverrides already.
var ErrTooManyOverrides = errors.New("the zone holds the most overrides it can")

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// trie is a persistent hash trie: a change copies the nodes on one path (at
// most 13 branches of 32 pointers and a leaf of up to trieLeaf items) and
// shares the rest: readers of the old trie are never disturbed, and a change
// costs O(log N).
type trie[K comparable, V any] struct {
	kids  *[32]*trie[K, V] // a branch; nil: a leaf, of items
	items []trieItem[K, V]
}

type trieItem[K comparable, V any] struct {
	h uint64
	k K
	v V
}

// trieLeaf is the most items a leaf holds before it splits, unless the hash
// is spent.
const trieLeaf = 8

func (t *trie[K, V]) lookup(h uint64, k K) (V, bool) {
	for shift := uint(0); t != nil; shift += 5 {
		if t.kids == nil {
			for i := range t.items {
				if t.items[i].h == h && t.items[i].k == k {
					return t.items[i].v, true
				}
			}
			break
		}
		t = t.kids[(h>>shift)&31]
	}
	var zero V
	return zero, false
}

func (t *trie[K, V]) get(h uint64, k K) V {
	v, _ := t.lookup(h, k)
	return v
}

// change is t with k's list replaced by f of it (without k when empty), and
// how the number of non-empty lists moved.
func change[K comparable](
	t *trie[K, []placed], h uint64, k K, f func([]placed) []placed,
) (*trie[K, []placed], int) {
	old := t.get(h, k)
	list := f(old)
	moved := btoi(len(list) > 0) - btoi(len(old) > 0)
	if len(list) == 0 {
		return t.set(0, h, k, nil), moved
	}
	return t.set(0, h, k, &list), moved
}

// set is t with k's value *v, or without k when v is nil; shift is 0 at
// the root, 5 more a level down.
func (t *trie[K, V]) set(shift uint, h uint64, k K, v *V) *trie[K, V] {
	if t == nil {
		if v == nil {
			return nil
		}
		return &trie[K, V]{items: []trieItem[K, V]{{h, k, *v}}}
	}
	if t.kids != nil {
		i := (h >> shift) & 31
		kid := t.kids[i].set(shift+5, h, k, v)
		if kid == t.kids[i] {
			return t // k was not there to delete
		}
		kids := *t.kids
		kids[i] = kid
		if kids == [32]*trie[K, V]{} {
			return nil
		}
		return &trie[K, V]{kids: &kids}
	}
	i := slices.IndexFunc(t.items, func(x trieItem[K, V]) bool { return x.h == h && x.k == k })
	switch {
	case v == nil && i < 0:
		return t
	case v == nil && len(t.items) == 1:
		return nil
	case v == nil:
		return &trie[K, V]{items: slices.Delete(slices.Clone(t.items), i, i+1)}
	case i >= 0:
		items := slices.Clone(t.items)
		items[i].v = *v
		return &trie[K, V]{items: items}
	}
	items := append(slices.Clone(t.items), trieItem[K, V]{h, k, *v})
	if len(t.items) < trieLeaf || shift >= 64 {
		return &trie[K, V]{items: items}
	}
	b := &trie[K, V]{kids: &[32]*trie[K, V]{}}
	for i := range items {
		b = b.set(shift, items[i].h, items[i].k, &items[i].v)
	}
	return b
}

// FNV-1a, folded so that the trie's first levels see every byte.
const fnvOffset, fnvPrime = 14695981039346656037, 1099511628211

func hashString(s string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h ^ h>>32
}

func hashPrefix(p netip.Prefix) uint64 {
	h := uint64(fnvOffset)
	for _, c := range p.Addr().As16() {
		h = (h ^ uint64(c)) * fnvPrime
	}
	h = (h ^ uint64(p.Bits()+1)) * fnvPrime
	return h ^ h>>32
}
