package ratelimit

import (
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/usage"
	"github.com/caddy-tally/ratelimit/zones"
)

// stateKey tells definitions apart by their plan placeholders: nil for
// none, so that an HTTP zone without plans shares its state with a
// connection zone of the same limits.
func stateKey(vars planVars) any {
	if vars == (planVars{}) {
		return nil
	}
	return vars
}

// httpZoneOf is z's HTTP side (nil for a connection zone).
func httpZoneOf(z *zones.Zone) *httpZone {
	zh, _ := live.View(z).Handler.(*httpZone)
	return zh
}

// usdFields is a usd zone's amounts in dollars, the USD of its view; none
// in another zone, or when zh is nil.
func (zh *httpZone) usdFields(limit, remaining int64, used *int64) adminapi.USDFields {
	if zh == nil || zh.costs.usd() == nil {
		return adminapi.USDFields{}
	}
	f := adminapi.USDFields{Unit: unitMicroUSD, LimitUSD: usage.FormatUSD(limit), RemainingUSD: usage.FormatUSD(remaining)}
	if used != nil {
		f.UsedUSD = usage.FormatUSD(*used)
	}
	return f
}

// httpZoneInJSON looks for the HTTP zone name in the app's routes that
// are still JSON.
func httpZoneInJSON(app *caddyhttp.App, name string) (key string, concurrency, found bool) {
	var routes []any
	for _, srv := range app.Servers {
		routes = append(routes, srv.Routes, srv.Errors, srv.NamedRoutes)
	}
	return live.ZoneInJSON(routes, name)
}
