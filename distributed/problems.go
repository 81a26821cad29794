package distributed

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// problemLogEvery is how often a store logs per-key problems: a hostile or
// careless writer can plant many foreign values, and each costs one request
// its decision, but the log gets one line per interval.
const problemLogEvery = 10 * time.Second

// problems records per-key errors Redis reports while it serves (a foreign
// value at a tally key, a script error): the last one for Health-like reporting, and a WARN
// line at most every problemLogEvery. Outages are the breaker's business.
type problems struct {
	logger *zap.Logger

	mu       sync.Mutex
	msg      string
	at       time.Time
	loggedAt time.Time
	skipped  int
}

// note records err when Redis answered with an error about the key (a
// foreign value, a script error); errors that mean Redis cannot serve are
// the breaker's, and a caller giving up or a closed store are nobody's.
func (p *problems) note(zone string, err error) {
	if err == nil || unreachable(err) || errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed) {
		return
	}
	msg := "redis refused a decision for one key; it used the fail_policy"
	if redis.HasErrorPrefix(err, "TALLYFOREIGN") { // a script found, and deleted, a value tally did not write
		msg = "a value tally did not write was at one of its keys; deleted, the key starts fresh and this decision used the fail_policy"
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msg, p.at = "zone "+zone+": "+err.Error(), now
	if !p.loggedAt.IsZero() && now.Sub(p.loggedAt) < problemLogEvery {
		p.skipped++
		return
	}
	p.logger.Warn(msg, zap.String("zone", zone), zap.Error(err), zap.Int("more_since_last_line", p.skipped))
	p.loggedAt, p.skipped = now, 0
}

func (p *problems) last() (string, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.msg, p.at
}
