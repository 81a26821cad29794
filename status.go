package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

func init() {
	caddy.RegisterModule(StatusHandler{})
	httpcaddyfile.RegisterDirective("rate_limit_status", parseStatusCaddyfile)
	// Just before rate_limit: asking for one's budget must not spend it.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit_status", httpcaddyfile.After, "try_files")
}

// StatusHandler answers a client with its own state in the named zones of
// the running config, as GitHub's GET /rate_limit does, consuming nothing:
// for each zone, the key the zone builds from this request (its key
// template, its plan, the operator's overrides), and what the client's
// next request would get there. It answers every request it handles:
//
//	{"zones":[{"zone":"api_key","limit":10,"window":60,"remaining":10,"reset":0,"banned_for":0}]}
//
// limit and window are the limit the key is under (a quota zone: its
// limit and the current period's length, with "period" and "used"; a
// concurrency zone: its requests in flight, with "in_flight" and window
// 0); remaining is what the key can still spend now, which after a request
// is that request's RateLimit remaining; reset the seconds until the key
// is back to full (a quota zone: until the period ends); banned_for the
// seconds a ban has left. A usd zone's integers are micro-dollars, said by
// "unit":"usd-micro", with limit_usd, remaining_usd and used_usd beside
// them in dollars ("19.873412").
// Times are whole seconds, rounded up. A zone whose store could not be read
// has "error" instead. Status 200, Cache-Control: no-store. The zones'
// reads of Redis go in one round trip per Redis: deny caches and async
// records first, then one batched read of the strict and quota keys left.
type StatusHandler struct {
	// The zones to report, by name: HTTP zones of a rate_limit handler of
	// the same config.
	Zones []string `json:"zones,omitempty"`
	// Source is where the handler was written ("<file>:<line>"), which an
	// error about its zones names; the Caddyfile adapter sets it.
	Source string `json:"source,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (StatusHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit_status",
		New: func() caddy.Module { return new(StatusHandler) },
	}
}

// Provision checks that every zone named is an HTTP zone of this config.
func (s *StatusHandler) Provision(ctx caddy.Context) error {
	if len(s.Zones) == 0 {
		return fmt.Errorf("rate_limit_status: name at least one zone, e.g. rate_limit_status api_key")
	}
	for _, name := range s.Zones {
		if !zones.ValidName(name) {
			return fmt.Errorf("rate_limit_status: zone name %q is invalid: use letters, digits, '_' and '-' only", name)
		}
		_, found := live.ClaimedHTTPZone(ctx, name)
		if app, err := ctx.AppIfConfigured("http"); !found && err == nil {
			if app, ok := app.(*caddyhttp.App); ok {
				_, _, found = httpZoneInJSON(app, name)
			}
		}
		if !found {
			at := ""
			if s.Source != "" {
				at = s.Source + ": "
			}
			return fmt.Errorf("%srate_limit_status %s: no rate_limit handler of this config has a zone %s: name one of its HTTP zones", at, name, name)
		}
	}
	return nil
}

// UnmarshalCaddyfile reads
//
//	rate_limit_status <zone> [<zone>...]
func (s *StatusHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	s.Zones = d.RemainingArgs()
	if len(s.Zones) == 0 {
		return d.Err("rate_limit_status needs the zones to report, e.g. rate_limit_status api_key")
	}
	for _, name := range s.Zones {
		if !zones.ValidName(name) {
			return d.Errf("rate_limit_status: zone name %q is invalid: use letters, digits, '_' and '-' only", name)
		}
	}
	if d.NextBlock(0) {
		return d.Err("rate_limit_status takes no block: rate_limit_status <zone> [<zone>...]")
	}
	return nil
}

// parseStatusCaddyfile is RegisterHandlerDirective's, refusing a handler
// at a site's top level with no matcher: it would answer every request.
// Caddy hands a site's own directives the site's State as their
// BlockState, and those nested in a block a copy.
func parseStatusCaddyfile(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	h.Next()
	s := StatusHandler{Source: fmt.Sprintf("%s:%d", h.File(), h.Line())}
	matcher, err := h.ExtractMatcherSet()
	if err != nil {
		return nil, err
	}
	if err := s.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	if matcher == nil && reflect.ValueOf(h.State).Pointer() == reflect.ValueOf(h.BlockState).Pointer() {
		return nil, h.Errf("rate_limit_status at a site's top level without a matcher answers every request of the site: "+
			"give it the path clients ask at (rate_limit_status /rate_limit %s) or put it in a handle block", strings.Join(s.Zones, " "))
	}
	return h.NewRoute(matcher, &s), nil
}

// zoneStatus is one zone of the answer.
type zoneStatus struct {
	Zone               string `json:"zone"`
	Limit              int64  `json:"limit"`
	Window             int64  `json:"window"`
	Remaining          int64  `json:"remaining"`
	Reset              int64  `json:"reset"`
	BannedFor          int64  `json:"banned_for"`
	Period             string `json:"period,omitempty"`    // quota zones
	Used               *int64 `json:"used,omitempty"`      // quota zones
	InFlight           *int64 `json:"in_flight,omitempty"` // concurrency zones
	Error              string `json:"error,omitempty"`
	adminapi.USDFields        // usd zones: the amounts in dollars
}

func (s *StatusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	repl := requestReplacer(r)
	now := monotime.Now()
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	out := struct {
		Zones []zoneStatus `json:"zones"`
	}{Zones: make([]zoneStatus, len(s.Zones))}
	g := distributed.NewGather(len(s.Zones))
	var wg sync.WaitGroup
	for i, name := range s.Zones {
		t := statusTicket(r, repl, name, now)
		wg.Go(func() {
			ctx, done := g.Caller(ctx)
			defer done()
			out.Zones[i] = zoneStatusOf(ctx, name, t, now)
		})
	}
	wg.Wait()
	w.Header().Set("Cache-Control", "no-store")
	return adminapi.WriteJSON(w, http.StatusOK, out)
}

// statusTicket is the request's resolved ticket in zone name (nil when
// the zone is not loaded).
func statusTicket(r *http.Request, repl *caddy.Replacer, name string, now int64) *ticket {
	zh := httpZoneOf(live.Lookup(name, true)) // View(nil) is no zone's
	if zh == nil {
		return nil
	}
	raw := zh.expandKey(r, repl)
	t := &ticket{Owner: zh, Zone: zh.Zone, Key: zh.Config.Key(raw), Raw: raw, Plan: zh.planFor(repl, now), Cost: 1}
	zh.resolve(r, t)
	return t
}

// zoneStatusOf is ticket t's state now in zone name (t nil: not loaded).
func zoneStatusOf(ctx context.Context, name string, t *ticket, now int64) zoneStatus {
	st := zoneStatus{Zone: name}
	if t == nil {
		st.Error = "the zone is not loaded"
		return st
	}
	s, err := t.Read(ctx, now)
	if err != nil {
		st.Error = "reading the zone's store: " + err.Error()
		return st
	}
	st.Limit, st.Window, st.Remaining, st.Reset = s.Limit, ceilSeconds(s.Window), s.Remaining, ceilSeconds(s.ResetAfter)
	if s.Banned {
		st.BannedFor = ceilSeconds(s.RetryAfter)
	}
	switch {
	case t.Zone.IsConcurrency():
		st.InFlight = &s.InFlight
	case t.Zone.IsQuota():
		st.Period, st.Used = t.Zone.Period.String(), &s.Used
	}
	st.USDFields = t.Owner.usdFields(s.Limit, s.Remaining, st.Used)
	return st
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

// Interface guards
var (
	_ caddy.Provisioner           = (*StatusHandler)(nil)
	_ caddyfile.Unmarshaler       = (*StatusHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*StatusHandler)(nil)
)
