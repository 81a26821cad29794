package ratelimit

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

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
//	PUT    /rate_limit/zones/<zone>/overrides/<id>  set an override (overrides.go)
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

// serveJSON is serve with its errors written as plain JSON, as its answers
// are: Caddy's admin server would HTML-escape them ("unknown zone
// \"\u003cz\u003e\""), and the admin API is not a web page. The error is
// logged as Caddy logs the admin errors it writes.
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
	return writeJSON(w, apiErr.HTTPStatus, apiErr)
}

// zoneInfo is a zone as GET /rate_limit/zones shows it. Fields that mean
// nothing for a zone's kind are left out: events, window and burst for
// concurrency and quota zones, fail_policy for connection zones.
type zoneInfo struct {
	Name          string     `json:"name"`
	Events        int64      `json:"events,omitempty"`
	Window        string     `json:"window,omitempty"`
	WindowSeconds float64    `json:"window_seconds,omitempty"`
	Burst         int64      `json:"burst,omitempty"`
	Mode          string     `json:"mode"`
	FailPolicy    string     `json:"fail_policy,omitempty"`
	DryRun        bool       `json:"dry_run"`
	LocalKeys     int        `json:"local_keys"`
	Store         *storeInfo `json:"store,omitempty"`

	Concurrency int64      `json:"concurrency,omitempty"` // concurrency zones only
	Quota       *quotaInfo `json:"quota,omitempty"`       // quota zones only
	Delay       string     `json:"delay,omitempty"`       // zones with delay, with queue and waiting
	Queue       int64      `json:"queue,omitempty"`
	Waiting     *int64     `json:"waiting,omitempty"`
	Layer       string     `json:"layer,omitempty"`  // "connection" for a listener wrapper's zone
	Scope       string     `json:"scope,omitempty"`  // "global" (with Region) or "region" when distributed
	Region      string     `json:"region,omitempty"` // this instance's
}

// quotaInfo is a quota zone's limit and the period it is in on this
// instance's clock, times in RFC 3339 with the zone's offset.
type quotaInfo struct {
	Limit       int64  `json:"limit"`
	Per         string `json:"per"`
	TimeZone    string `json:"time_zone"`
	PeriodStart string `json:"period_start"`
	PeriodEnd   string `json:"period_end"`
}

type storeInfo struct {
	OK bool `json:"ok"`
	// Failing: calls fail (twice in a row or more) but the breaker still
	// lets them through. BreakerOpenSince is when the outage began.
	Failing          bool       `json:"failing,omitempty"`
	BreakerOpenSince *time.Time `json:"breaker_open_since,omitempty"`
	Instances        int        `json:"instances"`
	// The last error Redis gave about one key, and when.
	LastProblem   string     `json:"last_problem,omitempty"`
	LastProblemAt *time.Time `json:"last_problem_at,omitempty"`
	// On a Redis Cluster, the masters the store cannot reach now.
	Unreachable []nodeOutage `json:"unreachable_nodes,omitempty"`
}

// nodeOutage is one unreachable Redis Cluster master.
type nodeOutage struct {
	Node  string    `json:"node"`
	Since time.Time `json:"since"`
}

// keyInfo is a key as GET /rate_limit/zones/<zone>/keys/<key> shows it:
// its state now (the one read, zones.Ticket.Read, as rate_limit_status
// reports it) and the limit it is under, by its zone's kind. Durations are
// in seconds.
type keyInfo struct {
	Zone string `json:"zone"`
	keyName
	// The key as the zone stores it (masked, hashed), when it is not the
	// key given.
	StoredAs   string  `json:"stored_as,omitempty"`
	Remaining  int64   `json:"remaining"`
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
	// Rate zones: the limit the key is under (its plan).
	Events        int64   `json:"events,omitempty"`
	Window        string  `json:"window,omitempty"`
	WindowSeconds float64 `json:"window_seconds,omitempty"`
	Burst         int64   `json:"burst,omitempty"`
	// Quota zones: the units used this period, of quota, and the period
	// in RFC 3339 with the zone's offset.
	Used        *int64 `json:"used,omitempty"`
	Quota       int64  `json:"quota,omitempty"`
	Per         string `json:"per,omitempty"`
	TimeZone    string `json:"time_zone,omitempty"`
	PeriodStart string `json:"period_start,omitempty"`
	PeriodEnd   string `json:"period_end,omitempty"`
	// Concurrency zones: the key's requests in flight (fleet-wide when
	// distributed), of its limit of them.
	InUse       *int64 `json:"in_use,omitempty"`
	Concurrency int64  `json:"concurrency,omitempty"`
	// "local", "redis" or, in async mode, "instance": this instance's
	// lease of the key, with Redis's view in Fleet (or FleetError).
	Source     string     `json:"source"`
	Fleet      *fleetView `json:"fleet,omitempty"`
	FleetError string     `json:"fleet_error,omitempty"`
	BannedFor  float64    `json:"banned_for,omitempty"` // zones with ban
	BanLevel   int        `json:"ban_level,omitempty"`
	// Scope global zones: this region's share of the key's limit (0 to
	// 1), which remaining, events and burst are scaled to.
	Share  *float64 `json:"share,omitempty"`
	Region string   `json:"region,omitempty"`
	// Override is the operator's override the key is decided under, when
	// one covers it: the limit above is then its limit.
	Override *overrideRecord `json:"override,omitempty"`
	// usd zones: remaining, quota or burst, and used in dollars.
	usdFields
}

// fleetView is a key of an async zone as Redis holds it. Durations are in
// seconds.
type fleetView struct {
	Remaining  int64   `json:"remaining"`
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
}

// keyName is how the admin API names a key in its answers: "key" is the key
// as text; JSON would turn a byte that is not UTF-8 into U+FFFD, so such a
// key also has "key_base64", its bytes, which GET and DELETE take back as
// ?key_base64= and `caddy rate-limit key|reset --base64` as the key.
type keyName struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64,omitempty"`
}

func newKeyName(key string) keyName {
	if utf8.ValidString(key) {
		return keyName{Key: key}
	}
	return keyName{Key: strings.ToValidUTF8(key, "\uFFFD"), KeyBase64: base64.StdEncoding.EncodeToString([]byte(key))}
}

// raw is the key itself.
func (k keyName) raw() string {
	if k.KeyBase64 != "" {
		if b, err := base64.StdEncoding.DecodeString(k.KeyBase64); err == nil {
			return string(b)
		}
	}
	return k.Key
}

// decodeKeyBase64 reads a key given as ?key_base64=. A '+' that reached us
// unescaped in a query string reads as a space, which base64 never holds:
// it is taken back.
func decodeKeyBase64(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(s, " ", "+"))
	if err != nil {
		return "", fmt.Errorf("key_base64=%q is not standard base64 (RFC 4648 §4, padded, query-escaped): %v", s, err)
	}
	return string(b), nil
}

func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	rest, _ := strings.CutPrefix(r.URL.EscapedPath(), "/rate_limit/")
	parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	q := r.URL.Query()
	zoneRoute := (len(parts) == 3 || len(parts) == 4) && parts[0] == "zones"
	if zoneRoute && parts[2] == "overrides" {
		return a.overrideRoute(w, r, parts)
	}
	keys := zoneRoute && parts[2] == "keys" && (len(parts) == 4 || q.Has("key") || q.Has("key_base64"))
	switch {
	case len(parts) == 1 && parts[0] == "zones":
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
		return writeJSON(w, http.StatusOK, listZones())
	case !keys && !(zoneRoute && len(parts) == 3 && (parts[2] == "top" || parts[2] == "bans")):
		return caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: errors.New("unknown path: use /rate_limit/zones, /rate_limit/zones/<zone>/keys/<key> (or .../keys?key=<key>, for any key including the empty one, or .../keys?key_base64=<base64>) /rate_limit/zones/<zone>/top, /rate_limit/zones/<zone>/bans or /rate_limit/zones/<zone>/overrides[/<id>]")}
	}
	zoneName, err1 := url.PathUnescape(parts[1])
	var key string
	var err2 error
	switch {
	case !keys:
	case len(parts) == 4:
		key, err2 = url.PathUnescape(parts[3])
	case q.Has("key_base64"):
		key, err2 = decodeKeyBase64(q.Get("key_base64"))
	default:
		key = q.Get("key")
	}
	if err := errors.Join(err1, err2); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	z := live.Lookup(zoneName, false)
	switch {
	case z == nil:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown zone %q", zoneName)}
	case !keys && r.Method != http.MethodGet:
		return methodNotAllowed(w, http.MethodGet)
	case parts[2] == "top":
		return a.top(w, r, z)
	case parts[2] == "bans":
		return a.bans(w, r, z)
	case r.Method == http.MethodGet:
		return a.getKey(w, r, z, key)
	case r.Method == http.MethodDelete:
		return a.resetKey(w, r, z, key)
	}
	return methodNotAllowed(w, http.MethodGet, http.MethodDelete)
}

// overrideRoute answers /rate_limit/zones/<zone>/overrides[/<id>].
func (a *AdminAPI) overrideRoute(w http.ResponseWriter, r *http.Request, parts []string) error {
	zoneName, err := url.PathUnescape(parts[1])
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	var id string
	if len(parts) == 4 {
		if id, err = url.PathUnescape(parts[3]); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		if id == "" {
			return checkOverrideID(id)
		}
	}
	z := live.Lookup(zoneName, true)
	if z == nil {
		z = live.Lookup(zoneName, false) // a connection zone: serveOverrides says it takes none
	}
	if z == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown zone %q", zoneName)}
	}
	return a.serveOverrides(w, r, z, id)
}

func listZones() []zoneInfo {
	running := live.Zones()
	out := make([]zoneInfo, 0, len(running))
	for _, z := range running {
		zi := zoneInfo{
			Name:       z.Name,
			Mode:       z.Mode(),
			FailPolicy: z.FailPolicy.String(),
			DryRun:     z.DryRun,
			LocalKeys:  z.Keys(),
		}
		if !z.IsConcurrency() && !z.IsQuota() {
			zi.Events, zi.Burst = z.Events, z.Limit().Burst
			zi.Window, zi.WindowSeconds = shortDuration(z.Window.String()), z.Window.Seconds()
		}
		zi.Concurrency = z.Concurrency
		if z.IsAdaptive() {
			limit, _ := z.AdaptiveLimit()
			zi.Concurrency = max(limit, z.Adaptive.Min) // the limit now, summed over its keys
		}
		if z.Delay > 0 {
			waiting := z.Waiting()
			zi.Delay, zi.Queue, zi.Waiting = shortDuration(z.Delay.String()), z.QueueSize(), &waiting
		}
		if live.IsConnection(z) {
			zi.Layer, zi.FailPolicy = "connection", ""
		}
		if z.IsQuota() {
			start, end := z.PeriodNow(monotime.Now())
			zi.Quota = &quotaInfo{Limit: z.Quota, Per: z.Period.String(), TimeZone: z.Location.String(),
				PeriodStart: start.Format(time.RFC3339), PeriodEnd: end.Format(time.RFC3339)}
		}
		if v := viewOf(z); v.regional != nil {
			zi.Scope, zi.Region = "region", ""
			if v.shared != nil {
				zi.Scope, zi.Region = "global", v.shared.Region().Name()
			}
			zi.Store = &storeInfo{OK: true, Instances: v.regional.Instances()}
			if hr := v.health; hr != nil {
				ok, since := hr.Health()
				zi.Store.OK = ok
				if !ok {
					zi.Store.BreakerOpenSince, zi.Store.Failing = &since, true
				}
				for _, o := range hr.Outages() {
					zi.Store.Failing = zi.Store.Failing && !o.Open
					if o.Node != "" {
						zi.Store.Unreachable = append(zi.Store.Unreachable, nodeOutage{o.Node, o.Since})
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
		// can be personal data; log_key governs them). A quota zone
		// answers for any key, its use of the period.
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s: key not tracked (%s)", z.Name, noState(z))}
	}
	info := keyInfo{Zone: z.Name, keyName: newKeyName(key), StoredAs: storedAs(key, t.Key), Source: "local",
		Remaining: s.Remaining, RetryAfter: s.RetryAfter.Seconds(), ResetAfter: s.ResetAfter.Seconds(),
		BannedFor: banLeft(s.Decision), BanLevel: s.BanLevel}
	if z.Store() != nil {
		info.Source = "redis"
	}
	if h := viewOf(z).overrides; h != nil {
		if rec, ok := h.lookup(z, t.Key); ok {
			info.Override = &rec
		}
	}
	switch {
	case z.IsConcurrency():
		info.InUse, info.Concurrency = &s.InFlight, s.Limit
	case z.IsQuota():
		info.Used, info.Quota, info.Per, info.TimeZone = &s.Used, s.Limit, z.Period.String(), z.Location.String()
		info.PeriodStart, info.PeriodEnd = s.PeriodStart.Format(time.RFC3339), s.PeriodEnd.Format(time.RFC3339)
	default:
		info.Events, info.Burst = t.Plan.Events, t.Plan.Burst
		info.Window, info.WindowSeconds = shortDuration(t.Plan.Window.String()), t.Plan.Window.Seconds()
		info.Share, info.Region = keyShare(z, t.Key)
	}
	info.usdFields = usdFieldsOf(viewOf(z).handler, s.Limit, s.Remaining, info.Used)
	if s.Source == zones.SourceRecord {
		// Async mode: this instance's lease decides the key's next
		// request here; Redis's view, the fleet's, goes beside it.
		info.Source = "instance"
		switch f, err := z.PeekStore(r.Context(), t.Key, monotime.Now()); {
		case errors.Is(err, zones.ErrUnknownKey):
			info.Fleet = &fleetView{Remaining: t.Plan.Burst}
		case err != nil:
			info.FleetError = "reading the key from Redis: " + err.Error()
		default:
			info.Fleet = &fleetView{Remaining: f.Remaining, RetryAfter: f.RetryAfter.Seconds(), ResetAfter: f.ResetAfter.Seconds()}
		}
	}
	return writeJSON(w, http.StatusOK, info)
}

// banLeft is the seconds a peeked key's ban has left, 0 when not banned.
func banLeft(d zones.Decision) float64 {
	if !d.Banned {
		return 0
	}
	return d.RetryAfter.Seconds()
}

// bansInfo is GET /rate_limit/zones/<zone>/bans: the zone's current bans,
// longest left first, at most 1000 (those ending last).
type bansInfo struct {
	Zone string `json:"zone"`
	// "fleet": every instance's bans, from Redis; "instance": the bans
	// this instance knows of (local mode).
	View string    `json:"view"`
	Bans []banInfo `json:"bans"`
}

type banInfo struct {
	keyName
	BannedFor float64 `json:"banned_for"`          // seconds left
	BanLevel  int     `json:"ban_level,omitempty"` // when known
}

func (a *AdminAPI) bans(w http.ResponseWriter, r *http.Request, z *zones.Zone) error {
	if z.Ban == 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s does not ban: add e.g. ban 1h to it", z.Name)}
	}
	list, fleet, err := z.ListBans(r.Context(), monotime.Now())
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the bans from Redis: %v", err)}
	}
	out := bansInfo{Zone: z.Name, View: "instance", Bans: make([]banInfo, 0, len(list))}
	if fleet {
		out.View = "fleet"
	}
	for _, b := range list {
		out.Bans = append(out.Bans, banInfo{keyName: newKeyName(b.Key), BannedFor: b.Left.Seconds(), BanLevel: b.Level})
	}
	return writeJSON(w, http.StatusOK, out)
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
		// This instance's state is gone; whether Redis's is, is not known
		// (a command that timed out may still run). Say exactly that.
		return writeJSON(w, http.StatusServiceUnavailable, partialReset{
			Error: fmt.Sprintf("reset this instance's state for the key, but Redis did not confirm its reset (%v): "+
				"until a DELETE succeeds, the key may keep its limit in Redis, for every instance, until it expires there", err),
			Reset:       []string{"local"},
			Unconfirmed: []string{"redis"},
		})
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// partialReset is the answer to a DELETE that reset this instance's state but
// got no answer from Redis.
type partialReset struct {
	Error       string   `json:"error"`
	Reset       []string `json:"reset"`
	Unconfirmed []string `json:"unconfirmed"`
}

// topInfo is GET /rate_limit/zones/<zone>/top: the keys this instance denied
// most over the last one to two zones.OffendersPeriod, from the zone's
// fixed-size sketch. Each key's true denial count lies in
// [denials-error, denials], and no key missing from the list was denied more
// than floor times (which lets `caddy rate-limit top` merge instances).
type topInfo struct {
	Zone      string         `json:"zone"`
	View      string         `json:"view"`                // "instance": this Caddy's denials only; "merged" by the CLI
	Addresses []string       `json:"addresses,omitempty"` // the admin addresses the CLI merged
	Since     time.Time      `json:"since"`               // start of the window counted
	Denials   uint64         `json:"denials"`             // every denial in the window, all keys
	Floor     uint64         `json:"floor"`               // most denials of a key not listed
	Capacity  int            `json:"capacity"`            // keys tracked per period
	DryRun    bool           `json:"dry_run,omitempty"`   // the denials are a dry run's would-be denials
	Keys      []offenderInfo `json:"keys"`
}

// offenderInfo is one key of the top list, with its state now.
type offenderInfo struct {
	keyName
	Denials    uint64  `json:"denials"`
	Error      uint64  `json:"error"`
	Limited    bool    `json:"limited"`   // denied if it sent a request now (concurrency zones: no slot free)
	Remaining  int64   `json:"remaining"` // quota left (concurrency zones: free slots)
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
	BannedFor  float64 `json:"banned_for,omitempty"`  // zones with ban: the seconds its ban has left
	StateError string  `json:"state_error,omitempty"` // the store could not be read
}

// defaultTopN is how many keys GET .../top returns without ?n=.
const defaultTopN = 20

func (a *AdminAPI) top(w http.ResponseWriter, r *http.Request, z *zones.Zone) error {
	offenders := z.State().Offenders
	n := defaultTopN
	if s := r.URL.Query().Get("n"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("n=%q: want a positive number of keys (e.g. n=20)", s)}
		}
	}
	now := time.Now()
	sum := offenders.Top(n, now.UnixNano())
	out := topInfo{
		Zone:     z.Name,
		View:     "instance",
		Since:    time.Unix(0, sum.Since).UTC(),
		Denials:  sum.Total,
		Floor:    sum.Floor,
		Capacity: offenders.Capacity(),
		DryRun:   z.DryRun,
		Keys:     make([]offenderInfo, 0, len(sum.Top)),
	}
	for _, e := range sum.Top {
		o := offenderState(r.Context(), z, e.Key, monotime.Now())
		o.keyName, o.Denials, o.Error = newKeyName(e.Key), e.Count, e.Error
		out.Keys = append(out.Keys, o)
	}
	return writeJSON(w, http.StatusOK, out)
}

// offenderState is key's state now, as GET .../keys/<key> reads it.
func offenderState(ctx context.Context, z *zones.Zone, key string, now int64) offenderInfo {
	_, s, err := readKey(ctx, z, key, now)
	if err != nil {
		return offenderInfo{StateError: err.Error()}
	}
	return offenderInfo{Limited: !s.Allowed, Remaining: s.Remaining,
		RetryAfter: s.RetryAfter.Seconds(), ResetAfter: s.ResetAfter.Seconds(), BannedFor: banLeft(s.Decision)}
}

// noState is what "not tracked" means, in the 404 of a key with no state.
// A key the zone tracks that is back to its full limit is a 200 (remaining
// = burst): the zone may drop such a key at any time, after which it is not
// tracked, and its next request is decided the same either way.
func noState(z *zones.Zone) string {
	where := "on this instance"
	if z.Store() != nil {
		where = "in Redis"
	}
	return "no state " + where + ": its next request is decided as a new key's, with the full limit"
}

// storedForms are the keys the zone may store a key given to GET or DELETE
// as, most likely first: the key a request carried (a client's address in
// a prefix zone, a long Authorization header), which the zone transforms
// as it does a request's key (zones.Config.Key: masked, hashed); and, for
// a key that reads like a hashed one, the key as given, since top, bans
// and {http.rate_limit.exceeded.key} show keys as stored and Key would
// hash "sha256:<hex>" again. A masked key ("127.0.0.0/24") is no address
// and stays as it is.
func storedForms(z *zones.Zone, key string) []string {
	stored := z.Config.Key(key)
	if stored != key && strings.HasPrefix(key, zones.HashedKeyPrefix) {
		return []string{stored, key}
	}
	return []string{stored}
}

// readKey is the one read (zones.Ticket.Read) of key as the zone stores
// it: the first of its stored forms the zone tracks, else the first, under
// the plan it was last decided under and the override in force.
func readKey(ctx context.Context, z *zones.Zone, key string, now int64) (verdict, zones.KeyState, error) {
	var first verdict
	var firstState zones.KeyState
	for i, stored := range storedForms(z, key) {
		t := verdict{Zone: z, Key: stored, Raw: key, Plan: z.LastPlan(stored, now), Cost: 1}
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

// storedAs is keyInfo's StoredAs: stored when it is not key.
func storedAs(key, stored string) string {
	if stored == key {
		return ""
	}
	return stored
}

func methodNotAllowed(w http.ResponseWriter, allowed ...string) error {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed: use " + strings.Join(allowed, " or "))}
}

// writeJSON writes v with status as plain JSON: keys such as "<zone>" are
// not HTML-escaped, the admin API is not a web page.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// shortDuration turns Go's "1h0m0s" into "1h".
func shortDuration(s string) string {
	if d, err := time.ParseDuration(s); err == nil {
		s = d.String()
		if strings.HasSuffix(s, "m0s") {
			s = s[:len(s)-2]
		}
		if strings.HasSuffix(s, "h0m") {
			s = s[:len(s)-2]
		}
	}
	return s
}

// Interface guards
var _ caddy.AdminRouter = (*AdminAPI)(nil)
