package zones

import (
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
// key, every key with a prefix, or every IP-shaped key in a CIDR. An
// override is resolved into the plan a request is decided under (or admits
// it without consuming, or denies it) before the zone admits it: a key's
// state is kept across an override change and re-read under the new limit,
// as plans do.
//
// Precedence: an exact key, then the narrowest CIDR (for an IP-shaped key,
// after ipv4_prefix/ipv6_prefix masking), then the longest prefix, then the
// request's plan placeholder, then the zone's own limit.

// MaxOverrides is the most overrides a zone holds.
const MaxOverrides = 10_000

// Override is one override of a zone's limit.
type Override struct {
	ID string
	// Exactly one of Key, Prefix and CIDR says which keys it covers.
	Key    string
	Prefix string
	CIDR   netip.Prefix
	// Exempt: the key is admitted without consuming; Deny: it is denied.
	// Neither: it is decided under Plan.
	Exempt, Deny bool
	Plan         Plan
	// Expires is when the override lapses (Unix ns), 0 for never.
	Expires int64
}

// expired reports whether the override has lapsed at now (Unix ns).
func (o *Override) expired(now int64) bool { return o.Expires != 0 && o.Expires <= now }

// DenyFor is how long a deny override's denial lasts from now (Unix ns):
// until it expires, else DenyRetryAfter.
func (o *Override) DenyFor(now int64) time.Duration {
	if o.Expires == 0 {
		return DenyRetryAfter
	}
	return max(time.Duration(o.Expires-now), time.Second)
}

// DenyRetryAfter is the Retry-After of a deny override without expiry.
const DenyRetryAfter = time.Hour

// ConcurrencyPlan is the plan of a concurrency zone allowing n requests
// in flight per key.
func ConcurrencyPlan(n int64) Plan {
	return Plan{Events: n, Burst: n, limit: algorithms.Limit{EmissionInterval: 1, Burst: n}}
}

// OverrideSet is an immutable set of overrides, indexed for lookups in
// O(1) for keys and O(prefix length) for prefixes and CIDRs: one map
// lookup per prefix length (or CIDR length) present.
type OverrideSet struct {
	all      []*Override
	keys     map[string]*Override
	prefixes map[string]*Override
	prefLens []int // longest first
	cidrs    map[netip.Prefix]*Override
	cidrLens [2][]int // IPv4, IPv6; narrowest (longest) first
}

// ErrOverrideMatch is returned for an override that covers nothing.
var ErrOverrideMatch = errors.New("an override covers exactly one key, prefix or CIDR")

// NewOverrideSet indexes list (nil for an empty one). A later override
// with the same match replaces an earlier one in lookups.
func NewOverrideSet(list []*Override) (*OverrideSet, error) {
	if len(list) == 0 {
		return nil, nil
	}
	s := &OverrideSet{all: slices.Clone(list), keys: map[string]*Override{}, prefixes: map[string]*Override{}, cidrs: map[netip.Prefix]*Override{}}
	for _, o := range list {
		n := 0
		if o.Key != "" {
			n++
			s.keys[o.Key] = o
		}
		if o.Prefix != "" {
			n++
			s.prefixes[o.Prefix] = o
			if !slices.Contains(s.prefLens, len(o.Prefix)) {
				s.prefLens = append(s.prefLens, len(o.Prefix))
			}
		}
		if o.CIDR.IsValid() {
			n++
			p := o.CIDR.Masked()
			s.cidrs[p] = o
			fam := 0
			if p.Addr().Is6() {
				fam = 1
			}
			if !slices.Contains(s.cidrLens[fam], p.Bits()) {
				s.cidrLens[fam] = append(s.cidrLens[fam], p.Bits())
			}
		}
		if n != 1 {
			return nil, ErrOverrideMatch
		}
	}
	desc := func(a, b int) int { return b - a }
	slices.SortFunc(s.prefLens, desc)
	slices.SortFunc(s.cidrLens[0], desc)
	slices.SortFunc(s.cidrLens[1], desc)
	return s, nil
}

// Len is the number of overrides in the set.
func (s *OverrideSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.all)
}

// All is the set's overrides, in the order given.
func (s *OverrideSet) All() []*Override {
	if s == nil {
		return nil
	}
	return s.all
}

// Lookup is the override in force for key at now (Unix ns), by precedence,
// nil when none. An expired override is passed over.
func (s *OverrideSet) Lookup(key string, now int64) *Override { return s.lookup(key, key, now) }

// lookup is Lookup of key, whose prefixes are matched on raw.
func (s *OverrideSet) lookup(key, raw string, now int64) *Override {
	if o := s.keys[key]; o != nil && !o.expired(now) {
		return o
	}
	if len(s.cidrs) > 0 {
		if o := s.lookupCIDR(key, now); o != nil {
			return o
		}
	}
	for _, n := range s.prefLens {
		if n > len(raw) {
			continue
		}
		if o := s.prefixes[raw[:n]]; o != nil && !o.expired(now) {
			return o
		}
	}
	return nil
}

// lookupCIDR is the narrowest CIDR override holding key, an address or a
// masked prefix ("10.1.2.0/24"; only CIDRs as wide or wider cover it).
func (s *OverrideSet) lookupCIDR(key string, now int64) *Override {
	var addr netip.Addr
	bits := -1
	if strings.IndexByte(key, '/') >= 0 {
		p, err := netip.ParsePrefix(key)
		if err != nil {
			return nil
		}
		addr, bits = p.Addr(), p.Bits()
	} else {
		a, err := netip.ParseAddr(key)
		if err != nil {
			return nil
		}
		addr = a
	}
	addr = addr.Unmap()
	fam := 0
	if addr.Is6() {
		fam = 1
	}
	if bits < 0 {
		bits = addr.BitLen()
	}
	for _, n := range s.cidrLens[fam] {
		if n > bits {
			continue
		}
		p, err := addr.Prefix(n)
		if err != nil {
			continue
		}
		if o := s.cidrs[p]; o != nil && !o.expired(now) {
			return o
		}
	}
	return nil
}

// Overrides holds a zone's current override set, swapped whole: a request
// reads it with one atomic load, and a zone with none pays nothing else.
type Overrides struct {
	set atomic.Pointer[OverrideSet]
}

// Load is the current set, nil when empty.
func (o *Overrides) Load() *OverrideSet { return o.set.Load() }

// Store makes s (nil: none) the current set.
func (o *Overrides) Store(s *OverrideSet) {
	if s.Len() == 0 {
		s = nil
	}
	o.set.Store(s)
}

// UseOverrides makes the zone resolve its keys' overrides from o (nil:
// none). It is called once, before the zone decides.
func (z *Zone) UseOverrides(o *Overrides) { z.overrides = o }

// Override is the override in force for key (as stored) now, nil when
// none: one atomic load for a zone without any.
func (z *Zone) Override(key string) *Override { return z.OverrideOf(key, "") }

// OverrideOf is Override of key, stored from raw, the key as built: a
// prefix override of a key stored hashed (longer than MaxKeyLength)
// matches raw, so that prefixes cover long keys too. raw "" is key.
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

// OverrideCount is the number of overrides the zone holds (lapsed ones
// until they are swept).
func (z *Zone) OverrideCount() int {
	if z.overrides == nil {
		return 0
	}
	return z.overrides.set.Load().Len()
}

// OverrideStore is how a store keeps zones' overrides fleet-wide
// (Offers.Overrides). The records are the caller's; the store keeps them
// with a version and a log of changes, so that a change writes one record
// and each instance reads back only what changed since the version it
// holds (OverridesAt): at any number of overrides a change costs each
// instance O(1) store work. A store that lost its data (emptied, evicted,
// expired) says so with a new epoch, and never as "every override was
// removed": the instances then Restore their copies.
type OverrideStore struct {
	// Put stores o (Version unused), replacing the override of its id,
	// and returns its version; ErrTooManyOverrides when the zone holds
	// MaxOverrides already.
	Put func(ctx context.Context, zone string, o StoredOverride) (int64, error)
	// Delete removes the override id; found is false when there was none.
	Delete func(ctx context.Context, zone, id string) (found bool, err error)
	// Read is what changed since at (the zero OverridesAt: everything).
	Read func(ctx context.Context, zone string, at OverridesAt) (OverridesRead, error)
	// Restore writes each of list whose id the store does not hold (an
	// instance's copies of what the store lost, or a zone's overrides
	// carried from another store), and returns how many it wrote.
	Restore func(ctx context.Context, zone string, list []StoredOverride) (int, error)
	// Moved makes moved hear, without blocking (a buffer of 1), of each
	// change of zone's overrides made by any instance, until remove.
	Moved func(zone string, moved chan<- struct{}) (remove func())
}

// StoredOverride is one override as a store holds it.
type StoredOverride struct {
	ID      string
	Expires time.Time // zero: never
	// Version orders the changes of a zone's overrides: of two with the
	// same match the later change is in force.
	Version int64
	Record  []byte // nil in a read: the override was removed
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
	// All: Changes is the whole set (the reader was at another epoch or
	// too far behind), else what changed since, in order.
	All     bool
	Changes []StoredOverride
}

// ErrTooManyOverrides is the error of a Put on a zone that holds
// MaxOverrides already.
var ErrTooManyOverrides = errors.New("the zone holds the most overrides it can")
