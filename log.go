package ratelimit

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The lines a request can log are sampled by one rule, so that a flood of
// requests cannot flood the log: in each second, for each handler and each
// line, the first logFirst lines, then one in logThereafter (the listener
// wrapper's lines: for each wrapper and line). They are
//
//	INFO  rate limit exceeded                    a denial (serve.go)
//	INFO  rate limit would deny (dry run)        a dry-run zone's denial (serve.go)
//	DEBUG store unavailable; fail policy applied a decision Redis did not make (zones/zone.go)
//	WARN  per-request limit is empty or invalid; ...  a limit placeholder fell back (plans.go)
//	WARN  request cost is empty or invalid; ...  a cost or charge placeholder fell back (cost.go)
//	WARN  request cost exceeds the zone's burst  a request that can never pass (cost.go)
//	WARN  charge after the response did not reach Redis; ...  (cost.go)
//	INFO  connection refused                     a connection zone's or deny_while's refusal (listener.go)
//	INFO  connection would be refused (dry run)  the same in dry run (listener.go)
//
// Lines no request causes (provisioning, and Redis outages, which package
// distributed logs once per outage) are not sampled, nor the DEBUG line of a
// refund that failed.
//
// It is zap's sampler's rule with those settings, for one atomic add per
// line: zap's sampler reads the clock and hashes the message of every entry
// it drops (in one loop on 2 cores, 77 ns a denial line against 25 ns).
const (
	logFirst      = 10
	logThereafter = 1000
)

// logSampler samples one line by the rule above.
type logSampler struct {
	second atomic.Int64 // monotime seconds of the current second
	count  atomic.Int64 // events in it
}

// logSamplers are a handler's samplers, one per line; its zones share them.
type logSamplers struct {
	denial, dryRunDenial logSampler
	storeError           logSampler
	planFallback         logSampler
	costFallback         logSampler
	costOverBurst        logSampler
	chargeFailure        logSampler
	ban, dryRunBan       logSampler
}

// allow reports whether the event at now (monotime) is logged.
func (s *logSampler) allow(now int64) bool {
	sec := now / int64(time.Second)
	if old := s.second.Load(); old != sec && s.second.CompareAndSwap(old, sec) {
		s.count.Store(0)
	}
	n := s.count.Add(1)
	return n <= logFirst || (n-logFirst)%logThereafter == 0
}

// check is logger.Check(lvl, msg) for a line the sampler lets through, nil
// otherwise; a level the logger leaves out is not counted.
func (s *logSampler) check(logger *zap.Logger, now int64, lvl zapcore.Level, msg string) *zapcore.CheckedEntry {
	if !logger.Core().Enabled(lvl) || !s.allow(now) {
		return nil
	}
	return logger.Check(lvl, msg)
}
