// Package ratelimit is tally: the Caddy HTTP handler http.handlers.rate_limit,
// which limits requests in named zones keyed by placeholders, with GCRA
// enforced in-process or, across Caddy instances, in Redis.
//
// The handler's lifecycle is in this file, the request path (ServeHTTP)
// in serve.go and header rendering in headers.go; the maths is in package
// algorithms; a zone's state and fail policy are in package zones; Redis is
// spoken to only in package distributed.
package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits the rate of requests in one or more zones. A request is
// allowed only when every zone whose matchers accept it allows it; a request
// one zone denies consumes nothing in the others. Denials are returned as
// errors with the configured status (429 by default), so `handle_errors` can
// shape the response.
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

	// Do not record metrics for this handler.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Decide, count, log and set headers, but never deny: for trying a
	// limit on live traffic.
	DryRun bool `json:"dry_run,omitempty"`

	zones    []*zoneHandler // tightest first
	weighted bool           // a zone counts cost in metrics
	headers  headerMode
	values   *valueCache  // header values rendered before
	rendered *renderCache // responses' headers rendered before; nil with headers off
	events   *caddyevents.App
	ctx      caddy.Context
	logger   *zap.Logger
	denyLog  *zap.Logger // sampled
	// placeholders: some zone's key, limit or cost reads the replacer.
	placeholders bool
	live         *liveState // what requests update
	stateIDs     []stateID
	store        zones.Store // nil in local mode
	storeKey     string      // to release store from its pool
	// budget is, in strict mode, the most a request waits for Redis in
	// all (see storeContext); 0 when decisions never wait for Redis.
	budget time.Duration
	// stopResets unsubscribe the zones from resets made elsewhere.
	stopResets []func()
}

// Zone is one named limit: events per window per key.
type Zone struct {
	// The key template: placeholders such as {client_ip} or
	// {http.request.header.Authorization}. Requests with the same expanded
	// key share a limit. Required.
	Key string `json:"key,omitempty"`

	// Only requests that match one of these matcher sets count in this
	// zone. All requests count when it is empty.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// How many requests a key may make per window. Required (except in a
	// concurrency zone): with max_events_placeholder, it is the fallback.
	MaxEvents int64 `json:"max_events,omitempty"`

	// The window. Required (except in a concurrency zone): with
	// window_placeholder, it is the fallback.
	Window caddy.Duration `json:"window,omitempty"`

	// How many requests a key may make at once. Default: max_events, so a
	// fresh key may send max_events at once and then one every
	// window/max_events. 1 gives a perfectly smooth rate.
	Burst int64 `json:"burst,omitempty"`

	// A placeholder, such as {plan_rpm} set by a `map` of the customer's
	// plan or a JWT claim, whose value is this request's max_events: limits
	// per plan. A value that is empty, not a whole number or out of range
	// (1 to 2^40) is replaced by max_events, counted in
	// caddy_rate_limit_plan_fallbacks_total and logged (sampled).
	MaxEventsPlaceholder string `json:"max_events_placeholder,omitempty"`

	// A placeholder whose value (a duration such as 1m or 1h) is this
	// request's window; window is the fallback, as for max_events.
	WindowPlaceholder string `json:"window_placeholder,omitempty"`

	// A placeholder whose value is this request's burst; burst (or the
	// request's max_events when burst is not set) is the fallback.
	BurstPlaceholder string `json:"burst_placeholder,omitempty"`

	// What one request costs, in the units max_events counts, when it is
	// known before the request runs (a weighted endpoint). Default: 1. It
	// may not exceed burst: such a request could never pass. With
	// cost_placeholder it is the fallback; in a post-charged zone it is
	// what a counted response charges.
	Cost int64 `json:"cost,omitempty"`

	// A placeholder whose value is this request's cost, such as
	// {http.request.header.X-Search-Cost}. A value that is empty, not a
	// whole number or negative counts as cost (counted in
	// caddy_rate_limit_cost_fallbacks_total and logged); 0 passes without
	// consuming; more than the burst is denied at once (it could never
	// pass) with a warning in the log.
	CostPlaceholder string `json:"cost_placeholder,omitempty"`

	// Makes the zone post-charged, counting only responses that match:
	// status codes or classes and headers, as Caddy's response matchers
	// (e.g. status 401 403 to limit failed logins). Before the request the
	// key is only checked (denied when it has no quota left); after the
	// response, when it matches, cost is charged, past the burst if need
	// be, so that the key is then denied until the debt is paid. Errors
	// returned down the chain match with their status.
	Count *caddyhttp.ResponseMatcher `json:"count,omitempty"`

	// Makes the zone post-charged, charging after every response (every
	// matching one with count) what this placeholder says then, such as
	// {http.response.header.X-Tokens-Used}. An empty, non-numeric or
	// negative value charges cost (counted in
	// caddy_rate_limit_cost_fallbacks_total); one charge counts at most two
	// bursts.
	Charge string `json:"charge,omitempty"`

	// When the key is an IPv4 address, limit its /ipv4_prefix network
	// instead of the address (e.g. 24).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// When the key is an IPv6 address, limit its /ipv6_prefix network
	// instead of the address (e.g. 64).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// What to do when Redis cannot answer: "local" (default) enforces this
	// instance's share of the limit in-process, "open" allows, "closed"
	// denies. Only meaningful with distributed.
	FailPolicy string `json:"fail_policy,omitempty"`

	// The most keys this zone keeps in memory. When full, expired keys
	// are evicted first. Default: 1000000.
	MaxKeys int64 `json:"max_keys,omitempty"`

	// Decide and report, but never deny.
	DryRun bool `json:"dry_run,omitempty"`

	// Makes this a concurrency zone: at most this many requests of a key
	// in flight at once, instead of max_events per window (which must then
	// be left out). A request holds its slot until the handlers after this
	// one return, whatever happens to it (error, panic, client gone,
	// hijacked connection closed). Denials carry Retry-After: 1.
	Concurrency int64 `json:"concurrency,omitempty"`

	// With distributed: how long a slot held in Redis outlives the last
	// renewal of the instance that took it, so that an instance that dies
	// with requests in flight frees their slots within lease. Instances
	// renew their slots every lease/3 while the requests run. At least 1s.
	// Default: 30s.
	Lease caddy.Duration `json:"lease,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// zoneHandler is a provisioned zone: its matchers, key template and the
// zones.Zone that decides.
type zoneHandler struct {
	*zones.Zone
	matchers caddyhttp.MatcherSets
	key      string // the key template
	keyVar   string // when the template is exactly one placeholder: its name
	// keyHeader is, when the template is exactly one request header
	// placeholder, the header's canonical name: read from the request
	// directly, as Caddy's replacer would, but without boxing the value
	// into an interface (an allocation per request).
	keyHeader string
	nameValue any // the zone's name as a placeholder value, boxed once
	vars      planVars
	costs     costVars
	dryRun    bool
	denyErr   error        // the error a denial wraps
	denial    error        // the HandlerError a denial returns, boxed once
	metrics   *zoneMetrics // nil when metrics are disabled
	timed     bool         // metrics on and every decision asks Redis (strict)
}

// DefaultSweepInterval is how often expired keys are swept by default.
const DefaultSweepInterval = time.Minute

// Provision sets up the handler.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	// A flood of denials must not flood the log: the first 10 per second,
	// then one in a thousand.
	h.denyLog = h.logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 10, 1000)
	}))

	var err error
	if h.headers, err = parseHeaderMode(h.Headers); err != nil {
		return err
	}
	h.values = newValueCache()
	h.live = new(liveState)
	if h.headers != headersOff {
		h.rendered = new(renderCache)
	}
	if h.StatusCode == 0 {
		h.StatusCode = http.StatusTooManyRequests
	}
	if h.SweepInterval == 0 {
		h.SweepInterval = caddy.Duration(DefaultSweepInterval)
	}
	if len(h.RateLimits) == 0 {
		return errors.New("rate_limit: at least one zone is required")
	}

	eventsApp, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("loading events app: %v", err)
	}
	h.events = eventsApp.(*caddyevents.App)

	if h.Distributed != nil {
		if h.store, h.storeKey, err = h.Distributed.open(ctx, h.logger); err != nil {
			return err
		}
		if h.Distributed.Mode != "async" {
			h.budget = time.Duration(h.Distributed.Timeout)
			if h.budget <= 0 {
				h.budget = distributed.DefaultTimeout
			}
		}
	}
	if !h.DisableMetrics {
		if err := registerMetrics(ctx); err != nil {
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
		h.placeholders = h.placeholders || z.keyHeader == "" || z.vars.any() || z.costs.costVar != ""
		h.weighted = h.weighted || (z.metrics != nil && z.metrics.cost != nil)
	}
	// Tightest first: the zone most likely to deny decides before the
	// others spend anything (a refund, a Redis round trip).
	slices.SortFunc(h.zones, compareZones)
	return nil
}

// compareZones orders zones tightest first: by rate, then burst, then name;
// concurrency zones after every rate zone (compareConcurrency).
func compareZones(a, b *zoneHandler) int {
	if a.IsConcurrency() || b.IsConcurrency() {
		return compareConcurrency(a, b)
	}
	ra := float64(a.Events) / float64(a.Window)
	rb := float64(b.Events) / float64(b.Window)
	switch {
	case ra != rb:
		if ra < rb {
			return -1
		}
		return 1
	case a.Limit().Burst != b.Limit().Burst:
		// Not the difference: as an int it would wrap where int is
		// 32 bits (bursts go to 2^40).
		return cmp.Compare(a.Limit().Burst, b.Limit().Burst)
	}
	return strings.Compare(a.Name, b.Name)
}

// compareConcurrency orders concurrency zones after rate zones, smallest
// concurrency first: a request a rate zone denies never takes a slot, and a
// slot, unlike a GCRA step, has to be given back.
func compareConcurrency(a, b *zoneHandler) int {
	switch {
	case !a.IsConcurrency():
		return -1
	case !b.IsConcurrency():
		return 1
	case a.Concurrency != b.Concurrency:
		if a.Concurrency < b.Concurrency {
			return -1
		}
		return 1
	}
	return strings.Compare(a.Name, b.Name)
}

func (h *Handler) provisionZone(ctx caddy.Context, name string, zc *Zone) (*zoneHandler, error) {
	policy, err := zones.ParseFailPolicy(zc.FailPolicy)
	if err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	cfg := zones.Config{
		Name:       name,
		Events:     zc.MaxEvents,
		Window:     time.Duration(zc.Window),
		Burst:      zc.Burst,
		IPv4Prefix: zc.IPv4Prefix,
		IPv6Prefix: zc.IPv6Prefix,
		FailPolicy: policy,
		MaxKeys:    zc.MaxKeys,
		DryRun:     zc.DryRun || h.DryRun,

		Concurrency: zc.Concurrency,
		Lease:       time.Duration(zc.Lease),
	}
	vars := planVars{events: zc.MaxEventsPlaceholder, window: zc.WindowPlaceholder, burst: zc.BurstPlaceholder}
	for _, v := range []*string{&vars.events, &vars.window, &vars.burst} {
		if *v == "" {
			continue
		}
		ph := singlePlaceholder(*v)
		if ph == "" {
			return nil, fmt.Errorf("zone %s: %q is not a placeholder: write one placeholder such as {plan_rpm}", name, *v)
		}
		*v = ph
	}
	cfg.PerRequest = vars.any()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	plan, _ := cfg.Plan()
	costs, err := zoneCosts(name, zc, plan)
	if err != nil {
		return nil, err
	}
	if zc.Key == "" {
		return nil, fmt.Errorf("zone %s: key is required (e.g. key {client_ip})", name)
	}
	if err := claimZoneName(ctx, cfg, vars); err != nil {
		return nil, err
	}
	state, id, err := loadState(cfg, vars, time.Duration(h.SweepInterval))
	if err != nil {
		return nil, err
	}
	h.stateIDs = append(h.stateIDs, id)

	zh := &zoneHandler{
		key:     zc.Key,
		keyVar:  singlePlaceholder(zc.Key),
		vars:    vars,
		costs:   costs,
		dryRun:  cfg.DryRun,
		denyErr: fmt.Errorf("rate limit exceeded in zone %s", name),
	}
	zh.denial = caddyhttp.HandlerError{StatusCode: h.StatusCode, Err: zh.denyErr}
	zh.keyHeader = headerPlaceholder(zh.keyVar)
	zh.nameValue = name
	if len(zc.MatcherSetsRaw) > 0 {
		mods, err := ctx.LoadModule(zc, "MatcherSetsRaw")
		if err != nil {
			return nil, fmt.Errorf("zone %s: loading matchers: %v", name, err)
		}
		if err := zh.matchers.FromInterface(mods); err != nil {
			return nil, fmt.Errorf("zone %s: %v", name, err)
		}
	}
	zh.Zone = zones.New(cfg, state, h.store)
	if n, ok := h.store.(interface {
		OnReset(zone string, l distributed.ResetListener) func()
	}); ok {
		// A key reset on another instance is forgotten here too.
		h.stopResets = append(h.stopResets, n.OnReset(name, zh.Zone))
	}
	if !h.DisableMetrics {
		// Async decisions are local: timing them would cost two clock
		// reads per request and fill the store latency histogram with
		// zeros.
		zh.timed = h.store != nil && zh.Mode() == "strict"
		zh.metrics = newZoneMetrics(name, policy, cfg.DryRun, h.store != nil, zh.timed, cfg.PerRequest, costs)
	}
	zh.Zone.OnChargeFailed = func(err error) {
		if zh.metrics != nil {
			zh.metrics.chargeFailures.Inc()
		}
		if c := h.denyLog.Check(zapcore.WarnLevel, "charge after the response did not reach Redis; fail policy applied"); c != nil {
			c.Write(zap.String("zone", name), zap.String("fail_policy", policy.String()), zap.Error(err))
		}
	}
	registerZone(zh.Zone)
	return zh, nil
}

// singlePlaceholder returns the name of the placeholder when the template is
// exactly one placeholder such as {http.request.header.X-API-Key}, the
// common case, which can then be looked up without building a string.
func singlePlaceholder(tpl string) string {
	if len(tpl) < 3 || tpl[0] != '{' || tpl[len(tpl)-1] != '}' || strings.ContainsAny(tpl[1:len(tpl)-1], "{}\\") {
		return ""
	}
	return tpl[1 : len(tpl)-1]
}

// headerPlaceholder returns the canonical header name a placeholder such
// as http.request.header.X-Api-Key reads, or "".
func headerPlaceholder(name string) string {
	if field, ok := strings.CutPrefix(name, "http.request.header."); ok && field != "" {
		return textproto.CanonicalMIMEHeaderKey(field)
	}
	return ""
}

// expandKey expands the zone's key template for the request.
func (z *zoneHandler) expandKey(r *http.Request, repl *caddy.Replacer) string {
	if z.keyHeader != "" {
		// What {http.request.header.*} gives: the values joined by ",".
		switch vals := r.Header[z.keyHeader]; len(vals) {
		case 0:
			return ""
		case 1:
			return vals[0]
		default:
			return strings.Join(vals, ",")
		}
	}
	if z.keyVar != "" {
		v, _ := repl.GetString(z.keyVar)
		return v
	}
	return repl.ReplaceAll(z.key, "")
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

// Cleanup releases the handler's zone states and store. Caddy calls it once
// the handler's config is replaced, when the config it belongs to fails to
// load, and on a handler whose Provision or Validate failed (half-way,
// possibly): it releases exactly what was taken, and only once.
func (h *Handler) Cleanup() error {
	for _, z := range h.zones {
		unregisterZone(z.Zone)
	}
	h.zones = nil
	for _, stop := range h.stopResets {
		stop()
	}
	for _, id := range h.stateIDs {
		_, _ = states.Delete(id)
	}
	h.stateIDs = nil
	if h.store != nil {
		releaseStore(h.storeKey)
		h.store = nil
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
