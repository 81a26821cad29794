package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tally/ratelimit/distributed"
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
//	                                            (concurrency zones: in_use, remaining)
//	DELETE /rate_limit/zones/<zone>/keys/<key>  reset the key (local table, deny cache, Redis)
//	GET    /rate_limit/zones/<zone>/top?n=20    the keys this instance denied most lately
//
// Keys are path-escaped (url.PathEscape) in the URL. Every key, including
// the empty key (requests without the key's header share it) and keys that
// are "." or "..", which a URL path cannot hold as they are, also has the
// address /rate_limit/zones/<zone>/keys?key=<query-escaped key>.
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
	return []caddy.AdminRoute{{Pattern: "/rate_limit/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// zoneInfo is a zone as GET /rate_limit/zones shows it.
type zoneInfo struct {
	Name   string `json:"name"`
	Events int64  `json:"events"`
	// The window as a duration (e.g. "1m", "1h30m") and in seconds.
	Window        string     `json:"window"`
	WindowSeconds float64    `json:"window_seconds"`
	Burst         int64      `json:"burst"`
	Mode          string     `json:"mode"`
	FailPolicy    string     `json:"fail_policy"`
	DryRun        bool       `json:"dry_run"`
	LocalKeys     int        `json:"local_keys"`
	Store         *storeInfo `json:"store,omitempty"`

	Concurrency int64 `json:"concurrency,omitempty"` // concurrency zones only
}

type storeInfo struct {
	OK               bool       `json:"ok"`
	BreakerOpenSince *time.Time `json:"breaker_open_since,omitempty"`
	Instances        int        `json:"instances"`
	// The last error Redis gave about one key (e.g. a value tally did not
	// write, found at a tally key and deleted), and when.
	LastProblem   string     `json:"last_problem,omitempty"`
	LastProblemAt *time.Time `json:"last_problem_at,omitempty"`
	// On a Redis Cluster, the masters the store cannot reach now and since
	// when; their keys use the fail policy, every other key is decided in
	// Redis. A master replaced by its promoted replica leaves the list.
	Unreachable []nodeOutage `json:"unreachable_nodes,omitempty"`
}

// nodeOutage is one unreachable Redis Cluster master.
type nodeOutage struct {
	Node  string    `json:"node"`
	Since time.Time `json:"since"`
}

// keyInfo is a key as GET /rate_limit/zones/<zone>/keys/<key> shows it.
// Durations are in seconds.
type keyInfo struct {
	Zone       string  `json:"zone"`
	Key        string  `json:"key"`
	Remaining  int64   `json:"remaining"`
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
	// The limit the key was last decided under: the zone's literal one, or
	// the plan its last request carried (events/window/burst placeholders).
	Events        int64   `json:"events"`
	Window        string  `json:"window"`
	WindowSeconds float64 `json:"window_seconds"`
	Burst         int64   `json:"burst"`
	// Where the answer comes from: "local" (this instance's table) or
	// "redis" (the state every instance shares).
	Source string `json:"source"`
}

// outageReporter is what a store that can tell which Redis nodes are down
// offers.
type outageReporter interface {
	Outages() []distributed.NodeOutage
}

// healthReporter is what a store that can tell its health offers.
type healthReporter interface {
	Health() (ok bool, openSince time.Time)
	LastProblem() (string, time.Time)
}

func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	rest, _ := strings.CutPrefix(r.URL.EscapedPath(), "/rate_limit/")
	parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	switch {
	case len(parts) == 1 && parts[0] == "zones":
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
		return writeJSON(w, listZones())
	case len(parts) == 4 && parts[0] == "zones" && parts[2] == "keys",
		len(parts) == 3 && parts[0] == "zones" && parts[2] == "keys" && r.URL.Query().Has("key"):
		zoneName, err1 := url.PathUnescape(parts[1])
		var key string
		var err2 error
		if len(parts) == 4 {
			key, err2 = url.PathUnescape(parts[3])
		} else {
			key = r.URL.Query().Get("key")
		}
		if err := errors.Join(err1, err2); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		z := lookupZone(zoneName)
		if z == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown zone %q", zoneName)}
		}
		switch r.Method {
		case http.MethodGet:
			return a.getKey(w, r, z, key)
		case http.MethodDelete:
			return a.resetKey(w, r, z, key)
		}
		return methodNotAllowed(w, http.MethodGet, http.MethodDelete)
	case len(parts) == 3 && parts[0] == "zones" && parts[2] == "top":
		zoneName, err := url.PathUnescape(parts[1])
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		z := lookupZone(zoneName)
		if z == nil {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown zone %q", zoneName)}
		}
		return a.top(w, r, z)
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound,
		Err: errors.New("unknown path: use /rate_limit/zones, /rate_limit/zones/<zone>/keys/<key> (or .../keys?key=<key>, for any key including the empty one) or /rate_limit/zones/<zone>/top")}
}

func listZones() []zoneInfo {
	live := liveZones()
	out := make([]zoneInfo, 0, len(live))
	for _, z := range live {
		zi := zoneInfo{
			Name:       z.Name,
			Events:     z.Events,
			Window:     shortDuration(z.Window.String()),
			Burst:      z.Limit().Burst,
			Mode:       z.Mode(),
			FailPolicy: z.FailPolicy.String(),
			DryRun:     z.DryRun,
			LocalKeys:  z.Keys(),
		}
		zi.WindowSeconds = z.Window.Seconds()
		zi.Concurrency = z.Concurrency
		if s := z.Store(); s != nil {
			zi.Store = &storeInfo{OK: true, Instances: s.Instances()}
			if hr, ok := s.(healthReporter); ok {
				ok, since := hr.Health()
				zi.Store.OK = ok
				if !ok {
					zi.Store.BreakerOpenSince = &since
				}
				if or, ok := s.(outageReporter); ok {
					for _, o := range or.Outages() {
						if o.Node != "" {
							zi.Store.Unreachable = append(zi.Store.Unreachable, nodeOutage{o.Node, o.Since})
						}
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
	if z.IsConcurrency() {
		return a.getSlots(w, r, z, key)
	}
	now := monotime.Now()
	d, err := z.Peek(r.Context(), key, now)
	switch {
	case errors.Is(err, zones.ErrUnknownKey):
		// Caddy logs admin errors: the message leaves the key out (keys
		// can be personal data; log_key governs them).
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s has no state for this key (it is at its full limit)", z.Name)}
	case err != nil:
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the key from Redis: %v", err)}
	}
	source := "local"
	if z.Store() != nil {
		source = "redis"
	}
	plan := z.LastPlan(key, now)
	return writeJSON(w, keyInfo{
		Zone:          z.Name,
		Key:           key,
		Remaining:     d.Remaining,
		RetryAfter:    d.RetryAfter.Seconds(),
		ResetAfter:    d.ResetAfter.Seconds(),
		Events:        plan.Events,
		Window:        shortDuration(plan.Window.String()),
		WindowSeconds: plan.Window.Seconds(),
		Burst:         plan.Burst,
		Source:        source,
	})
}

func (a *AdminAPI) resetKey(w http.ResponseWriter, r *http.Request, z *zones.Zone, key string) error {
	if z.IsConcurrency() {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errResetSlots}
	}
	if _, err := z.Peek(r.Context(), key, monotime.Now()); errors.Is(err, zones.ErrUnknownKey) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s has no state for this key", z.Name)}
	}
	if err := z.Reset(r.Context(), key); err != nil {
		// This instance's state is gone; whether Redis's is, is not known
		// (a command that timed out may still run). Say exactly that.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		return json.NewEncoder(w).Encode(partialReset{
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

func methodNotAllowed(w http.ResponseWriter, allowed ...string) error {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed: use " + strings.Join(allowed, " or "))}
}

// writeJSON writes v as plain JSON: keys such as "<zone>" are not
// HTML-escaped, the admin API is not a web page.
func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// Interface guards
var _ caddy.AdminRouter = (*AdminAPI)(nil)
