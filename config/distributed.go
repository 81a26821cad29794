package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
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

	// mholt/caddy-ratelimit's name for how often it reads the shared state,
	// so that its configs load unchanged: in async mode without
	// sync_interval, the larger of read_interval and write_interval is the
	// sync interval; strict mode ignores it (and refuses sync_interval).
	ReadInterval caddy.Duration `json:"read_interval,omitempty"`

	// mholt/caddy-ratelimit's name for how often it writes the shared
	// state; as read_interval.
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`

	// The longest a request waits for Redis before the zone's fail policy
	// decides, for all of a request's zones and handlers together. Default:
	// 50ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Starts every Redis key tally writes. Default: "tally:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// This region's name, one of global's regions: the Redis above is this
	// region's, and zones with scope global share their limit with the
	// other regions through global. Required with global.
	Region string `json:"region,omitempty"`

	// The global store that shares scope global zones' limits between
	// regions (see Global).
	Global *Global `json:"global,omitempty"`
}

// Redis says how to reach Redis. Every field may use global placeholders
// such as {env.REDIS_PASSWORD}.
type Redis struct {
	// host:port or redis:// / rediss:// URLs (which may carry user,
	// password and db). Several addresses are a Redis Cluster, or the
	// Sentinels when sentinel_master is set.
	Addresses []string `json:"addresses,omitempty"`

	// The ACL user to log in as (Redis 6 and later), instead of the default
	// user; overrides a user in the URLs. With Sentinel, the master's user.
	Username string `json:"username,omitempty"`

	// The password to log in with (AUTH); overrides a password in the URLs.
	// Use a placeholder such as {env.REDIS_PASSWORD}: Caddy shows the
	// config, this field included, in GET /config/ and its autosave file.
	// With Sentinel, the master's password.
	Password string `json:"password,omitempty"`

	// The database number (SELECT); overrides one in the URLs. Default: 0,
	// a Cluster's only one.
	DB int `json:"db,omitempty"`

	// The name of the master the Sentinels at addresses watch.
	SentinelMaster string `json:"sentinel_master,omitempty"`
	// Use TLS (implied by rediss:// URLs and by the tls_* files).
	TLS bool `json:"tls,omitempty"`
	// A PEM file of the CAs that sign Redis's certificate, when the system
	// does not trust them.
	TLSCA string `json:"tls_ca,omitempty"`
	// A client certificate (PEM file) for a Redis started with
	// tls-auth-clients; see tls_key.
	TLSCert string `json:"tls_cert,omitempty"`

	// The private key (PEM file) of tls_cert.
	TLSKey string `json:"tls_key,omitempty"`
}

// syncInterval is the async sync interval the settings give (see
// ReadInterval), 0 for the default. Strict mode ignores read_interval and
// write_interval, which mholt's configs carry whatever the mode, saying so
// in the log.
func (dist *Distributed) syncInterval(logger *zap.Logger) (time.Duration, error) {
	if dist.Mode != "async" {
		if dist.SyncInterval != 0 {
			return 0, errors.New("distributed: sync_interval only applies to mode async (strict mode asks Redis on every request): remove it or set mode async")
		}
		if dist.ReadInterval != 0 || dist.WriteInterval != 0 {
			logger.Info("read_interval and write_interval have no effect in strict mode, which asks Redis on every request; with mode async they set the sync interval")
		}
		return 0, nil
	}
	if dist.SyncInterval < 0 || dist.ReadInterval < 0 || dist.WriteInterval < 0 {
		return 0, errors.New("distributed: sync_interval must be a positive duration, e.g. 100ms")
	}
	if dist.SyncInterval != 0 {
		return time.Duration(dist.SyncInterval), nil
	}
	return time.Duration(max(dist.ReadInterval, dist.WriteInterval)), nil
}

// maxKeyPrefix is the longest key_prefix.
const maxKeyPrefix = 128

// checkAddress reports what is wrong with a Redis address (host:port, or a
// redis:// or rediss:// URL) without repeating its password.
func checkAddress(a string) error {
	shown := distributed.Options{Addresses: []string{a}}.Redacted()
	hostport := a
	if scheme, _, ok := strings.Cut(a, "://"); ok {
		if scheme != "redis" && scheme != "rediss" {
			return fmt.Errorf("address %s: scheme %q is not supported: use redis:// or rediss://", shown, scheme)
		}
		u, err := url.Parse(a)
		if err != nil {
			return fmt.Errorf("address %s is not a valid URL", shown)
		}
		if u.Port() == "" && !strings.HasSuffix(u.Host, ":") {
			return nil // the default port, 6379
		}
		hostport = u.Host
	}
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("address %s must be host:port (e.g. 127.0.0.1:6379) or a redis:// URL", shown)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("address %s: port %q must be a number from 1 to 65535", shown, port)
	}
	return nil
}

// Global shares the limits of `scope global` zones between regions, each
// with its own Redis (distributed's): every region enforces its share of
// each key in its own Redis, and one coordinator per region trades shares
// with the others through this store every sync_interval. No request waits
// on it; while it is unreachable every region keeps its last shares, and
// after lease without contact a region falls back to a tenth of its weight.
type Global struct {
	// The global Redis (standalone or Sentinel). Required.
	Redis *Redis `json:"redis,omitempty"`

	// Every region's weight, the same in every region: the shares a key has
	// while no region pushes against it. Required; whole numbers from 1 to
	// 1000000.
	Regions map[string]int64 `json:"regions,omitempty"`

	// How often the region's coordinator syncs with the global store.
	// Default: 1s.
	SyncInterval caddy.Duration `json:"sync_interval,omitempty"`

	// How long a region that cannot reach the global store keeps its
	// shares; the global store reassigns them only after twice this.
	// Default: 5m; at least twice sync_interval.
	Lease caddy.Duration `json:"lease,omitempty"`
}

// unmarshalGlobal reads the global block of distributed (docs/distributed.md).
func unmarshalGlobal(d *caddyfile.Dispenser) (*Global, error) {
	g := new(Global)
	var leaseLine int
	err := Settings{
		"redis":         Set(&g.Redis, unmarshalRedis),
		"regions":       g.unmarshalRegions,
		"sync_interval": Set(&g.SyncInterval, DurationArg),
		"lease": func(d *caddyfile.Dispenser) (err error) {
			leaseLine = d.Line()
			g.Lease, err = DurationArg(d)
			return err
		},
	}.Read(d, "", "unknown subdirective %q: expected redis, regions, sync_interval or lease")
	if err != nil {
		return nil, fmt.Errorf("global: %w", err)
	}
	switch {
	case g.Redis == nil:
		return nil, d.Err("global needs the global Redis: add e.g. redis rediss://global.internal:6380")
	case len(g.Regions) == 0:
		return nil, d.Err("global needs the regions and their weights: add e.g. regions eu:2 us:1")
	}
	sync := cmp.Or(time.Duration(g.SyncInterval), distributed.DefaultGlobalSyncInterval)
	lease := cmp.Or(time.Duration(g.Lease), distributed.DefaultGlobalLease)
	if lease < 2*sync {
		return nil, fmt.Errorf("global: lease %v is shorter than twice sync_interval %v: a region must outlive two syncs without contact; use lease %v or more, at %s:%d", lease, sync, 2*sync, d.File(), cmp.Or(leaseLine, d.Line()))
	}
	return g, nil
}

// unmarshalRegions reads `regions <name>:<weight>...`.
func (g *Global) unmarshalRegions(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.Err("regions needs each region's weight, e.g. regions eu:2 us:1 ap:1")
	}
	g.Regions = map[string]int64{}
	for _, a := range args {
		name, w, ok := strings.Cut(a, ":")
		weight, err := strconv.ParseInt(w, 10, 64)
		switch {
		case !ok || !zones.ValidName(name):
			return d.Errf("regions: %q is not <name>:<weight>: write e.g. eu:2 (names of letters, digits, '_' and '-')", a)
		case err != nil || weight < 1 || weight > 1_000_000:
			return d.Errf("regions: the weight of %s must be a positive whole number (1 to 1000000), e.g. %s:1, not %q", name, name, w)
		}
		if _, dup := g.Regions[name]; dup {
			return d.Errf("regions: %s is listed twice: keep one", name)
		}
		g.Regions[name] = weight
	}
	return nil
}

// StoreOptions checks the setting and returns the store's options, the
// Redis block's placeholders replaced.
func (dist *Distributed) StoreOptions(logger *zap.Logger) (distributed.Options, error) {
	switch dist.Mode {
	case "", "strict", "async":
	default:
		return distributed.Options{}, fmt.Errorf("distributed: unknown mode %q: use strict or async", dist.Mode)
	}
	if dist.Redis == nil || len(dist.Redis.Addresses) == 0 {
		return distributed.Options{}, errors.New("distributed: redis needs at least one address, e.g. redis://127.0.0.1:6379")
	}
	if len(dist.KeyPrefix) > maxKeyPrefix {
		return distributed.Options{}, fmt.Errorf("distributed: key_prefix is longer than %d bytes: use a shorter one", maxKeyPrefix)
	}
	if dist.Timeout < 0 {
		return distributed.Options{}, errors.New("distributed: timeout must be a positive duration, e.g. 50ms (leave it out for the default)")
	}
	syncInterval, err := dist.syncInterval(logger)
	if err != nil {
		return distributed.Options{}, err
	}
	opts, err := dist.Redis.Options(logger)
	if err != nil {
		return distributed.Options{}, err
	}
	opts.Timeout, opts.KeyPrefix = time.Duration(dist.Timeout), dist.KeyPrefix
	opts.Mode, opts.SyncInterval = dist.Mode, syncInterval
	return opts, nil
}

// Options is the connection part of the store's settings, placeholders
// replaced and addresses checked (the redis block of distributed and of its
// global block).
func (r *Redis) Options(logger *zap.Logger) (distributed.Options, error) {
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
		if err := checkAddress(a); err != nil {
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

// RegionOptions is the setting of dist's region.
func (dist *Distributed) RegionOptions(logger *zap.Logger) (distributed.RegionOptions, error) {
	g := dist.Global
	if g.Redis == nil || len(g.Redis.Addresses) == 0 {
		return distributed.RegionOptions{}, errors.New("distributed: global needs its Redis, e.g. redis rediss://global.internal:6380")
	}
	gopts, err := g.Redis.Options(logger)
	if err != nil {
		return distributed.RegionOptions{}, fmt.Errorf("distributed: global: %v", strings.TrimPrefix(err.Error(), "distributed: "))
	}
	gopts.KeyPrefix = dist.KeyPrefix
	opts := distributed.RegionOptions{Region: dist.Region, Global: gopts,
		SyncInterval: time.Duration(g.SyncInterval), Lease: time.Duration(g.Lease)}
	for _, n := range slices.Sorted(maps.Keys(g.Regions)) {
		opts.Regions = append(opts.Regions, distributed.RegionWeight{Name: n, Weight: g.Regions[n]})
	}
	if err := opts.Check(); err != nil {
		return opts, fmt.Errorf("distributed: %v", err)
	}
	return opts, nil
}
