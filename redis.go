package ratelimit

import (
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

// openStore checks dist and returns its pooled store (live.OpenStore).
func openStore(dist *Distributed, logger *zap.Logger) (zones.Store, live.Backend, string, error) {
	opts, err := dist.StoreOptions(logger)
	if err != nil {
		return nil, live.Backend{}, "", err
	}
	return live.OpenStore(opts, logger)
}
