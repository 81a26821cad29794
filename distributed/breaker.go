package distributed

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Breaker tuning: after tripAfter consecutive failures the store stops
// calling Redis for coolDown, then lets one probe through.
const (
	tripAfter = 5
	coolDown  = time.Second
)

const (
	stateClosed  int32 = iota // calls go to Redis
	stateOpen                 // calls fail with ErrUnavailable until retryAt
	stateProbing              // one probe is in flight; other calls fail
)

// breaker stops an outage from costing every request its full timeout. It
// logs once when it opens and once when it closes, never per request.
//
// The closed state, which is the hot path, costs one atomic load per call and
// one atomic store per success after a failure.
type breaker struct {
	state    atomic.Int32
	failures atomic.Int32 // consecutive, while closed

	mu        sync.Mutex
	retryAt   time.Time // when open: the earliest probe
	openSince time.Time // start of the current outage

	logger *zap.Logger
	redis  string // redacted address, for the log lines
}

// allow reports whether a call may go to Redis, and whether it is the probe
// whose result decides between closing and re-opening.
func (b *breaker) allow() (ok, probe bool) {
	if b.state.Load() == stateClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == stateOpen && !time.Now().Before(b.retryAt) {
		b.state.Store(stateProbing)
		return true, true
	}
	return b.state.Load() == stateClosed, false
}

// record feeds the outcome of a call that allow let through. Errors that
// prove Redis answered (a script error, a wrong type) count as successes.
func (b *breaker) record(probe bool, err error) {
	failed := err != nil && unreachable(err)
	if probe && errors.Is(err, context.Canceled) {
		// The probe's caller gave up (or the store is closing): no verdict,
		// so let the next call probe instead.
		b.mu.Lock()
		b.retryAt = time.Now()
		b.state.Store(stateOpen)
		b.mu.Unlock()
		return
	}
	if !probe {
		if b.state.Load() != stateClosed {
			return // a late result from before the outage was detected
		}
		if !failed {
			if b.failures.Load() != 0 {
				b.failures.Store(0)
			}
			return
		}
		if b.failures.Add(1) < tripAfter {
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	switch {
	case probe && !failed:
		b.failures.Store(0)
		b.state.Store(stateClosed)
		b.logger.Info("redis reachable again", zap.String("redis", b.redis),
			zap.Duration("outage", now.Sub(b.openSince)))
	case probe:
		b.retryAt = now.Add(coolDown)
		b.state.Store(stateOpen)
	case b.state.Load() == stateClosed:
		b.openSince = now
		b.retryAt = now.Add(coolDown)
		b.state.Store(stateOpen)
		b.logger.Warn("redis unreachable; zones apply their fail_policy",
			zap.String("redis", b.redis), zap.Error(err))
	}
}

// health reports whether the breaker is closed, and since when it is not.
func (b *breaker) health() (bool, time.Time) {
	if b.state.Load() == stateClosed {
		return true, time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == stateClosed {
		return true, time.Time{}
	}
	return false, b.openSince
}

// unreachable tells failures of Redis (no answer, or an answer saying it
// cannot serve) from errors about the request itself.
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up; says nothing about Redis
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		// OOM (maxmemory with noeviction) and NOPERM (an ACL user
		// missing a command or key pattern) refuse every write until an
		// operator acts: an outage, logged once, not an error per request.
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "NOAUTH", "WRONGPASS", "OOM", "NOPERM"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true
}
