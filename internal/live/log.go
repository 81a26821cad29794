package live

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The lines a request or a connection can log are sampled by one rule, so
// that a flood of requests cannot flood the log: in each second, for each
// handler (or wrapper) and each line, the first logFirst lines, then one in
// logThereafter. Lines no request causes (provisioning, and Redis outages,
// which package distributed logs once per outage) are not sampled, nor the
// DEBUG line of a refund that failed.
// It is zap's sampler's rule for one atomic add per line: zap's sampler
// reads the clock and hashes the message of every entry it drops.
const (
	logFirst      = 10
	logThereafter = 1000
)

// Sampler samples one line by the rule above.
type Sampler struct {
	second atomic.Int64 // monotime seconds of the current second
	count  atomic.Int64 // events in it
}

// allow reports whether the event at now (monotime) is logged.
func (s *Sampler) allow(now int64) bool {
	sec := now / int64(time.Second)
	if old := s.second.Load(); old != sec && s.second.CompareAndSwap(old, sec) {
		s.count.Store(0)
	}
	n := s.count.Add(1)
	return n <= logFirst || (n-logFirst)%logThereafter == 0
}

// Check is logger.Check(lvl, msg) for a line the sampler lets through, nil
// otherwise; a level the logger leaves out is not counted.
func (s *Sampler) Check(logger *zap.Logger, now int64, lvl zapcore.Level, msg string) *zapcore.CheckedEntry {
	if !logger.Core().Enabled(lvl) || !s.allow(now) {
		return nil
	}
	return logger.Check(lvl, msg)
}
