package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// states holds every zone's in-process state, shared by handlers that define
// the zone the same way and kept across config reloads (the new config takes
// its references before the old one lets go of its own).
var states = caddy.NewUsagePool()

// stateID identifies a zone definition: handlers with the same one share
// state, the same name with another one in one config is an error, and a
// changed limit starts from a fresh state rather than reinterpreting old
// TATs under new limits. A concurrency zone is the exception (see pooled).
type stateID struct {
	name                  string
	events, window, burst int64
	maxKeys               int64
	vars                  planVars
	// Quota zones: the period and its time zone (the quota is burst).
	period   algorithms.Period
	timeZone string
	// A concurrency zone (burst is its concurrency), adaptive or not.
	concurrency, adaptive bool
	// Zones with ban: its first and longest length (a zone's ban state
	// lives in its State).
	ban, banMax time.Duration
	// Zones with delay: how long a request may wait, and how many wait
	// at once (the waiting count lives in its State).
	delay time.Duration
	queue int64
}

func newStateID(cfg zones.Config, vars planVars) stateID {
	id := stateID{name: cfg.Name, events: cfg.Events, window: int64(cfg.Window), burst: cfg.Limit().Burst, maxKeys: cfg.MaxKeys, vars: vars,
		concurrency: cfg.IsConcurrency(), adaptive: cfg.IsAdaptive(), ban: cfg.Ban, banMax: cfg.BanMax, delay: cfg.Delay, queue: cfg.Queue}
	if cfg.IsQuota() {
		id.period, id.timeZone = cfg.Period, cfg.Location.String()
	}
	return id
}

// pooled is the key of the definition's state in states. A concurrency
// zone's state is pooled by its name alone: its counts of requests in flight
// mean the same whatever the zone's concurrency or max_keys, and requests
// still running when a reload changes them must go on being counted (issue
// 23: a fresh table let 5 in flight for a limit of 3). The zone's current
// concurrency is checked against them, and its max_keys bounds the keys it
// adds (zones.New).
func (id stateID) pooled() stateID {
	if id.concurrency {
		return stateID{name: id.name, concurrency: true, adaptive: id.adaptive}
	}
	return id
}

// limit describes the definition's limit for people.
func (id stateID) limit() string {
	if id.period != 0 {
		loc, _ := time.LoadLocation(id.timeZone)
		return "a quota of " + quotaLimitText(id.burst, id.period, loc)
	}
	s := fmt.Sprintf("%d per %v", id.events, time.Duration(id.window))
	switch {
	case id.banMax > id.ban:
		s += fmt.Sprintf(" with ban %v %v", id.ban, id.banMax)
	case id.ban > 0:
		s += fmt.Sprintf(" with ban %v", id.ban)
	}
	if id.delay > 0 {
		s += fmt.Sprintf(" with delay %v", id.delay)
		if id.queue > 0 {
			s += fmt.Sprintf(" queue %d", id.queue)
		}
	}
	return s
}

// loadState returns the state of cfg's definition, its key in states, and
// whether it was created for this call (no handler held it: nothing live
// to merge a snapshot with).
func loadState(cfg zones.Config, vars planVars, sweep time.Duration) (*zones.State, stateID, bool, error) {
	id := newStateID(cfg, vars).pooled()
	v, loaded, err := states.LoadOrNew(id, func() (caddy.Destructor, error) {
		return zones.NewState(cfg, sweep), nil
	})
	if err != nil {
		return nil, id, false, err
	}
	return v.(*zones.State), id, !loaded, nil
}

// logAfresh logs, when provision has just created id's state, another
// definition of its zone name whose state a loaded config still holds: the
// definition a reload replaces, whose state does not carry over.
func logAfresh(logger *zap.Logger, id stateID) {
	states.Range(func(k, _ any) bool {
		o, ok := k.(stateID)
		if ok && o.name == id.name && o != id && !o.concurrency {
			logger.Info("zone starts afresh: a reload changed its limits, so every key has its full limit again",
				zap.String("zone", id.name), zap.String("changed", id.changesFrom(o)))
			return false
		}
		return true
	})
}

// changesFrom says, for people, what differs between old and id: why a
// reload starts the zone afresh (e.g. "events 3 → 5, burst 3 → 5").
func (id stateID) changesFrom(old stateID) string {
	var out []string
	add := func(what string, from, to any) {
		if from != to {
			out = append(out, fmt.Sprintf("%s %v → %v", what, from, to))
		}
	}
	add("events", old.events, id.events)
	add("window", time.Duration(old.window), time.Duration(id.window))
	add("burst", old.burst, id.burst)
	add("max_keys", old.maxKeys, id.maxKeys)
	add("period", old.period, id.period)
	add("time zone", old.timeZone, id.timeZone)
	add("ban", old.ban, id.ban)
	add("ban's longest", old.banMax, id.banMax)
	add("delay", old.delay, id.delay)
	add("queue", old.queue, id.queue)
	if old.vars != id.vars {
		out = append(out, "the placeholders of its limits or their bounds")
	}
	if len(out) == 0 {
		return "its definition"
	}
	return strings.Join(out, ", ")
}

// claims records, for each loaded config, which definition each zone name
// has, so that one name with two different limits in one config is an error,
// whether the zones are HTTP zones or connection zones (the listener
// wrapper's). A config is told apart by its context's Done channel, which
// every module of that config shares.
var claims = struct {
	sync.Mutex
	byConfig map[<-chan struct{}]map[string]zoneClaim
}{byConfig: make(map[<-chan struct{}]map[string]zoneClaim)}

// zoneClaim is a zone name's definition in one config.
type zoneClaim struct {
	id         stateID
	connection bool   // a connection zone (caddy.listeners.rate_limit)
	key        string // the key template
}

// claimZone claims cfg's name in ctx's config for its definition, whose key
// template is key.
func claimZone(ctx caddy.Context, cfg zones.Config, vars planVars, key string, connection bool) error {
	c := zoneClaim{id: newStateID(cfg, vars), connection: connection, key: key}
	done := ctx.Done()
	claims.Lock()
	defer claims.Unlock()
	names, ok := claims.byConfig[done]
	if !ok {
		names = make(map[string]zoneClaim)
		claims.byConfig[done] = names
		context.AfterFunc(ctx, func() {
			claims.Lock()
			delete(claims.byConfig, done)
			claims.Unlock()
		})
	}
	prev, ok := names[cfg.Name]
	switch {
	case ok && prev.id != c.id && prev.connection != c.connection:
		return fmt.Errorf("zone %s is both a connection zone (listener_wrappers rate_limit) and an HTTP zone, with other limits: give one of them another name", cfg.Name)
	case ok && prev.id != c.id:
		return fmt.Errorf("zone %s is defined twice with different limits (%s and %s): give one of them another name",
			cfg.Name, prev.id.limit(), c.id.limit())
	case ok && prev.connection != c.connection:
		// The same definition in both layers shares its state, as two
		// handlers' would; the HTTP zone's claim is kept, for deny_while.
		if !prev.connection {
			return nil
		}
	}
	names[cfg.Name] = c
	return nil
}

// claimedHTTPZone returns the claim of the HTTP zone name in ctx's config,
// when a handler of that config has provisioned it already.
func claimedHTTPZone(ctx caddy.Context, name string) (zoneClaim, bool) {
	claims.Lock()
	defer claims.Unlock()
	c, ok := claims.byConfig[ctx.Done()][name]
	return c, ok && !c.connection
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
	views map[*zones.Zone]storeView
}{zones: make(map[string][]*zones.Zone), views: make(map[*zones.Zone]storeView)}

// storeView is what the admin API shows of a zone's store, found when the
// zone was provisioned, and its layer.
type storeView struct {
	regional   zones.Store         // the store decisions reach (nil in local mode)
	shared     *distributed.Shared // a scope global zone's share of it, else nil
	health     storeHealth         // the regional store's health, if it tells it
	connection bool                // a listener wrapper's zone
	// overrides are the zone's overrides (HTTP zones), emit its handler's
	// events.
	overrides *overrideHolder
	emit      func(event string, data map[string]any)
	// handler is the zone's handler side (HTTP zones): its key template
	// and plans, for rate_limit_status.
	handler *zoneHandler
}

func registerZone(z *zones.Zone, v storeView) {
	registry.Lock()
	registry.zones[z.Name] = append(registry.zones[z.Name], z)
	registry.views[z] = v
	registry.Unlock()
}

// viewOf is z's store as registered (the zero view for a local zone).
func viewOf(z *zones.Zone) storeView {
	registry.Lock()
	defer registry.Unlock()
	return registry.views[z]
}

// isConnectionZone reports whether z is a listener wrapper's zone.
func isConnectionZone(z *zones.Zone) bool { return viewOf(z).connection }

// unregisterZone removes z's registration. When it was the last one of its
// name, no config defines the zone any more and its metric series go too.
func unregisterZone(z *zones.Zone) {
	registry.Lock()
	defer registry.Unlock()
	delete(registry.views, z)
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

// lookupZone is the last registration of name; with httpOnly, the last that
// is not a connection zone.
func lookupZone(name string, httpOnly bool) *zones.Zone {
	registry.Lock()
	defer registry.Unlock()
	regs := registry.zones[name]
	for i := len(regs) - 1; i >= 0; i-- {
		if !httpOnly || !registry.views[regs[i]].connection {
			return regs[i]
		}
	}
	return nil
}
