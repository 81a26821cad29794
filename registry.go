package ratelimit

// The process's tables of zones, which outlive any one handler: the state
// each zone definition keeps across config reloads (states), the one
// definition a zone name may have in a config (claims), and the zones of the
// running config that the admin API and the metrics read (registry).

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tally/ratelimit/zones"
)

// states holds every zone's in-process state, shared by handlers that define
// the zone the same way and kept across config reloads (the new config takes
// its references before the old one lets go of its own).
var states = caddy.NewUsagePool()

// stateID identifies a zone definition: handlers with the same one share
// state, the same name with another one in one config is an error, and a
// changed limit starts from a fresh state rather than reinterpreting old
// TATs under new limits.
type stateID struct {
	name                  string
	events, window, burst int64
	maxKeys               int64
	vars                  planVars
}

func newStateID(cfg zones.Config, vars planVars) stateID {
	return stateID{cfg.Name, cfg.Events, int64(cfg.Window), cfg.Limit().Burst, cfg.MaxKeys, vars}
}

func loadState(cfg zones.Config, vars planVars, sweep time.Duration) (*zones.State, stateID, error) {
	id := newStateID(cfg, vars)
	v, _, err := states.LoadOrNew(id, func() (caddy.Destructor, error) {
		return zones.NewState(cfg, sweep), nil
	})
	if err != nil {
		return nil, id, err
	}
	return v.(*zones.State), id, nil
}

// claims records, for each loaded config, which definition each zone name
// has, so that one name with two different limits in one config is an error.
// A config is told apart by its context's Done channel, which every module
// of that config shares.
var claims = struct {
	sync.Mutex
	byConfig map[<-chan struct{}]map[string]stateID
}{byConfig: make(map[<-chan struct{}]map[string]stateID)}

func claimZoneName(ctx caddy.Context, cfg zones.Config, vars planVars) error {
	done := ctx.Done()
	claims.Lock()
	defer claims.Unlock()
	names, ok := claims.byConfig[done]
	if !ok {
		names = make(map[string]stateID)
		claims.byConfig[done] = names
		context.AfterFunc(ctx, func() {
			claims.Lock()
			delete(claims.byConfig, done)
			claims.Unlock()
		})
	}
	id := newStateID(cfg, vars)
	if prev, ok := names[cfg.Name]; ok && prev != id {
		return fmt.Errorf("zone %s is defined twice with different limits (%d per %v and %d per %v): give one of them another name",
			cfg.Name, prev.events, time.Duration(prev.window), cfg.Events, cfg.Window)
	}
	names[cfg.Name] = id
	return nil
}

// registry holds, by name, the zones of every loaded config, for the admin
// API and the keys metric. A name maps to its registrations in the order they
// were made; the last one is shown. A reload provisions the new config (its
// zones go last) before it cleans up the old one; a load that fails is
// cleaned up instead, taking only its own registrations with it. Either way
// what is shown is the running config's zones, through failed loads and
// handlers whose provisioning failed half-way.
var registry = struct {
	sync.Mutex
	zones map[string][]*zones.Zone
}{zones: make(map[string][]*zones.Zone)}

func registerZone(z *zones.Zone) {
	registry.Lock()
	registry.zones[z.Name] = append(registry.zones[z.Name], z)
	registry.Unlock()
}

// unregisterZone removes z's registration. When it was the last one of its
// name, no config defines the zone any more and its metric series go too.
func unregisterZone(z *zones.Zone) {
	registry.Lock()
	defer registry.Unlock()
	regs := registry.zones[z.Name]
	if i := slices.Index(regs, z); i >= 0 {
		regs = slices.Delete(regs, i, i+1)
	}
	if len(regs) > 0 {
		registry.zones[z.Name] = regs
		return
	}
	delete(registry.zones, z.Name)
	dropZoneSeries(z.Name)
}

func liveZones() map[string]*zones.Zone {
	registry.Lock()
	defer registry.Unlock()
	m := make(map[string]*zones.Zone, len(registry.zones))
	for k, v := range registry.zones {
		m[k] = v[len(v)-1]
	}
	return m
}

func lookupZone(name string) *zones.Zone {
	registry.Lock()
	defer registry.Unlock()
	if regs := registry.zones[name]; len(regs) > 0 {
		return regs[len(regs)-1]
	}
	return nil
}
