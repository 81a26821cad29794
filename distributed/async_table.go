package distributed

// Async mode's records by zone: a sharded map per zone, capped by max_keys.

import (
	"context"
	"hash/maphash"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
)

// asyncZone holds one zone's records, sharded like zones.Table.
type asyncZone struct {
	name     string
	seed     maphash.Seed
	shards   []asyncShard
	mask     uint64
	shardCap atomic.Int64 // a reload may change max_keys
}

type asyncShard struct {
	mu sync.Mutex
	m  map[string]*record
	q  map[string]*quotaRecord // a quota zone's leases (quota_async.go)
	_  [32]byte                // keep neighbouring shards' locks off one cache line
}

func newAsyncZone(name string, maxKeys int) *asyncZone {
	n := 1
	for n < 64 && n*2*256 <= maxKeys {
		n *= 2
	}
	z := &asyncZone{name: name, seed: maphash.MakeSeed(), shards: make([]asyncShard, n), mask: uint64(n - 1)}
	z.shardCap.Store(int64(max(1, maxKeys/n)))
	for i := range z.shards {
		z.shards[i].m = make(map[string]*record)
		z.shards[i].q = make(map[string]*quotaRecord)
	}
	return z
}

func (z *asyncZone) shard(key string) *asyncShard {
	return &z.shards[maphash.String(z.seed, key)&z.mask]
}

// unlocked runs f, a call for one record, with s unlocked and *inFlight
// set: requests for the record meanwhile wait for it (await).
func (s *asyncShard) unlocked(inFlight *chan struct{}, f func()) {
	w := make(chan struct{})
	*inFlight = w
	s.mu.Unlock()
	f()
	s.mu.Lock()
	*inFlight = nil
	close(w)
}

// await waits, with s unlocked, until the call in flight w ends; ErrTimeout
// when ctx ends first.
func (s *asyncShard) await(ctx context.Context, w chan struct{}) error {
	s.mu.Unlock()
	select {
	case <-w:
	case <-ctx.Done():
	}
	s.mu.Lock()
	if ctx.Err() != nil {
		return ErrTimeout
	}
	return nil
}

// insert adds r for key to a locked shard, making room first when it is
// full: a record with nothing pending goes first (losing it loses at most
// an unused lease: undershoot), else the least pending. The key is cloned
// so the map never pins a request's buffer.
func (z *asyncZone) insert(s *asyncShard, key string, r *record) {
	if int64(len(s.m)) >= z.shardCap.Load() {
		evict(s.m, func(r *record) int64 { return r.pending })
	}
	s.m[strings.Clone(key)] = r
}

// evictionSample is how many records a full shard looks at to make room.
const evictionSample = 16

// evict removes, from a sample of m, the record that costs least to lose
// (the first that costs nothing).
func evict[R any](m map[string]R, cost func(R) int64) {
	victim, least, seen := "", int64(-1), 0
	for k, v := range m {
		if c := cost(v); least < 0 || c < least {
			victim, least = k, c
		}
		if seen++; least == 0 || seen == evictionSample {
			break
		}
	}
	delete(m, victim)
}

// zone returns the records of zone, created on first use; the lookup takes
// no lock and allocates nothing.
func (a *Async) zone(name string) *asyncZone {
	if z := (*a.zones.Load())[name]; z != nil {
		return z
	}
	a.zonesMu.Lock()
	defer a.zonesMu.Unlock()
	old := *a.zones.Load()
	if z := old[name]; z != nil {
		return z
	}
	m := maps.Clone(old)
	maxKeys := a.maxKeys
	if n := a.caps[name]; n > 0 {
		maxKeys = n
	}
	z := newAsyncZone(strings.Clone(name), maxKeys)
	m[z.name] = z
	a.zones.Store(&m)
	return z
}

// SetMaxKeys caps the records the store keeps for zone (its max_keys); a
// zone created before keeps its shards and takes the new cap.
func (a *Async) SetMaxKeys(zone string, maxKeys int) {
	if maxKeys <= 0 {
		return
	}
	a.zonesMu.Lock()
	a.caps[strings.Clone(zone)] = maxKeys
	a.zonesMu.Unlock()
	z := a.zone(zone)
	z.shardCap.Store(int64(max(1, maxKeys/len(z.shards))))
}

// Keys is the number of records the store holds for zone.
func (a *Async) Keys(zone string) int {
	z := (*a.zones.Load())[zone]
	if z == nil {
		return 0
	}
	return z.len()
}

func (z *asyncZone) len() (n int) {
	z.eachShard(func(s *asyncShard) { n += len(s.m) + len(s.q) })
	return n
}

// eachShard calls f with every shard of z, locked.
func (z *asyncZone) eachShard(f func(*asyncShard)) {
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		f(s)
		s.mu.Unlock()
	}
}

// eachShard calls f with every shard of every zone, locked.
func (a *Async) eachShard(f func(*asyncZone, *asyncShard)) {
	for _, z := range *a.zones.Load() {
		z.eachShard(func(s *asyncShard) { f(z, s) })
	}
}
