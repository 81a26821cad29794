package ratelimit

import (
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

// The zone states, name claims and registry of running zones live in
// internal/live, shared with the listener wrapper; this file is the
// handler's view of them.

// stateKey is what internal/live tells definitions apart by for the plan
// placeholders vars: nil when the zone reads none, so that an HTTP zone
// without plans shares its state with a connection zone of the same limits.
func stateKey(vars planVars) any {
	if vars == (planVars{}) {
		return nil
	}
	return vars
}

// storeView is what the admin API shows of an HTTP zone's store, found when
// the zone was provisioned: its registration's view in internal/live.
type storeView struct {
	regional zones.Store         // the store decisions reach (nil in local mode)
	shared   *distributed.Shared // a scope global zone's share of it, else nil
	health   live.StoreHealth    // the regional store's health, if it tells it
	// overrides are the zone's overrides, emit its handler's events.
	overrides *live.OverrideHolder
	emit      func(event string, data map[string]any)
	// handler is the zone's handler side: its key template and plans, for
	// rate_limit_status.
	handler *zoneHandler
}

// viewOf is z's store as registered (the zero view for a local or
// connection zone).
func viewOf(z *zones.Zone) storeView {
	v, _ := live.View(z).(storeView)
	return v
}

// httpZoneInJSON looks for the HTTP zone name in the routes of the app's
// servers that are still JSON (live.ZoneInJSON).
func httpZoneInJSON(app *caddyhttp.App, name string) (key string, concurrency, found bool) {
	var routes []any
	for _, srv := range app.Servers {
		routes = append(routes, srv.Routes, srv.Errors, srv.NamedRoutes)
	}
	return live.ZoneInJSON(routes, name)
}
