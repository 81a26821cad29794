package ratelimit

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/internal/live"
)

// logSampler samples one of the handler's lines by live.Sampler's rule
// (per second, the first 10, then one in 1000).
type logSampler struct{ live.Sampler }

func (s *logSampler) check(logger *zap.Logger, now int64, lvl zapcore.Level, msg string) *zapcore.CheckedEntry {
	return s.Check(logger, now, lvl, msg)
}

// logSamplers are a handler's samplers, one per line; its zones share them.
type logSamplers struct {
	denial, dryRunDenial logSampler
	storeError           logSampler
	planFallback         logSampler
	costFallback         logSampler
	costOverBurst        logSampler
	chargeFailure        logSampler
	chargeFallback       logSampler
	ban, dryRunBan       logSampler
}
