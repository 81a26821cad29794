package zones

import (
	"cmp"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Plan is the limit one request is decided under: the zone's literal
// events, window and burst, or values read from the request. A key's state
// is its TAT, a point in time, so it stays meaningful when its plan
// changes: its debt is re-read under the new emission interval.
type Plan struct {
	Events int64
	Window time.Duration
	Burst  int64 // resolved: Events when the zone gives none
	limit  algorithms.Limit
}

// Bounds every plan stays within, so that no accepted value overflows: B·T
// and a debt of one more burst on top of now stay within int64 ns and, in
// µs, within the 2^53 Lua computes exactly (GCRA saturates beyond).
const (
	MaxEvents = 1 << 40
	MaxSpan   = 100 * 365 * 24 * time.Hour // B·T, the longest a key can be in debt
)

var (
	ErrEvents = errors.New("events must be a whole number from 1 to 2^40")
	ErrWindow = errors.New("window must be a positive duration of at least one microsecond per event")
	ErrBurst  = errors.New("burst must be a whole number from 1 to 2^40")
	ErrSpan   = errors.New("burst × window / events must be at most 100 years")
)

// NewPlan validates a limit as the Caddyfile does literals: events and
// burst in [1, 2^40] (burst 0 = events), at least MinEmissionInterval per
// event, B·T at most MaxSpan.
func NewPlan(events int64, window time.Duration, burst int64) (Plan, error) {
	switch {
	case events < 1 || events > MaxEvents:
		return Plan{}, ErrEvents
	case window <= 0 || window/time.Duration(events) < MinEmissionInterval:
		return Plan{}, ErrWindow
	case burst < 0 || burst > MaxEvents:
		return Plan{}, ErrBurst
	}
	burst = cmp.Or(burst, events)
	l := algorithms.NewLimit(events, int64(window), burst)
	if l.EmissionInterval > int64(MaxSpan)/l.Burst {
		return Plan{}, ErrSpan
	}
	return Plan{Events: events, Window: window, Burst: burst, limit: l}, nil
}

// Limit is the plan's GCRA limit in nanoseconds.
func (p Plan) Limit() algorithms.Limit { return p.limit }

// maxPlans bounds the plans a zone remembers for the admin API; keys under
// further plans show the zone's literal one.
const maxPlans = 4096

// plans remembers the plan each key of a PerRequest zone was last decided
// under (admin API): the key table holds an interned plan's index, packed
// with the expiry so that the entry goes with the key's state.
type plans struct {
	mu    sync.Mutex // serialises additions; lookups take no lock
	index atomic.Pointer[map[Plan]int64]
	list  atomic.Pointer[[]Plan]
	keys  *Table
}

func newPlans(maxKeys int) *plans {
	p := &plans{keys: NewTable(maxKeys)}
	index, list := map[Plan]int64{}, []Plan{}
	p.index.Store(&index)
	p.list.Store(&list)
	return p
}

// intern returns p's index, adding it (copy on write) if there is room.
func (ps *plans) intern(p Plan) (int64, bool) {
	if i, ok := (*ps.index.Load())[p]; ok {
		return i, true
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	old := *ps.index.Load()
	if i, ok := old[p]; ok {
		return i, true
	}
	list := *ps.list.Load()
	if len(list) >= maxPlans {
		return 0, false
	}
	i := int64(len(list))
	index := maps.Clone(old)
	index[p] = i
	next := append(list[:len(list):len(list)], p)
	ps.list.Store(&next) // before the index, so that an index found is in the list
	ps.index.Store(&index)
	return i, true
}

// planBits low bits of a value hold the plan index; the rest is the expiry,
// rounded up to 2^planBits ns (about 4ms).
const planBits = 22

// record notes that key was decided under p, until expires (monotime).
func (ps *plans) record(key string, p Plan, expires, now int64) {
	i, ok := ps.intern(p)
	if !ok {
		return
	}
	ps.keys.Set(key, ((expires>>planBits)+1)<<planBits|i, now)
}

func (ps *plans) last(key string, now int64) (Plan, bool) {
	v, ok := ps.keys.Get(key, now)
	if !ok {
		return Plan{}, false
	}
	list := *ps.list.Load()
	i := v & (1<<planBits - 1)
	if i >= int64(len(list)) {
		return Plan{}, false
	}
	return list[i], true
}
