package challenge

import (
	"sync"
	"sync/atomic"
	"time"
)

// Identities counts the cookie identities in use: those seen within a span
// (the budget's window). It keeps at most MaxIdentities; beyond, new ones
// are not counted until InUse forgets the old ones, so its memory is
// bounded and the count is a lower bound then. Seen costs a map lookup and
// an atomic store for a known identity.
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

// InUse counts the identities seen within span before now and forgets the
// others.
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
