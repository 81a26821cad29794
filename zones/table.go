package zones

import (
	"hash/maphash"
	"strings"
	"sync"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Table maps keys to one int64 each: a TAT for the GCRA, or the instant a
// cached denial ends. In both uses an entry whose value is <= now carries no
// information, so the table may drop it at any time: memory is bounded by the
// keys that are active, and by maxKeys in any case.
//
// The table is sharded so that concurrent requests for different keys rarely
// share a lock. The per-request operations on an existing key allocate nothing.
type Table struct {
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	shardCap int
}

type shard struct {
	mu sync.Mutex
	m  map[string]int64
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

// evictionSample is how many entries a full shard looks at to make room.
const evictionSample = 16

// NewTable returns a table that holds at most maxKeys keys (at least 1).
func NewTable(maxKeys int) *Table {
	if maxKeys < 1 {
		maxKeys = 1
	}
	n := 1
	for n < 64 && n*2*256 <= maxKeys {
		n *= 2
	}
	t := &Table{seed: maphash.MakeSeed(), shards: make([]shard, n), mask: uint64(n - 1), shardCap: maxKeys / n}
	for i := range t.shards {
		t.shards[i].m = make(map[string]int64)
	}
	return t
}

func (t *Table) shard(key string) *shard {
	return &t.shards[maphash.String(t.seed, key)&t.mask]
}

// Decide runs one GCRA step for key at now and stores the new TAT when the
// request is allowed.
func (t *Table) Decide(key string, now int64, l algorithms.Limit, cost int64) algorithms.Result {
	s := t.shard(key)
	s.mu.Lock()
	tat, found := s.m[key]
	r := l.Decide(tat, now, cost)
	if r.Allowed {
		if found {
			s.m[key] = r.TAT
		} else {
			t.insert(s, key, r.TAT, now)
		}
	}
	s.mu.Unlock()
	return r
}

// Charge adds cost to key at now whatever the burst (see
// algorithms.Limit.Charge) and reports the key as it stands afterwards.
func (t *Table) Charge(key string, now int64, l algorithms.Limit, cost int64) algorithms.Result {
	s := t.shard(key)
	s.mu.Lock()
	tat, found := s.m[key]
	r := l.Charge(tat, now, cost)
	switch {
	case r.TAT <= now:
		delete(s.m, key)
	case found:
		s.m[key] = r.TAT
	default:
		t.insert(s, key, r.TAT, now)
	}
	s.mu.Unlock()
	return r
}

// Peek reports key's state at now without consuming anything.
func (t *Table) Peek(key string, now int64, l algorithms.Limit) algorithms.Result {
	s := t.shard(key)
	s.mu.Lock()
	tat := s.m[key]
	s.mu.Unlock()
	return l.Peek(tat, now)
}

// Refund gives back cost for key (see algorithms.Limit.Refund).
func (t *Table) Refund(key string, now int64, l algorithms.Limit, cost int64) {
	s := t.shard(key)
	s.mu.Lock()
	if tat, ok := s.m[key]; ok {
		if tat = l.Refund(tat, now, cost); tat <= now {
			delete(s.m, key)
		} else {
			s.m[key] = tat
		}
	}
	s.mu.Unlock()
}

// Get returns key's value when it is still in force (> now).
func (t *Table) Get(key string, now int64) (int64, bool) {
	s := t.shard(key)
	s.mu.Lock()
	v, ok := s.m[key]
	s.mu.Unlock()
	return v, ok && v > now
}

// Set stores value for key.
func (t *Table) Set(key string, value, now int64) {
	s := t.shard(key)
	s.mu.Lock()
	if _, found := s.m[key]; found {
		s.m[key] = value
	} else {
		t.insert(s, key, value, now)
	}
	s.mu.Unlock()
}

// Delete forgets key.
func (t *Table) Delete(key string) {
	s := t.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// Clear forgets every key.
func (t *Table) Clear() {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		clear(s.m)
		s.mu.Unlock()
	}
}

// insert adds a new key to a locked shard, making room first when the shard
// is full: expired entries of a random sample go first; when the sample has
// none, the sampled entry closest to expiry (the one that carries the least
// information) is evicted. The key is cloned so that the table never pins a
// larger buffer the key was cut from.
func (t *Table) insert(s *shard, key string, value, now int64) {
	if len(s.m) >= t.shardCap {
		victim, victimValue, freed, seen := "", int64(0), false, 0
		for k, v := range s.m {
			if v <= now {
				delete(s.m, k)
				freed = true
			} else if victim == "" || v < victimValue {
				victim, victimValue = k, v
			}
			if seen++; seen == evictionSample {
				break
			}
		}
		if !freed {
			delete(s.m, victim)
		}
	}
	s.m[strings.Clone(key)] = value
}

// Sweep deletes every entry whose value is <= now and returns how many keys
// remain.
func (t *Table) Sweep(now int64) int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, v := range s.m {
			if v <= now {
				delete(s.m, k)
			}
		}
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// Len returns the number of keys held, expired ones included.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
