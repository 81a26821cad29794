// Package keytable is a bounded, sharded map from string keys to one int64
// each. Every entry is a fixed 32-byte slot in an open-addressing array (the
// value, a 32-bit tag of the key's hash, the key's length, and the key itself
// when it is at most 16 bytes), so finding a short key touches one cache
// line; a longer key's bytes live once in a per-shard, pointer-free arena.
// That is under half a Go map's memory per key, with nothing for the garbage
// collector to scan.
//
// Values mean "in force until": an entry whose value is <= now carries no
// information, so a full shard evicts expired entries first and Sweep drops
// them; a sweep that leaves a shard mostly empty rebuilds it smaller.
//
// Hashes only choose where to look: keys are compared by their bytes, so
// colliding keys never share an entry. Callers bound key length (zones hash
// keys over 256 bytes); one shard's arena holds at most 4 GiB of keys.
package keytable

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"
)

// Table is safe for concurrent use; operations on an existing key allocate nothing.
type Table struct {
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	shardCap int
}

type shard struct {
	mu    sync.Mutex
	slots []slot   // linear probing; nil until a key comes, and once Sweep or Shrink finds none
	keys  []byte   // the bytes of the keys longer than inlineKey
	n     int      // entries held
	dead  int      // arena bytes of keys no longer held
	rng   uint64   // where the next eviction sample starts
	most  int      // the slots a full shard needs: growth stops there
	_     [40]byte // keep neighbouring shards' locks off one cache line
}

// slot is one entry; tag 0 marks an empty slot.
type slot struct {
	value int64
	tag   uint32 // the high half of the key's hash, odd
	n     uint32 // the key's length
	// The key when n <= inlineKey (zero after it), else where its bytes
	// are in the arena, as a little-endian uint32 in the first four bytes.
	key [inlineKey]byte
}

// inlineKey is the longest key a slot holds itself; slotSize is two to a
// cache line.
const (
	inlineKey = 16
	slotSize  = 8 + 4 + 4 + inlineKey
)

// Op is what Update does with a key's entry.
type Op uint8

const (
	Keep  Op = iota // leaves the entry as it was (absent stays absent)
	Store           // sets the value, adding the key if need be; a full shard evicts to make room
	// StoreIfRoom is Store, except that a full shard refuses a new key: for
	// values that must not be evicted.
	StoreIfRoom
	// StoreIfExpired is Store, except that a full shard evicts only sampled
	// entries whose value is <= now, else refuses a new key: for values that
	// outlive their use (a ban), now being the value below which none matters.
	StoreIfExpired
	Delete // forgets the key
)

const (
	// EvictionSample is how many entries a full shard looks at to make room.
	EvictionSample = 16
	minSlots       = 8
	maxLoadOf      = 4 // a shard grows past 3/maxLoadOf full
)

// New returns a table that holds at most maxKeys keys (at least 1).
func New(maxKeys int) *Table {
	maxKeys = max(maxKeys, 1)
	n := 1
	for n < 64 && n*2*256 <= maxKeys {
		n *= 2
	}
	t := &Table{seed: maphash.MakeSeed(), shards: make([]shard, n), mask: uint64(n - 1), shardCap: maxKeys / n}
	for i := range t.shards {
		t.shards[i].rng = uint64(i)*0x9e3779b97f4a7c15 + 1
		t.shards[i].most = max(minSlots, t.shardCap*maxLoadOf/3+1)
	}
	return t
}

func (t *Table) locate(key string) (*shard, uint32) {
	h := maphash.String(t.seed, key)
	return &t.shards[h&t.mask], uint32(h>>32) | 1
}

// Update calls f with key's value (0, false when absent) under its shard's
// lock and does what f returns; false when a StoreIfRoom or StoreIfExpired
// could not add the key.
func (t *Table) Update(key string, now int64, f func(value int64, found bool) (int64, Op)) bool {
	s, tag := t.locate(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.find(tag, key)
	var value int64
	if i >= 0 {
		value = s.slots[i].value
	}
	v, op := f(value, i >= 0)
	switch {
	case op == Keep:
	case op == Delete:
		if i >= 0 {
			s.deleteAt(i)
		}
	case i >= 0:
		s.slots[i].value = v
	case op == StoreIfRoom && s.n >= t.shardCap:
		return false
	case op == StoreIfExpired && s.n >= t.shardCap && !s.evict(now, true):
		return false
	default:
		if s.n >= t.shardCap {
			s.evict(now, false)
		}
		s.insert(tag, key, v)
	}
	return true
}

func (t *Table) Get(key string) (int64, bool) {
	s, tag := t.locate(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.find(tag, key); i >= 0 {
		return s.slots[i].value, true
	}
	return 0, false
}

func (t *Table) Delete(key string) {
	t.Update(key, 0, func(int64, bool) (int64, Op) { return 0, Delete })
}

// Clear forgets every key and gives the memory back.
func (t *Table) Clear() {
	t.eachShard(func(s *shard) int {
		s.slots, s.keys, s.n, s.dead = nil, nil, 0, 0
		return 0
	})
}

// eachShard sums f over the shards, each called under its shard's lock.
func (t *Table) eachShard(f func(s *shard) int) int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += f(s)
		s.mu.Unlock()
	}
	return n
}

// Sweep deletes every entry whose value is <= now and returns how many keys
// remain. A shard left empty gives its memory back; one left less than 1/8
// full is rebuilt at its new size.
func (t *Table) Sweep(now int64) int {
	return t.eachShard(func(s *shard) int {
		for j := 0; j < len(s.slots); {
			if sl := &s.slots[j]; sl.tag != 0 && sl.value <= now {
				s.deleteAt(j) // a later entry may move into j: look again
				continue
			}
			j++
		}
		s.shrink()
		return s.n
	})
}

// Shrink gives memory back as Sweep does, deleting nothing: for tables
// whose values are not times.
func (t *Table) Shrink() {
	t.eachShard(func(s *shard) int {
		s.shrink()
		return 0
	})
}

func (s *shard) shrink() {
	switch {
	case s.n == 0:
		s.slots, s.keys, s.dead = nil, nil, 0
		return
	case len(s.slots) > minSlots && s.n*8 < len(s.slots):
		s.resize(max(minSlots, 2*s.n)) // half full: no growth right away
	}
	if s.dead > 0 && s.dead*2 >= len(s.keys) {
		s.compact(0)
	}
}

// Len returns the number of keys held, expired ones included.
func (t *Table) Len() int { return t.eachShard(func(s *shard) int { return s.n }) }

// Bytes returns the memory the table's entries and keys hold.
func (t *Table) Bytes() int {
	return t.eachShard(func(s *shard) int { return cap(s.slots)*slotSize + cap(s.keys) })
}

// home is where an entry's probe run starts: its tag scaled to the slot
// count (not always a power of two).
func (s *shard) home(tag uint32) int { return int(uint64(tag>>1) * uint64(len(s.slots)) >> 31) }

func (s *shard) next(i int) int {
	if i++; i == len(s.slots) {
		return 0
	}
	return i
}

func (s *shard) keyOf(sl *slot) []byte {
	if sl.n <= inlineKey {
		return sl.key[:sl.n]
	}
	off := binary.LittleEndian.Uint32(sl.key[:4])
	return s.keys[off : off+sl.n]
}

func (s *shard) find(tag uint32, key string) int {
	if s.n == 0 {
		return -1
	}
	for i := s.home(tag); ; i = s.next(i) {
		sl := &s.slots[i]
		if sl.tag == 0 {
			return -1
		}
		if sl.tag == tag && int(sl.n) == len(key) && string(s.keyOf(sl)) == key {
			return i
		}
	}
}

// insert adds a key the shard does not hold, copying its bytes into its slot
// or the arena (never pinning the buffer the key was cut from).
func (s *shard) insert(tag uint32, key string, value int64) {
	if (s.n+1)*maxLoadOf > len(s.slots)*3 {
		// Doubling, but never past what a full shard needs (3/4 used).
		size := max(minSlots, 2*len(s.slots))
		if size > s.most && s.most > len(s.slots) {
			size = s.most
		}
		s.resize(size)
	}
	e := slot{value: value, tag: tag, n: uint32(len(key))}
	if len(key) <= inlineKey {
		copy(e.key[:], key)
	} else {
		if len(s.keys)+len(key) > cap(s.keys) && s.dead > 0 && s.dead*2 >= len(s.keys) {
			s.compact(len(key))
		}
		binary.LittleEndian.PutUint32(e.key[:4], uint32(len(s.keys)))
		s.keys = append(s.keys, key...)
	}
	s.place(e)
	s.n++
}

// place puts e in the first empty slot of its probe run.
func (s *shard) place(e slot) {
	i := s.home(e.tag)
	for s.slots[i].tag != 0 {
		i = s.next(i)
	}
	s.slots[i] = e
}

// deleteAt empties slot i, shifting later entries of its probe run back so
// that lookups never need tombstones.
func (s *shard) deleteAt(i int) {
	if n := s.slots[i].n; n > inlineKey {
		s.dead += int(n)
	}
	s.n--
	for j := i; ; {
		j = s.next(j)
		sl := s.slots[j]
		if sl.tag == 0 {
			break
		}
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j].
		if h := s.home(sl.tag); (i <= j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			s.slots[i] = sl
			i = j
		}
	}
	s.slots[i] = slot{}
	if s.n == 0 { // the arena refills from 0; the slots stay for the next key until Sweep or Shrink
		s.keys, s.dead = s.keys[:0], 0
	}
}

// evict makes room in a full shard: a sample's expired entries, else (unless
// onlyExpired) the sampled entry closest to expiry, which carries the least
// information. It reports whether it made room.
func (s *shard) evict(now int64, onlyExpired bool) bool {
	if s.n == 0 {
		return true
	}
	s.rng ^= s.rng << 13
	s.rng ^= s.rng >> 7
	s.rng ^= s.rng << 17
	var expired [EvictionSample]slot // their keys (or arena offsets) name them
	nExpired, victim, seen := 0, -1, 0
	for i, k := int(s.rng%uint64(len(s.slots))), 0; k < len(s.slots) && seen < EvictionSample; i, k = s.next(i), k+1 {
		sl := &s.slots[i]
		if sl.tag == 0 {
			continue
		}
		seen++
		if sl.value <= now {
			expired[nExpired] = *sl
			nExpired++
		} else if victim < 0 || sl.value < s.slots[victim].value {
			victim = i
		}
	}
	switch {
	case nExpired > 0:
		for _, e := range expired[:nExpired] {
			s.deleteAt(s.slotOf(e))
		}
	case onlyExpired:
		return false
	default:
		s.deleteAt(victim)
	}
	return true
}

// slotOf is where entry e, which may have moved since it was copied, is.
func (s *shard) slotOf(e slot) int {
	i := s.home(e.tag)
	for sl := &s.slots[i]; sl.tag != e.tag || sl.n != e.n || sl.key != e.key; sl = &s.slots[i] {
		i = s.next(i)
	}
	return i
}

// resize rehashes the entries into size slots; tags carry their home, so no
// key is hashed again.
func (s *shard) resize(size int) {
	old := s.slots
	s.slots = make([]slot, size)
	for _, sl := range old {
		if sl.tag != 0 {
			s.place(sl)
		}
	}
}

// compact copies the live keys into a new arena with room for extra more
// bytes, dropping the bytes of deleted keys.
func (s *shard) compact(extra int) {
	live := len(s.keys) - s.dead
	keys := make([]byte, 0, live+live/4+extra)
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.tag == 0 || sl.n <= inlineKey {
			continue
		}
		off := uint32(len(keys))
		keys = append(keys, s.keyOf(sl)...)
		binary.LittleEndian.PutUint32(sl.key[:4], off)
	}
	s.keys, s.dead = keys, 0
}

// CountAbove returns the number of entries whose value is > v.
func (t *Table) CountAbove(v int64) int {
	return t.eachShard(func(s *shard) int {
		n := 0
		for j := range s.slots {
			if sl := &s.slots[j]; sl.tag != 0 && sl.value > v {
				n++
			}
		}
		return n
	})
}

func (t *Table) Shards() int { return len(t.shards) }

// Copy holds entries copied out by CopyShard: entry i's key is Key(i) and its
// value Values[i]. Reused from shard to shard, its buffers grow a few times.
type Copy struct {
	Keys   []byte
	Ends   []int
	Values []int64
}

func (c *Copy) Reset() { c.Keys, c.Ends, c.Values = c.Keys[:0], c.Ends[:0], c.Values[:0] }

func (c *Copy) Len() int { return len(c.Values) }

// Key returns entry i's key bytes (valid until c is reset).
func (c *Copy) Key(i int) []byte {
	from := 0
	if i > 0 {
		from = c.Ends[i-1]
	}
	return c.Keys[from:c.Ends[i]]
}

// CopyShard appends to c every entry of shard i whose value is > after. c is
// grown to the shard's size before the lock is taken (under it only if the
// shard grew meanwhile), so a snapshot stalls a shard's requests no longer
// than a copy of its slots.
func (t *Table) CopyShard(i int, after int64, c *Copy) {
	s := &t.shards[i]
	s.mu.Lock()
	n, arena := s.n, len(s.keys)
	s.mu.Unlock()
	c.reserve(n, n*inlineKey+arena)

	s.mu.Lock()
	defer s.mu.Unlock()
	c.reserve(s.n, s.n*inlineKey+len(s.keys))
	for j := range s.slots {
		sl := &s.slots[j]
		if sl.tag == 0 || sl.value <= after {
			continue
		}
		c.Keys = append(c.Keys, s.keyOf(sl)...)
		c.Ends = append(c.Ends, len(c.Keys))
		c.Values = append(c.Values, sl.value)
	}
}

// reserve makes room in c for n more entries of keys bytes in all.
func (c *Copy) reserve(n, keys int) {
	c.Keys = slices.Grow(c.Keys, keys)
	c.Ends = slices.Grow(c.Ends, n)
	c.Values = slices.Grow(c.Values, n)
}
