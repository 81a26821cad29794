// Package ratelimit is tally: the Caddy HTTP handler http.handlers.rate_limit,
// which limits requests in named zones keyed by placeholders, with GCRA
// enforced in-process or, across Caddy instances, in Redis. Importing it
// also registers the listener wrapper caddy.listeners.rate_limit, the admin
// API module admin.api.rate_limit and the `caddy rate-limit` command.
//
// The hub is the Handler and its zones: module.go (config, Provision,
// Cleanup), zoneconfig.go (a zone's provisioned form) and serve.go (the
// request path). The configuration types are package config's, aliased
// here. The other files hang off the hub, one concern each, and use each
// other one way, never in a loop (tests/rootfiles_test.go; the README's
// layout names what each holds). Nothing imports this package.
package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	_ "github.com/caddy-tally/ratelimit/admin"   // registers admin.api.rate_limit
	_ "github.com/caddy-tally/ratelimit/command" // registers caddy rate-limit
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/live"
	_ "github.com/caddy-tally/ratelimit/listener" // registers caddy.listeners.rate_limit
	"github.com/caddy-tally/ratelimit/zones"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits the rate of requests in one or more zones. A request is
// allowed only when every zone whose matchers accept it allows it; a request
// one zone denies consumes nothing in the others. Denials are returned as
// errors with the configured status (429 by default), so `handle_errors` can
// shape the response; on a server without error routes the status is
// written directly.
//
// On a denial, this module sets the following placeholders (which can be
// used after this handler; for example, in `handle_errors` or in response
// headers):
//
// Placeholder | Description
// ------------|-------------
// `{http.rate_limit.exceeded.name}` | The name of the zone that denied the request
// `{http.rate_limit.exceeded.key}` | The key the zone denied, as the zone stores it: the expanded key template, masked to ipv4_prefix/ipv6_prefix, hashed when over 256 bytes
//
// and emits the event `rate_limit_exceeded`, whose data is:
//
// Field | Description
// ------|-------------
// `zone` | The name of the zone that denied the request
// `key` | The key it denied, as in the placeholder (whatever log_key says: event handlers see it)
// `retry_after` | How long the key has to wait, jitter included (a time.Duration); the Retry-After header carries it in whole seconds, rounded up
// `remote_addr` | The address of the client's connection (the request's RemoteAddr)
//
// On every request of a handler with a dry-run zone, and on a denial, it
// sets `{http.rate_limit.limited}`: the zones that denied the request or,
// in dry run, would have, comma-separated, tightest first; "" when none.
//
// A zone in dry run denies nothing: its would-be denials set only that
// placeholder and emit no event; they are counted and logged.
//
// A request that a zone with a challenge decided under a solved cookie
// carries `{http.rate_limit.<zone>.identity}`: the cookie's identity, the
// key it was decided under (docs/challenges-protocol.md).
type Handler struct {
	// The rate limit zones, by name. Zone names use letters, digits, '_'
	// and '-'. A zone name defined in several handlers with the same limits
	// shares its state; with different limits it is an error.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// Share zone state across Caddy instances through Redis. Without it,
	// every zone is enforced in this process only.
	Distributed *Distributed `json:"distributed,omitempty"`

	// Which rate limit headers to send: "both" (default), "ietf"
	// (RateLimit-Policy and RateLimit, draft-ietf-httpapi-ratelimit-headers),
	// "legacy" (RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset) or
	// "off". Retry-After is sent on every denial whatever this says.
	Headers string `json:"headers,omitempty"`

	// The HTTP status of a denial. Default: 429.
	StatusCode int `json:"status_code,omitempty"`

	// Adds a random fraction, up to this value, of the wait to Retry-After,
	// so that denied clients do not all come back at once. 0 to 1.
	Jitter float64 `json:"jitter,omitempty"`

	// How often expired keys are swept from memory. Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// Include the rate limit key in denial logs. Keys can be personal data
	// (IP addresses, API keys), so they are left out by default.
	LogKey bool `json:"log_key,omitempty"`

	// Snapshot the handler's local rate zones to Caddy's storage and
	// resume them when Caddy starts again. Without it a restart empties
	// every local zone.
	Persist *Persist `json:"persist,omitempty"`

	// Do not record metrics for this handler.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Decide, count, log and set headers, but never deny: for trying a
	// limit on live traffic.
	DryRun bool `json:"dry_run,omitempty"`

	zones        []*httpZone // tightest first
	weighted     bool        // a zone counts cost in metrics
	bodyCharged  bool        // a zone charges from the response body
	placeholders bool        // some zone's key, limit or cost reads the replacer
	annotates    bool        // a zone is in dry run: allowed requests get {http.rate_limit.limited}
	counted      bool        // counted in annotatingHandlers
	headers      headerMode
	values       *valueCache
	rendered     *renderCache // nil with headers off
	events       *caddyevents.App
	ctx          caddy.Context
	logger       *zap.Logger
	live         *liveState
	persister    *live.Persister // nil without persist
	store        zones.Store     // nil in local mode
	backend      live.Backend
	storeKey     string // to release store from its pool
	// region shares scope global zones' limits with the other regions
	// (nil without a global block); regionKey and globalZones release it.
	region      *distributed.Region
	regionKey   string
	globalZones []string
	// users keeps what the handler took until nothing uses it
	// (handlerUsers); holds: a request must hold it too (a store, and a
	// zone that takes slots or charges after the response).
	users *handlerUsers
	holds bool
	// budget is, in strict mode, the most a request waits for Redis in
	// all (storeContext); 0 when decisions never wait for Redis.
	budget time.Duration
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// DefaultSweepInterval is how often expired keys are swept by default.
const DefaultSweepInterval = live.DefaultSweepInterval

// Provision sets up the handler.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.users = newHandlerUsers(h.releaseShared)
	h.ctx = ctx
	h.logger = ctx.Logger()

	var err error
	if h.headers, err = parseHeaderMode(h.Headers); err != nil {
		return err
	}
	h.values = newValueCache()
	h.live = new(liveState)
	if h.headers != headersOff {
		h.rendered = new(renderCache)
	}
	h.StatusCode = cmp.Or(h.StatusCode, http.StatusTooManyRequests)
	h.SweepInterval = cmp.Or(h.SweepInterval, caddy.Duration(DefaultSweepInterval))
	if len(h.RateLimits) == 0 {
		return errors.New("rate_limit: at least one zone is required")
	}

	eventsApp, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("loading events app: %v", err)
	}
	h.events = eventsApp.(*caddyevents.App)

	if d := h.Distributed; d != nil {
		opts, err := d.StoreOptions(h.logger)
		if err == nil {
			h.store, h.backend, h.storeKey, err = live.OpenStore(opts, h.logger)
		}
		if err != nil {
			return err
		}
		if d.Global != nil {
			opts, err := d.RegionOptions(h.logger)
			if err == nil {
				h.region, h.regionKey, err = live.OpenRegion(h.store, h.storeKey, opts, h.logger)
			}
			if err != nil {
				live.ReleaseStore(h.storeKey)
				h.store = nil
				return err
			}
		}
		if d.Mode != "async" {
			h.budget = cmp.Or(max(time.Duration(d.Timeout), 0), distributed.DefaultTimeout)
		}
	}
	if !h.DisableMetrics {
		if err := live.RegisterMetrics(ctx.GetMetricsRegistry()); err != nil {
			return fmt.Errorf("registering metrics: %v", err)
		}
	}

	for name, zc := range h.RateLimits {
		if zc == nil {
			return fmt.Errorf("zone %s: empty definition", name)
		}
		z, err := h.provisionZone(ctx, name, zc)
		if err != nil {
			return err
		}
		h.zones = append(h.zones, z)
		h.placeholders = h.placeholders || z.readsReplacer()
		h.annotates = h.annotates || z.dryRun
		h.weighted = h.weighted || z.metrics.cost != nil
		h.bodyCharged = h.bodyCharged || z.costs.body != nil
		if h.store != nil && (z.IsConcurrency() || z.costs.postCharged() || z.Delay > 0) {
			h.holds = true
			z.Zone.Hold, z.Zone.Done = h.users.hold, h.users.done
		}
	}
	h.countAnnotating(h.annotates)
	// Tightest first: the zone most likely to deny decides before the others spend anything.
	slices.SortFunc(h.zones, compareZones)
	if h.Persist != nil {
		return h.provisionPersist(ctx)
	}
	return nil
}

// Validate checks the handler's settings that Provision does not.
func (h *Handler) Validate() error {
	if !(h.Jitter >= 0 && h.Jitter <= 1) { // NaN too
		return fmt.Errorf("jitter must be between 0 and 1, not %v", h.Jitter)
	}
	if h.StatusCode < 400 || h.StatusCode > 599 {
		return fmt.Errorf("status must be an HTTP error status (400-599), not %d", h.StatusCode)
	}
	return nil
}

// Cleanup unregisters the handler's zones and lets go of what it took,
// released once nothing uses it (handlerUsers). Caddy also calls it on a
// handler whose Provision or Validate failed half-way: it releases exactly
// what was taken, and only once.
func (h *Handler) Cleanup() error {
	h.countAnnotating(false)
	if h.persister != nil {
		h.persister.Close()
		h.persister = nil
	}
	for _, z := range h.zones {
		z.unregister()
	}
	if h.users != nil {
		h.users.cleanup()
	}
	return nil
}

// releaseShared releases the zone states and stores the handler took.
func (h *Handler) releaseShared() {
	for _, z := range h.zones {
		z.releaseState()
	}
	if h.region != nil {
		live.ReleaseRegion(h.region, h.regionKey, h.globalZones)
	}
	if h.store != nil {
		live.ReleaseStore(h.storeKey)
	}
}

// handlerUsers counts what still uses the pooled resources a handler took
// (zone states, store): its config, until Cleanup, each request in flight
// that holds slots or owes a charge after its response, and each
// strict-mode charge not yet landed. The last to let go releases them.
//
// Caddy cleans up the old handlers before the old servers drain: a reload
// that changes the store's pool key would otherwise close the store under
// running requests, stopping their slots' renewals and releases and failing
// their charges (seen: 4 in flight for a limit of 2, a key locked out for
// its lease, a stream's charges lost).
type handlerUsers struct {
	n       atomic.Int64
	release func()
}

// newHandlerUsers holds the config's reference.
func newHandlerUsers(release func()) *handlerUsers {
	u := &handlerUsers{release: release}
	u.n.Store(1)
	return u
}

// hold takes a reference, unless the resources were released already
// (then the store's calls fail and take the zones' fail policies).
func (u *handlerUsers) hold() bool {
	for n := u.n.Load(); n > 0; n = u.n.Load() {
		if u.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
	return false
}

// done lets go of a reference hold took. The last releases off the
// caller's goroutine: closing a store waits for Redis.
func (u *handlerUsers) done() {
	if u.n.Add(-1) == 0 {
		go u.release()
	}
}

// cleanup lets go of the config's reference; when it is the last, the
// resources are released before it returns.
func (u *handlerUsers) cleanup() {
	if u.n.Add(-1) == 0 {
		u.release()
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
