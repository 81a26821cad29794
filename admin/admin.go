// Package admin is the admin API module admin.api.rate_limit: the routes
// /rate_limit/ over the running zones, their keys and runtime overrides. It
// reads internal/live's registry and views, never the root package, and
// answers in internal/adminapi's types.
package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is the admin endpoint admin.api.rate_limit: it lists zones and
// reads and resets keys, through Caddy's admin server (same address and
// origin rules as the rest of the admin API).
//
//	GET    /rate_limit/zones                    every zone, its limits and store health
//	GET    /rate_limit/zones/<zone>/keys/<key>  a key's remaining, retry_after, reset_after
//	                                            (concurrency zones: in_use, remaining;
//	                                            quota zones: used, remaining, period_end)
//	DELETE /rate_limit/zones/<zone>/keys/<key>  reset the key (local table, deny cache, Redis)
//	GET    /rate_limit/zones/<zone>/top?n=20    the keys this instance denied most lately
//	GET    /rate_limit/zones/<zone>/bans        the zone's current bans
//	GET    /rate_limit/zones/<zone>/overrides   the zone's overrides, who set them and when
//	PUT    /rate_limit/zones/<zone>/overrides/<id>  set an override
//	DELETE /rate_limit/zones/<zone>/overrides/<id>  remove it
//
// Keys are path-escaped in the URL, or in the query (...keys?key=, or
// ?key_base64=): docs/operations.md, with every field of the answers.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/rate_limit/", Handler: caddy.AdminHandlerFunc(a.serveJSON)}}
}

// serveJSON writes serve's errors as plain JSON (Caddy would HTML-escape
// them), logged as Caddy logs admin errors.
func (a *AdminAPI) serveJSON(w http.ResponseWriter, r *http.Request) error {
	err := a.serve(w, r)
	if err == nil {
		return nil
	}
	apiErr := caddy.APIError{Err: err}
	errors.As(err, &apiErr)
	apiErr.HTTPStatus = cmp.Or(apiErr.HTTPStatus, http.StatusInternalServerError)
	if apiErr.Message == "" && apiErr.Err != nil {
		apiErr.Message = apiErr.Err.Error()
	}
	caddy.Log().Named("admin.api").Error("request error", zap.Error(err), zap.Int("status_code", apiErr.HTTPStatus))
	return adminapi.WriteJSON(w, apiErr.HTTPStatus, apiErr)
}

func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	rest, _ := strings.CutPrefix(r.URL.EscapedPath(), "/rate_limit/")
	parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	if len(parts) == 1 && parts[0] == "zones" {
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
		return adminapi.WriteJSON(w, http.StatusOK, listZones())
	}
	q, route := r.URL.Query(), ""
	if (len(parts) == 3 || len(parts) == 4) && parts[0] == "zones" {
		route = parts[2]
	}
	keys := route == "keys" && (len(parts) == 4 || q.Has("key") || q.Has("key_base64"))
	if !keys && route != "overrides" && !(len(parts) == 3 && (route == "top" || route == "bans")) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: errors.New("unknown path: use /rate_limit/zones, /rate_limit/zones/<zone>/keys/<key> (or .../keys?key=<key>, for any key including the empty one, or .../keys?key_base64=<base64>) /rate_limit/zones/<zone>/top, /rate_limit/zones/<zone>/bans or /rate_limit/zones/<zone>/overrides[/<id>]")}
	}
	zoneName, err1 := url.PathUnescape(parts[1])
	var arg string // the key, or the override's id
	var err2 error
	switch {
	case len(parts) == 4:
		arg, err2 = url.PathUnescape(parts[3])
	case !keys:
	case q.Has("key_base64"):
		arg, err2 = adminapi.DecodeKeyBase64(q.Get("key_base64"))
	default:
		arg = q.Get("key")
	}
	if err := errors.Join(err1, err2); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	// An override route prefers the HTTP zone: a connection zone takes none.
	z := live.Lookup(zoneName, route == "overrides")
	if z == nil {
		z = live.Lookup(zoneName, false)
	}
	switch {
	case z == nil:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown zone %q", zoneName)}
	case route == "overrides":
		return a.serveOverrides(w, r, z, arg, len(parts) == 4)
	case !keys && r.Method != http.MethodGet:
		return methodNotAllowed(w, http.MethodGet)
	case route == "top":
		return a.top(w, r, z)
	case route == "bans":
		return a.bans(w, r, z)
	case r.Method == http.MethodGet:
		return a.getKey(w, r, z, arg)
	case r.Method == http.MethodDelete:
		return a.resetKey(w, r, z, arg)
	}
	return methodNotAllowed(w, http.MethodGet, http.MethodDelete)
}

func listZones() []adminapi.ZoneInfo {
	running := live.Zones()
	out := make([]adminapi.ZoneInfo, 0, len(running))
	for _, z := range running {
		zi := adminapi.ZoneInfo{Name: z.Name, Mode: z.Mode(), FailPolicy: z.FailPolicy.String(),
			DryRun: z.DryRun, LocalKeys: z.Keys(), Concurrency: z.Concurrency}
		if !z.IsConcurrency() && !z.IsQuota() {
			zi.Rate = rate(z.Plan())
		}
		if z.IsAdaptive() {
			limit, _ := z.AdaptiveLimit()
			zi.Concurrency = max(limit, z.Adaptive.Min) // the limit now, summed over its keys
		}
		if z.Delay > 0 {
			waiting := z.Waiting()
			zi.Delay, zi.Queue, zi.Waiting = adminapi.ShortDuration(z.Delay.String()), z.QueueSize(), &waiting
		}
		if live.IsConnection(z) {
			zi.Layer, zi.FailPolicy = "connection", ""
		}
		if z.IsQuota() {
			start, end := z.PeriodNow(monotime.Now())
			zi.Quota = &adminapi.QuotaInfo{Limit: z.Quota, Period: period(z, start, end)}
		}
		if v := live.View(z); v.Regional != nil {
			zi.Scope, zi.Region = "region", ""
			if v.Shared != nil {
				zi.Scope, zi.Region = "global", v.Shared.Region().Name()
			}
			zi.Store = &adminapi.StoreInfo{OK: true, Instances: v.Regional.Instances()}
			if hr := v.Health; hr != nil {
				ok, since := hr.Health()
				zi.Store.OK = ok
				if !ok {
					zi.Store.BreakerOpenSince, zi.Store.Failing = &since, true
				}
				for _, o := range hr.Outages() {
					zi.Store.Failing = zi.Store.Failing && !o.Open
					if o.Node != "" {
						zi.Store.Unreachable = append(zi.Store.Unreachable, adminapi.NodeOutage{Node: o.Node, Since: o.Since})
					}
				}
				if msg, at := hr.LastProblem(); msg != "" {
					zi.Store.LastProblem, zi.Store.LastProblemAt = msg, &at
				}
			}
		}
		out = append(out, zi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (a *AdminAPI) getKey(w http.ResponseWriter, r *http.Request, z *zones.Zone, key string) error {
	t, s, err := readKey(r.Context(), z, key, monotime.Now())
	switch {
	case err != nil:
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the key from Redis: %v", err)}
	case !s.Tracked && t.Override == nil && !z.IsQuota():
		// Caddy logs admin errors: the message leaves the key out (keys
		// can be personal data). A quota zone answers for any key.
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s: key not tracked (%s)", z.Name, noState(z))}
	}
	info := adminapi.KeyInfo{Zone: z.Name, KeyName: adminapi.NewKeyName(key), State: state(s.Decision), Source: "local",
		BannedFor: banLeft(s.Decision), BanLevel: s.BanLevel}
	if t.Key != key {
		info.StoredAs = t.Key
	}
	if z.Store() != nil {
		info.Source = "redis"
	}
	v := live.View(z)
	if t.Override != nil && v.Overrides != nil {
		if rec, ok := v.Overrides.Record(t.Override.ID); ok {
			info.Override = &rec.Override
		}
	}
	switch {
	case z.IsConcurrency():
		info.InUse, info.Concurrency = &s.InFlight, s.Limit
	case z.IsQuota():
		info.Used, info.Quota, info.Period = &s.Used, s.Limit, period(z, s.PeriodStart, s.PeriodEnd)
	default:
		info.Rate = rate(t.Plan)
		if sh := v.Shared; sh != nil { // scope global: this region's share of the key
			share := float64(sh.Region().Share(z.Name, t.Key)) / distributed.ShareScale
			info.Share, info.Region = &share, sh.Region().Name()
		}
	}
	if v.USD != nil {
		info.USDFields = v.USD(s.Limit, s.Remaining, info.Used)
	}
	if s.Source == zones.SourceRecord {
		// Async mode: this instance's lease decides, the fleet's view beside.
		info.Source = "instance"
		switch f, err := z.PeekStore(r.Context(), t.Key, monotime.Now()); {
		case errors.Is(err, zones.ErrUnknownKey):
			info.Fleet = &adminapi.State{Remaining: t.Plan.Burst}
		case err != nil:
			info.FleetError = "reading the key from Redis: " + err.Error()
		default:
			fleet := state(f)
			info.Fleet = &fleet
		}
	}
	return adminapi.WriteJSON(w, http.StatusOK, info)
}

func period(z *zones.Zone, start, end time.Time) adminapi.Period {
	return adminapi.Period{Per: z.Period.String(), TimeZone: z.Location.String(), PeriodStart: start.Format(time.RFC3339), PeriodEnd: end.Format(time.RFC3339)}
}

func rate(p zones.Plan) adminapi.Rate {
	return adminapi.Rate{Events: p.Events, Window: adminapi.ShortDuration(p.Window.String()), WindowSeconds: p.Window.Seconds(), Burst: p.Burst}
}

func state(d zones.Decision) adminapi.State {
	return adminapi.State{Remaining: d.Remaining, RetryAfter: d.RetryAfter.Seconds(), ResetAfter: d.ResetAfter.Seconds()}
}

func banLeft(d zones.Decision) float64 {
	if !d.Banned {
		return 0
	}
	return d.RetryAfter.Seconds()
}

func (a *AdminAPI) bans(w http.ResponseWriter, r *http.Request, z *zones.Zone) error {
	if z.Ban == 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s does not ban: add e.g. ban 1h to it", z.Name)}
	}
	list, fleet, err := z.ListBans(r.Context(), monotime.Now())
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the bans from Redis: %v", err)}
	}
	out := adminapi.BansInfo{Zone: z.Name, View: "instance", Bans: make([]adminapi.BanInfo, 0, len(list))}
	if fleet {
		out.View = "fleet"
	}
	for _, b := range list {
		out.Bans = append(out.Bans, adminapi.BanInfo{KeyName: adminapi.NewKeyName(b.Key), BannedFor: b.Left.Seconds(), BanLevel: b.Level})
	}
	return adminapi.WriteJSON(w, http.StatusOK, out)
}

func (a *AdminAPI) resetKey(w http.ResponseWriter, r *http.Request, z *zones.Zone, key string) error {
	if z.IsConcurrency() {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest,
			Err: errors.New("a concurrency zone's slots cannot be reset: they are freed when their requests end (or, with distributed, when their lease ends)")}
	}
	t, s, err := readKey(r.Context(), z, key, monotime.Now())
	if err == nil && !s.Tracked {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s: key not tracked, nothing to reset (%s)", z.Name, noState(z))}
	}
	if err := z.Reset(r.Context(), t.Key); err != nil {
		// Whether Redis's state is gone is not known (a command that
		// timed out may still run): say exactly that.
		return adminapi.WriteJSON(w, http.StatusServiceUnavailable, adminapi.PartialReset{
			Reset: []string{"local"}, Unconfirmed: []string{"redis"},
			Error: fmt.Sprintf("reset this instance's state for the key, but Redis did not confirm its reset (%v): "+
				"until a DELETE succeeds, the key may keep its limit in Redis, for every instance, until it expires there", err)})
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *AdminAPI) top(w http.ResponseWriter, r *http.Request, z *zones.Zone) error {
	offenders := z.State().Offenders
	n := adminapi.DefaultTopN
	if s := r.URL.Query().Get("n"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("n=%q: want a positive number of keys (e.g. n=20)", s)}
		}
	}
	sum := offenders.Top(n, time.Now().UnixNano())
	out := adminapi.TopInfo{Zone: z.Name, View: "instance", Since: time.Unix(0, sum.Since).UTC(),
		Denials: sum.Total, Floor: sum.Floor, Capacity: offenders.Capacity(), DryRun: z.DryRun,
		Keys: make([]adminapi.OffenderInfo, 0, len(sum.Top))}
	for _, e := range sum.Top {
		o := adminapi.OffenderInfo{KeyName: adminapi.NewKeyName(e.Key), Denials: e.Count, Error: e.Error}
		if _, s, err := readKey(r.Context(), z, e.Key, monotime.Now()); err != nil {
			o.StateError = err.Error()
		} else {
			o.Limited, o.State, o.BannedFor = !s.Allowed, state(s.Decision), banLeft(s.Decision)
		}
		out.Keys = append(out.Keys, o)
	}
	return adminapi.WriteJSON(w, http.StatusOK, out)
}

// noState is what "not tracked" means, in the 404 of a key with no state.
func noState(z *zones.Zone) string {
	where := "on this instance"
	if z.Store() != nil {
		where = "in Redis"
	}
	return "no state " + where + ": its next request is decided as a new key's, with the full limit"
}

// ticket has no owner: the admin API decides no request.
type ticket = zones.Ticket[struct{}]

// readKey reads key, under the plan it was last decided under, in the first
// form the zone tracks (else the first): as a request's key is stored
// (masked, hashed), then, for a key that reads like a hashed one, as given,
// since top, bans and {http.rate_limit.exceeded.key} show keys as stored.
func readKey(ctx context.Context, z *zones.Zone, key string, now int64) (ticket, zones.KeyState, error) {
	var first ticket
	var firstState zones.KeyState
	forms := []string{z.Config.Key(key)}
	if forms[0] != key && strings.HasPrefix(key, zones.HashedKeyPrefix) {
		forms = append(forms, key)
	}
	for i, stored := range forms {
		t := ticket{Zone: z, Key: stored, Raw: key, Plan: z.LastPlan(stored, now), Cost: 1}
		t.Resolve()
		s, err := t.Read(ctx, now)
		if err != nil || s.Tracked {
			return t, s, err
		}
		if i == 0 {
			first, firstState = t, s
		}
	}
	return first, firstState, nil
}

func methodNotAllowed(w http.ResponseWriter, allowed ...string) error {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed: use " + strings.Join(allowed, " or "))}
}

// serveOverrides answers the override routes of zone z: the override id's
// (item), else the list.
func (a *AdminAPI) serveOverrides(w http.ResponseWriter, r *http.Request, z *zones.Zone, id string, item bool) error {
	h := live.View(z).Overrides
	if h == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s takes no overrides (a connection zone)", z.Name)}
	}
	if !item {
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
		list := h.List()
		info := adminapi.OverridesInfo{Zone: z.Name, View: "instance", Overrides: make([]adminapi.Override, 0, len(list))}
		for _, rec := range list {
			info.Overrides = append(info.Overrides, rec.Override)
		}
		if h.Fleet() {
			info.View = "fleet"
		}
		return adminapi.WriteJSON(w, http.StatusOK, info)
	}
	if err := live.CheckOverrideID(id); err != nil {
		return err
	}
	switch r.Method {
	case http.MethodGet:
		if rec, ok := h.Record(id); ok {
			return adminapi.WriteJSON(w, http.StatusOK, rec)
		}
	case http.MethodPut:
		rec, err := live.ParseOverride(z, id, r.RemoteAddr, r.Body, time.Now())
		if err != nil {
			return err
		}
		if err := h.Put(r.Context(), rec); err != nil {
			return err
		}
		overrideChanged(z, "set", rec.Override)
		return adminapi.WriteJSON(w, http.StatusOK, rec)
	case http.MethodDelete:
		found, err := h.Remove(r.Context(), id)
		if err != nil {
			return err
		}
		if found {
			overrideChanged(z, "removed", adminapi.Override{ID: id, SetBy: r.RemoteAddr})
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
	default:
		return methodNotAllowed(w, http.MethodGet, http.MethodPut, http.MethodDelete)
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s has no override %q", z.Name, id)}
}

const eventOverrideChanged = "rate_limit_override_changed"

// overrideChanged logs a change made through this instance and emits
// rate_limit_override_changed.
func overrideChanged(z *zones.Zone, change string, rec adminapi.Override) {
	fields := []zap.Field{zap.String("zone", z.Name), zap.String("id", rec.ID), zap.String("change", change), zap.String("by", rec.SetBy)}
	if rec.Expires != "" {
		fields = append(fields, zap.String("expires", rec.Expires))
	}
	if rec.Reason != "" {
		fields = append(fields, zap.String("reason", rec.Reason))
	}
	caddy.Log().Named("http.handlers.rate_limit").Info("rate limit override "+change, fields...)
	if emit := live.View(z).Emit; emit != nil {
		emit(eventOverrideChanged, map[string]any{"zone": z.Name, "id": rec.ID, "change": change, "by": rec.SetBy, "expires": rec.Expires, "reason": rec.Reason})
	}
}

// Interface guards
var _ caddy.AdminRouter = (*AdminAPI)(nil)
