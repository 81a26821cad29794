// Package live holds what lives across config reloads, shared by the
// handler (the root package), the listener wrapper and the admin API: each
// zone definition's state and the pooled Redis stores and Regions
// (states.go); the names each config claims, and the running zones with the
// view the root registers of each, which the admin API reads without
// importing the root (registry.go); local rate zones' snapshots
// (persist.go); runtime overrides (overrides.go); the metric collectors and
// the log sampling rule (metrics.go). It stands above zones and distributed
// and below the modules, and imports Caddy's core, none of its apps.
package live

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/zones"
)

// claims records each loaded config's definition of each zone name (HTTP or
// connection zone), so that one name with two limits in one config is an
// error. A config is told apart by its context's Done channel.
var claims = struct {
	sync.Mutex
	byConfig map[<-chan struct{}]map[string]Claim
}{byConfig: make(map[<-chan struct{}]map[string]Claim)}

// Claim is a zone name's definition in one config.
type Claim struct {
	ID         StateID
	Connection bool   // a connection zone (caddy.listeners.rate_limit)
	Key        string // the key template
}

// Concurrency reports whether the claimed zone is a concurrency zone.
func (c Claim) Concurrency() bool { return c.ID.concurrency }

// ClaimZone claims cfg's name (vars as NewStateID), whose key template is
// key, in the config of ctx (a caddy.Context: done when the config unloads).
func ClaimZone(ctx context.Context, cfg zones.Config, vars any, key string, connection bool) error {
	c := Claim{ID: NewStateID(cfg, vars), Connection: connection, Key: key}
	done := ctx.Done()
	claims.Lock()
	defer claims.Unlock()
	names, ok := claims.byConfig[done]
	if !ok {
		names = make(map[string]Claim)
		claims.byConfig[done] = names
		context.AfterFunc(ctx, func() {
			claims.Lock()
			delete(claims.byConfig, done)
			claims.Unlock()
		})
	}
	prev, ok := names[cfg.Name]
	switch {
	case ok && prev.ID != c.ID && prev.Connection != c.Connection:
		return fmt.Errorf("zone %s is both a connection zone (listener_wrappers rate_limit) and an HTTP zone, with other limits: give one of them another name", cfg.Name)
	case ok && prev.ID != c.ID:
		return fmt.Errorf("zone %s is defined twice with different limits (%s and %s): give one of them another name",
			cfg.Name, prev.ID.limit(), c.ID.limit())
	case ok && prev.Connection != c.Connection:
		// The same definition in both layers shares its state, as two
		// handlers' would; the HTTP zone's claim is kept, for deny_while.
		if !prev.Connection {
			return nil
		}
	}
	names[cfg.Name] = c
	return nil
}

// ClaimedHTTPZone returns the claim of the HTTP zone name in ctx's config,
// when a handler of that config has provisioned it already.
func ClaimedHTTPZone(ctx context.Context, name string) (Claim, bool) {
	claims.Lock()
	defer claims.Unlock()
	c, ok := claims.byConfig[ctx.Done()][name]
	return c, ok && !c.Connection
}

// registry holds, by name, the zones of every loaded config in the order
// registered. A reload provisions the new config (its zones go last) before
// cleaning up the old, and a failed load takes only its own with it: the
// last registration of a name is the running config's.
var registry = struct {
	sync.Mutex
	zones map[string][]*zones.Zone
	regs  map[*zones.Zone]registration
}{zones: make(map[string][]*zones.Zone), regs: make(map[*zones.Zone]registration)}

type registration struct {
	connection bool
	view       ZoneView
}

// ZoneView is what the root registers of an HTTP zone beyond zones.Zone, for
// the admin API and the status handler; a connection zone's is zero.
type ZoneView struct {
	Regional  zones.Store         // the store decisions reach (nil in local mode)
	Shared    *distributed.Shared // a scope global zone's share of it, else nil
	Health    StoreHealth         // the regional store's health, if it tells it
	Overrides *OverrideHolder
	Emit      func(event string, data map[string]any) // the handler's events
	// USD is a usd zone's amounts in dollars (empty in any other zone).
	USD     func(limit, remaining int64, used *int64) adminapi.USDFields
	Handler any // the root's zone handler, which only the root reads back
}

// Register adds z, a listener wrapper's zone when connection.
func Register(z *zones.Zone, connection bool, view ZoneView) {
	registry.Lock()
	registry.zones[z.Name] = append(registry.zones[z.Name], z)
	registry.regs[z] = registration{connection, view}
	registry.Unlock()
}

// View is what z's module registered with it (zero when not registered).
func View(z *zones.Zone) ZoneView {
	registry.Lock()
	defer registry.Unlock()
	return registry.regs[z].view
}

// IsConnection reports whether z is a listener wrapper's zone.
func IsConnection(z *zones.Zone) bool {
	registry.Lock()
	defer registry.Unlock()
	return registry.regs[z].connection
}

// Unregister removes z's registration; with the last of its name, its
// metric series go too.
func Unregister(z *zones.Zone) {
	registry.Lock()
	defer registry.Unlock()
	delete(registry.regs, z)
	regs := registry.zones[z.Name]
	if i := slices.Index(regs, z); i >= 0 {
		regs = slices.Delete(regs, i, i+1)
	}
	if len(regs) > 0 {
		registry.zones[z.Name] = regs
		return
	}
	delete(registry.zones, z.Name)
	dropSeries(z.Name)
}

// Zones is the running zones by name: each name's last registration.
func Zones() map[string]*zones.Zone {
	registry.Lock()
	defer registry.Unlock()
	m := make(map[string]*zones.Zone, len(registry.zones))
	for k, v := range registry.zones {
		m[k] = v[len(v)-1]
	}
	return m
}

// Registered is every registration of name, oldest first.
func Registered(name string) []*zones.Zone {
	registry.Lock()
	defer registry.Unlock()
	return slices.Clone(registry.zones[name])
}

// Lookup is the last registration of name; with httpOnly, the last that is
// not a connection zone.
func Lookup(name string, httpOnly bool) *zones.Zone {
	registry.Lock()
	defer registry.Unlock()
	regs := registry.zones[name]
	for i := len(regs) - 1; i >= 0; i-- {
		if !httpOnly || !registry.regs[regs[i]].connection {
			return regs[i]
		}
	}
	return nil
}

// ZoneInJSON finds the HTTP zone name in routes (the http app's servers'
// routes, not provisioned yet): its key template and whether it is a
// concurrency zone.
func ZoneInJSON(routes any, name string) (key string, concurrency, found bool) {
	var v any
	if raw, err := json.Marshal(routes); err == nil && json.Unmarshal(raw, &v) == nil {
		return findZoneJSON(v, name)
	}
	return "", false, false
}

// findZoneJSON walks a decoded JSON config for a rate_limit handler with the
// zone name, at any depth (subroutes, named routes, error routes).
func findZoneJSON(v any, name string) (key string, concurrency, found bool) {
	children, _ := v.([]any)
	if m, ok := v.(map[string]any); ok {
		if m["handler"] == "rate_limit" {
			if zs, ok := m["rate_limits"].(map[string]any); ok {
				if z, ok := zs[name].(map[string]any); ok {
					key, _ := z["key"].(string)
					n, _ := z["concurrency"].(float64)
					return key, n > 0, true
				}
			}
		}
		children = slices.Collect(maps.Values(m))
	}
	for _, c := range children {
		if key, concurrency, found = findZoneJSON(c, name); found {
			return
		}
	}
	return "", false, false
}
