package ratelimit

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

// openStore checks dist and returns its pooled store (live.OpenStore).
func openStore(dist *Distributed, logger *zap.Logger) (zones.Store, live.Backend, string, error) {
	switch dist.Mode {
	case "", "strict", "async":
	default:
		return nil, live.Backend{}, "", fmt.Errorf("distributed: unknown mode %q: use strict or async", dist.Mode)
	}
	if dist.Redis == nil || len(dist.Redis.Addresses) == 0 {
		return nil, live.Backend{}, "", errors.New("distributed: redis needs at least one address, e.g. redis://127.0.0.1:6379")
	}
	if len(dist.KeyPrefix) > config.MaxKeyPrefix {
		return nil, live.Backend{}, "", fmt.Errorf("distributed: key_prefix is longer than %d bytes: use a shorter one", config.MaxKeyPrefix)
	}
	syncInterval, err := dist.ReconcileInterval(logger)
	if err != nil {
		return nil, live.Backend{}, "", err
	}
	opts, err := redisOptions(dist.Redis, logger)
	if err != nil {
		return nil, live.Backend{}, "", err
	}
	opts.Timeout, opts.KeyPrefix = time.Duration(dist.Timeout), dist.KeyPrefix
	opts.Mode, opts.SyncInterval = dist.Mode, syncInterval
	return live.OpenStore(opts, logger)
}

// redisOptions is the connection part of the store's settings, placeholders
// replaced and addresses checked (the redis block of distributed and of
// its global block).
func redisOptions(r *Redis, logger *zap.Logger) (distributed.Options, error) {
	repl := caddy.NewReplacer()
	opts := distributed.Options{
		Username:       repl.ReplaceAll(r.Username, ""),
		Password:       repl.ReplaceAll(r.Password, ""),
		DB:             r.DB,
		SentinelMaster: repl.ReplaceAll(r.SentinelMaster, ""),
		TLS:            r.TLS,
		TLSCAFile:      repl.ReplaceAll(r.TLSCA, ""),
		TLSCertFile:    repl.ReplaceAll(r.TLSCert, ""),
		TLSKeyFile:     repl.ReplaceAll(r.TLSKey, ""),
	}
	for _, raw := range r.Addresses {
		a := repl.ReplaceAll(raw, "")
		if err := config.CheckAddress(a); err != nil {
			return opts, fmt.Errorf("distributed: redis: %v", err)
		}
		if inlinePassword(raw) && !warnedInlinePassword.Swap(true) {
			logger.Warn("a Redis URL carries its password inline, which Caddy shows in GET /config/, its autosave file and debug logs; " +
				"use a placeholder such as redis://:{env.REDIS_PASSWORD}@host:6379 or the password subdirective with {env.REDIS_PASSWORD}")
		}
		opts.Addresses = append(opts.Addresses, a)
	}
	return opts, nil
}

// inlinePassword reports whether a Redis URL carries a password.
func inlinePassword(a string) bool {
	u, err := url.Parse(a)
	if err != nil || u.User == nil {
		return false
	}
	p, ok := u.User.Password()
	return ok && !strings.Contains(p, "{") // a placeholder is not inline
}

// warnedInlinePassword makes the inline password warning once per process.
var warnedInlinePassword atomic.Bool
