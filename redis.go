package ratelimit

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// Distributed shares zone state across Caddy instances through Redis.
type Distributed struct {
	// The Redis server, Sentinel set or Cluster. Required.
	Redis *Redis `json:"redis,omitempty"`

	// "strict" (default): every decision is one atomic script in Redis,
	// exact across any number of instances. "async": decide locally and
	// reconcile with Redis every sync_interval.
	Mode string `json:"mode,omitempty"`

	// How often async mode reconciles with Redis. Default: 100ms.
	SyncInterval caddy.Duration `json:"sync_interval,omitempty"`

	// mholt/caddy-ratelimit's names for sync_interval, accepted so that
	// its configs load unchanged.
	ReadInterval  caddy.Duration `json:"read_interval,omitempty"`
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`

	// The longest a request waits for Redis before the zone's fail policy
	// decides. Default: 20ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Starts every Redis key tally writes. Default: "tally:".
	KeyPrefix string `json:"key_prefix,omitempty"`
}

// Redis says how to reach Redis. Every field may use global placeholders
// such as {env.REDIS_PASSWORD}.
type Redis struct {
	// host:port or redis:// / rediss:// URLs (which may carry user,
	// password and db). Several addresses are a Redis Cluster, or the
	// Sentinels when sentinel_master is set.
	Addresses []string `json:"addresses,omitempty"`
	Username  string   `json:"username,omitempty"`
	Password  string   `json:"password,omitempty"`
	DB        int      `json:"db,omitempty"`
	// The name of the master the Sentinels at addresses watch.
	SentinelMaster string `json:"sentinel_master,omitempty"`
	// Use TLS (implied by rediss:// URLs).
	TLS bool `json:"tls,omitempty"`
}

// stores shares one Redis client per distinct setting between all handlers,
// across config reloads; the last handler to let go closes it.
var stores = caddy.NewUsagePool()

// releaseStore lets go of a handler's reference to a pooled store.
func releaseStore(poolKey string) { _, _ = stores.Delete(poolKey) }

// open returns the pooled store for this setting, a *distributed.Store
// (strict) or *distributed.Async, and the key to release it with.
func (dist *Distributed) open(ctx caddy.Context, logger *zap.Logger) (zones.Store, string, error) {
	switch dist.Mode {
	case "", "strict", "async":
	default:
		return nil, "", fmt.Errorf("distributed: unknown mode %q: use strict or async", dist.Mode)
	}
	if dist.Redis == nil || len(dist.Redis.Addresses) == 0 {
		return nil, "", errors.New("distributed: redis needs at least one address, e.g. redis://127.0.0.1:6379")
	}
	if len(dist.KeyPrefix) > 128 {
		return nil, "", errors.New("distributed: key_prefix is longer than 128 bytes")
	}
	repl := caddy.NewReplacer()
	opts := distributed.Options{
		Username:       repl.ReplaceAll(dist.Redis.Username, ""),
		Password:       repl.ReplaceAll(dist.Redis.Password, ""),
		DB:             dist.Redis.DB,
		SentinelMaster: repl.ReplaceAll(dist.Redis.SentinelMaster, ""),
		TLS:            dist.Redis.TLS,
		Timeout:        time.Duration(dist.Timeout),
		KeyPrefix:      dist.KeyPrefix,
		Mode:           dist.Mode,
	}
	if dist.Mode == "async" {
		if dist.SyncInterval < 0 || dist.ReadInterval < 0 || dist.WriteInterval < 0 {
			return nil, "", errors.New("distributed: sync_interval must be a positive duration, e.g. 100ms")
		}
		// read_interval and write_interval are mholt/caddy-ratelimit's
		// names for it; 0 is the default, 100ms.
		opts.SyncInterval = time.Duration(dist.SyncInterval)
		if opts.SyncInterval == 0 {
			opts.SyncInterval = time.Duration(max(dist.ReadInterval, dist.WriteInterval))
		}
	}
	for _, a := range dist.Redis.Addresses {
		opts.Addresses = append(opts.Addresses, repl.ReplaceAll(a, ""))
	}
	distributed.RouteClientLogs(caddy.Log().Named("redis"))
	key := opts.Key()
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		if opts.Mode == "async" {
			return distributed.OpenAsync(opts, logger.Named("redis"))
		}
		return distributed.Open(opts, logger.Named("redis"))
	})
	if err != nil {
		return nil, "", fmt.Errorf("distributed: %v", err)
	}
	return v.(zones.Store), key, nil
}
