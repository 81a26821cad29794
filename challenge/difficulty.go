package challenge

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Pressure sets the difficulty of a network's next challenge between Min and
// Max from its count of recent challenges (halved each HalfLife): a hex digit
// more each time the count is 16 times larger (from 16 on), back to Min when
// it calms. At MaxNetworks networks it forgets them all (back to Min).
type Pressure struct {
	Min, Max int
	mu       sync.Mutex
	nets     map[string]pressure
}

type pressure struct {
	count float64
	at    time.Time
}

// HalfLife is how fast a network's count of challenges decays.
const HalfLife = 30 * time.Second

// MaxNetworks bounds the networks a Pressure remembers.
const MaxNetworks = 100000

// Next counts a challenge issued to network now and returns its difficulty.
func (p *Pressure) Next(network string, now time.Time) int {
	if p.Max <= p.Min {
		return p.Min
	}
	p.mu.Lock()
	if p.nets == nil || len(p.nets) >= MaxNetworks {
		p.nets = make(map[string]pressure)
	}
	e := p.nets[network]
	if !e.at.IsZero() {
		e.count *= math.Exp2(-float64(now.Sub(e.at)) / float64(HalfLife))
	}
	e.count++
	e.at = now
	p.nets[network] = e
	p.mu.Unlock()
	extra := (bits.Len64(uint64(e.count)) - 1) / 4 // log16 of the count
	return min(p.Min+extra, p.Max)
}

// ExpectedHashes is the mean number of hashes a solver tries at difficulty d.
func ExpectedHashes(d int) float64 { return math.Pow(16, float64(d)) }

// Identities counts the cookie identities seen within a span (the budget's
// window), at most MaxIdentities (beyond, a lower bound until InUse forgets old
// ones). Seen costs a map lookup and an atomic store for a known identity.
type Identities struct {
	seen sync.Map // identity → *atomic.Int64, when last seen (Unix ns)
	n    atomic.Int64
}

// MaxIdentities bounds the identities an Identities keeps.
const MaxIdentities = 100000

// Seen notes identity as used now.
func (s *Identities) Seen(identity string, now time.Time) {
	if v, ok := s.seen.Load(identity); ok {
		v.(*atomic.Int64).Store(now.UnixNano())
		return
	}
	if s.n.Load() >= MaxIdentities {
		return
	}
	at := new(atomic.Int64)
	at.Store(now.UnixNano())
	if _, loaded := s.seen.LoadOrStore(identity, at); !loaded {
		s.n.Add(1)
	}
}

// InUse counts the identities seen within span before now, forgetting others.
func (s *Identities) InUse(now time.Time, span time.Duration) int {
	count := 0
	s.seen.Range(func(k, v any) bool {
		if now.UnixNano()-v.(*atomic.Int64).Load() > int64(span) {
			if s.seen.CompareAndDelete(k, v) {
				s.n.Add(-1)
			}
		} else {
			count++
		}
		return true
	})
	return count
}
