package distributed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// problemLogEvery bounds the log's per-key problems: many planted foreign
// values cost one line per interval.
const problemLogEvery = 10 * time.Second

// problems keeps the last per-key error Redis reported, logged at most
// every problemLogEvery.
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

var routeOnce sync.Once

// RouteClientLogs sends go-redis's log lines (a "failed to dial" per attempt
// during an outage) to logger at DEBUG instead of stderr: the store logs
// each outage once, and a log must not grow a line a second while Redis is
// down. go-redis has one logger per process: the first call wins.
func RouteClientLogs(logger *zap.Logger) {
	routeOnce.Do(func() { redis.SetLogger(clientLog{logger.WithOptions(zap.AddCallerSkip(1))}) })
}

type clientLog struct{ l *zap.Logger }

func (c clientLog) Printf(_ context.Context, format string, v ...any) {
	if ce := c.l.Check(zap.DebugLevel, "go-redis"); ce != nil {
		ce.Write(zap.String("detail", fmt.Sprintf(format, v...)))
	}
}
