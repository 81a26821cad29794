package distributed

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// problemLogEvery is how often a store logs per-key problems: many planted
// foreign values cost the log one line per interval.
const problemLogEvery = 10 * time.Second

// problems records per-key errors Redis reports while it serves: the last
// one, and a WARN line at most every problemLogEvery.
type problems struct {
	logger *zap.Logger

	mu       sync.Mutex
	msg      string
	at       time.Time
	loggedAt time.Time
	skipped  int
}

// note records err when Redis answered with an error about the key;
// outages are the breaker's, and a caller giving up is nobody's.
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
