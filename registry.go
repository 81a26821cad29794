package ratelimit

import (
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/internal/adminapi"
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

// httpZoneOf is z's HTTP side, as registered in its view (nil for
// a connection zone).
func httpZoneOf(z *zones.Zone) *httpZone {
	zh, _ := live.View(z).Handler.(*httpZone)
	return zh
}

// usdFields is zh's amounts in dollars (usdFieldsOf), the USD of its view;
// none for a zone that is not a usd zone, or no HTTP zone (zh nil).
func (zh *httpZone) usdFields(limit, remaining int64, used *int64) adminapi.USDFields {
	if zh == nil {
		return adminapi.USDFields{}
	}
	return usdFieldsOf(zh.costs.usd(), limit, remaining, used)
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
