package listener

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

// Zone is one connection zone: events per window per key, or connections of
// a key open at once. Its settings are the rate_limit handler's zone
// settings of the same names, those a connection has.
type Zone struct {
	// The key template: {remote_ip}, the connection's client address (the
	// PROXY protocol's source behind proxy_protocol), alone or in a
	// template (edge-{remote_ip}), or a constant. Required.
	Key string `json:"key,omitempty"`

	// How many connections a key may open per window. Required (except in a
	// concurrency zone).
	MaxEvents int64 `json:"max_events,omitempty"`

	// The window. Required (except in a concurrency zone).
	Window caddy.Duration `json:"window,omitempty"`

	// How many connections a key may open at once. Default: max_events.
	Burst int64 `json:"burst,omitempty"`

	// When the key is an IPv4 address, limit its /ipv4_prefix network
	// instead of the address (e.g. 24).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// When the key is an IPv6 address, limit its /ipv6_prefix network
	// instead of the address (e.g. 64).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// The most keys this zone keeps in memory. Default: 1000000.
	MaxKeys int64 `json:"max_keys,omitempty"`

	// Decide and report, but never refuse.
	DryRun bool `json:"dry_run,omitempty"`

	// Makes this a concurrency zone: at most this many connections of a key
	// open at once, instead of max_events per window (which must then be
	// left out). A connection holds its slot until it closes.
	Concurrency int64 `json:"concurrency,omitempty"`
}

// remoteIPPlaceholder is the one placeholder a connection zone's key knows.
const remoteIPPlaceholder = "{remote_ip}"

// config is the zone's limit as package zones takes it.
func (zc *Zone) config(name string, dryRun bool) zones.Config {
	return zones.Config{Name: name, Concurrency: zc.Concurrency, Events: zc.MaxEvents, Window: time.Duration(zc.Window), Burst: zc.Burst,
		IPv4Prefix: zc.IPv4Prefix, IPv6Prefix: zc.IPv6Prefix, MaxKeys: zc.MaxKeys, DryRun: zc.DryRun || dryRun}
}

// keyProblem says what is wrong with the zone's key template, with the fix.
func (zc *Zone) keyProblem() error {
	switch {
	case zc.Key == "":
		return errors.New("key is missing: add key {remote_ip}")
	case strings.ContainsAny(strings.ReplaceAll(zc.Key, remoteIPPlaceholder, ""), "{}"):
		return fmt.Errorf("key %q: a connection zone's key knows only {remote_ip} (the client's address, or the PROXY protocol's source); "+
			"{client_ip} and other request placeholders are not known before the request: use key {remote_ip}, or put the zone in the rate_limit handler", zc.Key)
	}
	return nil
}

// provision sets up the connection zone name, local to this instance.
func (zc *Zone) provision(ctx caddy.Context, name string, dryRun bool) (*connZone, error) {
	if err := zc.keyProblem(); err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	cfg := zc.config(name, dryRun)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := live.ClaimZone(ctx, cfg, nil, zc.Key, true); err != nil {
		return nil, err
	}
	state, id, fresh, err := live.LoadState(cfg, nil, live.DefaultSweepInterval)
	if err != nil {
		return nil, err
	}
	if fresh {
		live.LogAfresh(ctx.Logger(), id)
	}
	zone, err := zones.New(cfg, state, nil)
	if err != nil {
		live.ReleaseState(id)
		return nil, err
	}
	z := &connZone{
		Zone:    zone,
		key:     zc.Key,
		keyIsIP: zc.Key == remoteIPPlaceholder,
		metrics: live.NewDecisions(connections, name, cfg.DryRun),
		stateID: id,
	}
	live.Register(z.Zone, true, live.ZoneView{})
	return z, nil
}
