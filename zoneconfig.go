package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// Zone is one named limit: events per window per key, a calendar quota
// per key, or requests in flight per key.
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
	// (1 to 2^40, and max_events_at_most) is replaced by max_events, counted
	// in caddy_rate_limit_plan_fallbacks_total and logged (sampled). The
	// value must come from the operator, not the client: see
	// max_events_at_most.
	MaxEventsPlaceholder string `json:"max_events_placeholder,omitempty"`

	// A placeholder whose value (a duration such as 1m or 1h) is this
	// request's window; window is the fallback, as for max_events.
	WindowPlaceholder string `json:"window_placeholder,omitempty"`

	// A placeholder whose value is this request's burst; burst (or the
	// request's max_events when burst is not set) is the fallback.
	BurstPlaceholder string `json:"burst_placeholder,omitempty"`

	// With max_events_placeholder, the most events a request's value may
	// give: a larger one falls back to max_events, counted and logged as an
	// unusable value. A placeholder the client sets (a request header, a
	// query string) can otherwise pick up to 2^40 events: plans should come
	// from the operator (a map, a verified JWT claim), and this bounds them.
	// At least max_events.
	MaxEventsAtMost int64 `json:"max_events_at_most,omitempty"`

	// With window_placeholder, the shortest window a request's value may
	// give: a shorter one falls back to window, as max_events_at_most does.
	// At most window.
	WindowAtLeast caddy.Duration `json:"window_at_least,omitempty"`

	// With burst_placeholder, the largest burst a request's value may give:
	// a larger one falls back, as max_events_at_most does. At least burst.
	BurstAtMost int64 `json:"burst_at_most,omitempty"`

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
	// pass) with a warning in the log. With charge or charge_json it is an
	// estimate: taken before the request (a key without the budget is
	// refused before the upstream is called), and the difference with
	// what the response charges is charged or refunded after it.
	CostPlaceholder string `json:"cost_placeholder,omitempty"`

	// A floor on cost_placeholder's values: a value below it costs
	// cost_at_least (so that a client cannot make its requests free with
	// 0), counted in caddy_rate_limit_cost_fallbacks_total. At most cost.
	// A cost the client sets (http.request.*) without it logs a warning
	// when the zone is provisioned.
	CostAtLeast int64 `json:"cost_at_least,omitempty"`

	// A bound on cost_placeholder's values: a value above it costs
	// cost_at_most (not the fallback: asking for more never costs less),
	// counted in caddy_rate_limit_cost_fallbacks_total. At least cost.
	CostAtMost int64 `json:"cost_at_most,omitempty"`

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

	// Makes the zone post-charged from the response body: what it charges
	// is the sum of these dot paths of object keys (usage.total_tokens,
	// from the document's root or else from below one of its top-level
	// keys), read from an application/json response, or from a text/event-stream
	// response's events (each path from the last event whose data carries
	// it), while the body streams through untouched. Each path's value
	// must be a whole number >= 0, and all of them must be found; when
	// they are not (no usage, malformed JSON, a compressed body, the client
	// left, an upstream error), the response charges cost_placeholder's
	// estimate, or else cost, counted in
	// caddy_rate_limit_charge_fallbacks_total by reason. Not with charge.
	ChargeJSON []string `json:"charge_json,omitempty"`

	// Makes the zone post-charged in dollars: each response's token usage
	// (read as charge tokens reads it) priced by its model. The zone's
	// unit must be usd. A response with no usage, or whose model has no
	// price and there is no default, charges cost_placeholder's estimate,
	// or else cost, counted in caddy_rate_limit_charge_fallbacks_total by
	// reason (no_price for the latter). Not with charge or charge_json.
	ChargeUSD *ChargeUSD `json:"charge_usd,omitempty"`

	// "usd": the zone's amounts (max_events, burst, quota.limit, cost and
	// the placeholders' values) are whole micro-dollars, which the
	// Caddyfile writes as dollars (quota 20 usd per month). Requires
	// charge_usd.
	Unit string `json:"unit,omitempty"`

	// "request": in a zone that charges LLM tokens or dollars, the cost
	// taken before the request is estimated from its body (read once, at
	// most 1 MiB; the upstream gets every byte): its prompt's bytes ÷ 4 in
	// input tokens, its max_tokens (or the API's like of it) in output
	// tokens, else the 95th percentile of the output of the zone's
	// responses of its model, priced as the charge prices tokens; it takes
	// at most what the key has left, and the response settles it
	// (docs/llm.md).
	Estimate string `json:"estimate,omitempty"`

	// In a zone that charges LLM tokens or dollars, the ends of the paths
	// of the OpenAI chat-completions endpoints whose streaming requests,
	// when they do not ask for their usage, get
	// stream_options.include_usage added (and the usage chunk that adds
	// stripped from the response); ["off"]: none. Default:
	// ["/chat/completions"].
	IncludeUsage []string `json:"include_usage,omitempty"`

	// Makes the zone post-charged from the response body's token usage,
	// read with no path from every common LLM API's format (OpenAI Chat
	// Completions and Responses, Anthropic Messages, Gemini, Ollama; JSON,
	// server-sent events, Ollama's NDJSON): "input" (cached input
	// included), "output" (reasoning included) or "total". A response
	// without usage charges as with charge_json (the estimate, or cost,
	// counted by reason); each charged one is counted in
	// caddy_rate_limit_token_charges_total by format. Not with charge or
	// charge_json.
	ChargeTokens string `json:"charge_tokens,omitempty"`

	// When the key is an IPv4 address, limit its /ipv4_prefix network
	// instead of the address (e.g. 24).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// When the key is an IPv6 address, limit its /ipv6_prefix network
	// instead of the address (e.g. 64).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// What to do when Redis cannot answer: "local" (default) enforces this
	// instance's part of the limit in-process, "open" allows, "closed"
	// denies. Only meaningful with distributed.
	FailPolicy string `json:"fail_policy,omitempty"`

	// The most keys this zone keeps in memory. When full, expired keys
	// are evicted first. Default: 1000000.
	MaxKeys int64 `json:"max_keys,omitempty"`

	// Decide and report, but never deny.
	DryRun bool `json:"dry_run,omitempty"`

	// "region" (default): with distributed, the limit holds in this
	// region's Redis. "global": the limit holds across every region of
	// distributed's global block, each region enforcing its share of each
	// key in its own Redis. Rate zones only.
	Scope string `json:"scope,omitempty"`

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

	// Makes this a quota zone: at most quota.limit units of cost per
	// calendar period (a minute, hour, day, ISO week or month of a time
	// zone), counted from 0 at each period's start, instead of max_events
	// per window (which must then be left out). cost, count and charge
	// count units as in a rate zone; a post-charged quota ends a period in
	// debt by at most one charge. Denials carry Retry-After: the seconds to
	// the period's end.
	Quota *Quota `json:"quota,omitempty"`

	// A key this zone denies for lack of quota is then denied for this
	// long (a ban), fleet-wide with distributed, whatever the rate gives
	// back meanwhile: Retry-After is the ban's remaining time. A ban never
	// admits more than the zone without one: after it, the key has what
	// the rate gave back. Not in concurrency or quota zones. Dry run only
	// logs and counts the bans it would start.
	Ban caddy.Duration `json:"ban,omitempty"`

	// With ban, makes bans escalate: each ban of a key that starts within
	// ban_max of its last ban's end lasts twice the last one, at most
	// ban_max; a key not banned for ban_max starts over at ban.
	BanMax caddy.Duration `json:"ban_max,omitempty"`

	// Lets a request the zone would deny wait for its turn instead, when
	// that turn is at most this far away (at most 1m): its slot is reserved
	// at once (fleet-wide in strict mode, in the same Redis step), the
	// request waits, then goes on with the headers of an allowed one and
	// {http.rate_limit.delay} set to its wait. A client that goes away
	// while waiting gives its slot back. Requests further away are denied
	// as without delay; Retry-After is when they would pass at once. Not
	// in concurrency, quota or post-charged (count, charge) zones.
	Delay caddy.Duration `json:"delay,omitempty"`

	// With delay: at most this many requests of the zone wait at once on
	// this instance; beyond it a request is decided as without delay
	// (denied when over the limit). Default: 1000.
	Queue int64 `json:"queue,omitempty"`

	// Makes this an adaptive concurrency zone: a concurrency zone whose
	// limit of requests in flight per key is not fixed but follows the
	// upstream's latency toward a target (docs/configuration.md, adaptive
	// concurrency zones), decided on
	// this instance whatever distributed says. Shed requests get 503 with
	// Retry-After: 1 (status_code changes it).
	Adaptive *Adaptive `json:"adaptive,omitempty"`

	// With adaptive: the requests' priority classes, read from a
	// placeholder. When the limit is reached, the lowest class is shed
	// first.
	Priority *Priority `json:"priority,omitempty"`

	// The HTTP status of this zone's denials. Default: the handler's
	// status (429), and 503 in an adaptive zone (overload is not the
	// client's fault).
	StatusCode int `json:"status_code,omitempty"`

	// Answers a browser's navigation the zone would deny with a
	// proof-of-work page; a solved one earns a cookie limited under the
	// block's own events per window (challenge.go). Rate zones only.
	Challenge *Challenge `json:"challenge,omitempty"`
}

// Adaptive is an adaptive concurrency zone's controller settings.
type Adaptive struct {
	// The latency the upstream should keep at its 90th percentile: the
	// time from the call of the handlers after rate_limit to the
	// response's headers. Required.
	Latency caddy.Duration `json:"latency,omitempty"`

	// The fewest requests of a key allowed in flight, and where a key
	// starts. Default: 1.
	Min int64 `json:"min,omitempty"`

	// The most requests of a key allowed in flight. Default: 1000.
	Max int64 `json:"max,omitempty"`
}

// DefaultAdaptiveMax is an adaptive zone's max when it is not set.
const DefaultAdaptiveMax = 1000

// Priority is an adaptive zone's priority classes.
type Priority struct {
	// The placeholder whose value is the request's class, such as
	// {http.vars.class} set by a map of a cookie or a JWT claim.
	Placeholder string `json:"placeholder,omitempty"`

	// The class names, highest first. A request whose value is none of
	// them is of the last (lowest) class.
	Classes []string `json:"classes,omitempty"`
}

// classOf is the index of the request's class: the position of value in
// classes, the last class when it is none of them.
func (p *Priority) classOf(value string) int {
	for i, c := range p.Classes {
		if c == value {
			return i
		}
	}
	return len(p.Classes) - 1
}

// configure sets cfg's adaptive settings, with defaults, from a.
func (a *Adaptive) configure(name string, cfg *zones.Config, prio *Priority) error {
	cfg.Adaptive = algorithms.AdaptiveLimit{Target: int64(a.Latency), Min: cmp.Or(a.Min, 1), Max: cmp.Or(a.Max, max(DefaultAdaptiveMax, a.Min))}
	if a.Latency <= 0 {
		return fmt.Errorf("zone %s: adaptive needs a latency target, the upstream's p90 latency when healthy: adaptive { latency 250ms }", name)
	}
	if prio != nil {
		switch {
		case !hasPlaceholder(prio.Placeholder):
			return fmt.Errorf("zone %s: priority needs a placeholder and the classes, highest first: priority {http.vars.class} signed_in anonymous", name)
		case len(prio.Classes) < 2:
			return fmt.Errorf("zone %s: priority needs at least two classes, highest first: priority {http.vars.class} signed_in anonymous", name)
		}
		cfg.Classes = len(prio.Classes)
	}
	return nil
}

// zoneHandler is a provisioned zone: its matchers, key template and the
// zones.Zone that decides, with what it logs and counts through.
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
	priority  *Priority // adaptive zones with priority classes, else nil
	waits     bool      // an adaptive zone with delay: its requests may wait for a place
	// classHeader is, when priority's placeholder is one request header,
	// the header's canonical name (see keyHeader).
	classHeader string
	status      int                 // the HTTP status of a denial
	region      *distributed.Region // scope global: its share is the q a client can get here
	denial      error               // the HandlerError a denial returns, boxed once
	metrics     zoneMetrics         // no series when metrics are disabled
	timed       bool                // metrics on and every decision asks Redis (strict)
	logger      *zap.Logger         // the handler's
	logs        *logSamplers        // the handler's, which all its zones share
	// loggedEmptyKey: a request's key was empty, and that was logged.
	loggedEmptyKey atomic.Bool
	// loggedDroppedBans: a ban was not kept, from the table or the list
	// (banDropped), and that was logged.
	loggedDroppedBans [2]atomic.Bool

	// What provision took, for release.
	stateID    live.StateID
	freshState bool          // provision created the state (persist restores into it)
	stopReset  func()        // nil without a store that shares resets
	stopBans   chan struct{} // async zones with ban: stops learnBans
	// overridesKey is the zone's overrides holder (live.LoadOverrideHolder), "" when
	// not taken.
	overridesKey string
	challenge    *zoneChallenge // nil unless the zone has a challenge block
}

// provision checks and sets up the zone named name of handler h, whose
// settings (dry_run, status, sweep_interval, disable_metrics, its store,
// logger and samplers) it reads. It takes a shared resource only once
// nothing can fail any more: a zone it returns an error for holds nothing.
func (zc *Zone) provision(ctx caddy.Context, name string, h *Handler) (*zoneHandler, error) {
	policy, err := zones.ParseFailPolicy(zc.FailPolicy)
	if err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	cfg := zc.limits(name)
	cfg.FailPolicy, cfg.DryRun = policy, zc.DryRun || h.DryRun
	cfg.Lease, cfg.Ban, cfg.BanMax = time.Duration(zc.Lease), time.Duration(zc.Ban), time.Duration(zc.BanMax)
	cfg.Delay, cfg.Queue = time.Duration(zc.Delay), zc.Queue
	switch {
	case zc.Adaptive != nil && zc.FailPolicy != "":
		return nil, fmt.Errorf("zone %s: fail_policy does not apply to an adaptive zone: it never asks Redis, so there is no store to fail; remove fail_policy", name)
	case zc.Adaptive != nil:
		if err := zc.Adaptive.configure(name, &cfg, zc.Priority); err != nil {
			return nil, err
		}
	case zc.Priority != nil:
		return nil, fmt.Errorf("zone %s: priority shares an adaptive zone's limit between classes: add adaptive { latency 250ms }, or remove priority", name)
	}
	if zc.StatusCode != 0 && (zc.StatusCode < 400 || zc.StatusCode > 599) {
		return nil, fmt.Errorf("zone %s: status must be an HTTP error status (400-599), not %d", name, zc.StatusCode)
	}
	vars, err := newPlanVars(name, zc, h.logger)
	if err != nil {
		return nil, err
	}
	if zc.Quota != nil {
		if err := zc.Quota.configure(name, &cfg, &vars, h.logger); err != nil {
			return nil, err
		}
	}
	var chal *zoneChallenge
	if zc.Challenge != nil {
		if chal, err = zc.Challenge.provision(ctx, name, zc, !h.DisableMetrics); err != nil {
			return nil, err
		}
	}
	cfg.PerRequest = vars.any() || chal != nil // a cookie's budget is a plan of its own
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	plan, _ := cfg.Plan()
	costs, err := zoneCosts(name, zc, plan, h.logger)
	if err != nil {
		return nil, err
	}
	if cfg.Delay > 0 && costs.postCharged() {
		return nil, fmt.Errorf("zone %s: delay is for zones that consume before the request: a post-charged zone (count, charge) only checks then, so there is no turn to wait for; remove delay, or put a rate zone with delay beside it", name)
	}
	if zc.Key == "" {
		return nil, fmt.Errorf("zone %s: key is required (e.g. key {client_ip})", name)
	}
	if err := live.ClaimZone(ctx, cfg, stateKey(vars), zc.Key, false); err != nil {
		return nil, err
	}

	zc.warn(name, h.store != nil, h.logger)

	status := h.StatusCode
	if cfg.IsAdaptive() {
		status = http.StatusServiceUnavailable
	}
	status = cmp.Or(zc.StatusCode, status)
	zh := &zoneHandler{
		priority:  zc.Priority,
		waits:     cfg.IsAdaptive() && cfg.Delay > 0 && !cfg.DryRun,
		status:    status,
		key:       zc.Key,
		keyVar:    singlePlaceholder(zc.Key),
		keyHeader: headerPlaceholder(singlePlaceholder(zc.Key)),
		nameValue: name,
		vars:      vars,
		costs:     costs,
		dryRun:    cfg.DryRun,
		denial:    caddyhttp.HandlerError{StatusCode: status, Err: fmt.Errorf("rate limit exceeded in zone %s", name)},
		logger:    h.logger,
		logs:      &h.live.logs,
		challenge: chal,
	}
	if zc.Priority != nil {
		zh.classHeader = headerPlaceholder(singlePlaceholder(zc.Priority.Placeholder))
	}
	if len(zc.MatcherSetsRaw) > 0 {
		mods, err := ctx.LoadModule(zc, "MatcherSetsRaw")
		if err != nil {
			return nil, fmt.Errorf("zone %s: loading matchers: %v", name, err)
		}
		if err := zh.matchers.FromInterface(mods); err != nil {
			return nil, fmt.Errorf("zone %s: %v", name, err)
		}
	}
	store, shared, err := h.globalStore(name, zc, cfg)
	if err != nil {
		return nil, err
	}
	if shared != nil {
		zh.region = shared.Region()
	}
	state, id, fresh, err := live.LoadState(cfg, stateKey(vars), time.Duration(h.SweepInterval))
	if err != nil {
		return nil, err
	}
	zh.stateID, zh.freshState = id, fresh
	if zh.Zone, err = zones.New(cfg, state, store); err != nil {
		zh.releaseState()
		return nil, err
	}
	if fresh && store == nil {
		// A local zone's keys live in its state alone: a reload that
		// replaces the definition gives every key its full limit back.
		// (Distributed zones keep theirs in Redis, read under the new
		// limit.)
		live.LogAfresh(h.logger, id)
	}
	if n := h.backend.Resets; n != nil {
		// A key reset on another instance is forgotten here too.
		zh.stopReset = n.OnReset(name, zh.Zone)
	}
	if !h.DisableMetrics {
		// Async decisions are local: timing them would cost two clock
		// reads per request and fill the store latency histogram with
		// zeros.
		zh.timed = h.store != nil && zh.Mode() == "strict"
		zh.metrics = newZoneMetrics(cfg, zc.Key, h.store != nil && !cfg.IsAdaptive(), zh.timed, costs)
		if cfg.IsAdaptive() {
			zh.metrics.classes = newClassMetrics(name, zc.Priority, cfg.DryRun)
		}
	}
	zh.Zone.OnChargeFailed = zh.chargeFailed
	if cfg.IsAdaptive() {
		logger, target := h.logger, time.Duration(cfg.Adaptive.Target)
		zh.Zone.OnSlowUpstream(func(unloaded time.Duration) {
			logger.Warn("adaptive latency target is below the upstream's unloaded latency (its latency with the limit at min): following just above the upstream's own latency instead; raise latency to at least the upstream's, or see caddy_rate_limit_adaptive_unloaded_latency_seconds",
				zap.String("zone", name), zap.Duration("latency", target), zap.Duration("unloaded", unloaded))
		})
	}
	if cfg.Ban > 0 && !cfg.DryRun {
		zh.Zone.OnBanDropped = zh.banDropped
	}
	if a := h.backend.Async; a != nil && cfg.Ban > 0 {
		zh.stopBans = make(chan struct{})
		go zh.learnBans(a, a.SyncInterval())
	}
	var remote *zones.OverrideStore
	if h.store != nil {
		remote = h.store.Offers().Overrides
	}
	ov, ovKey, err := live.LoadOverrideHolder(ctx, cfg, remote, h.storeKey, h.logger)
	if err != nil {
		// Not registered yet: give back the reset subscription and the
		// ban reader unregister would.
		if zh.stopReset != nil {
			zh.stopReset()
		}
		if zh.stopBans != nil {
			close(zh.stopBans)
		}
		zh.releaseState()
		return nil, err
	}
	zh.overridesKey = ovKey
	zh.Zone.UseOverrides(ov.Set())
	emit := func(event string, data map[string]any) { h.events.Emit(h.ctx, event, data) }
	live.Register(zh.Zone, false, live.ZoneView{Regional: h.store, Shared: shared, Health: h.backend.Health, Overrides: ov, Emit: emit, USD: zh.usdFields, Handler: zh})
	return zh, nil
}

// limits is the zone's events, window, burst, concurrency, prefixes and
// max_keys, the base of its zones.Config.
func (zc *Zone) limits(name string) zones.Config {
	return zones.Config{Name: name, Concurrency: zc.Concurrency, Events: zc.MaxEvents, Window: time.Duration(zc.Window), Burst: zc.Burst,
		IPv4Prefix: zc.IPv4Prefix, IPv6Prefix: zc.IPv6Prefix, MaxKeys: zc.MaxKeys}
}

// warn logs, at provision, what the zone's config accepts but that cannot
// do what it says: a fail policy with no store to fail (distributed says
// whether the handler has one), a key with no placeholder (one bucket for
// everyone, unless written key static), and a template that reads what
// authentication sets, which the Caddyfile runs after rate_limit.
func (zc *Zone) warn(name string, distributed bool, logger *zap.Logger) {
	if !distributed && (zc.FailPolicy == "open" || zc.FailPolicy == "closed") {
		logger.Warn("fail_policy has no effect without distributed: a zone in this process has no Redis to fail, and is always enforced; remove fail_policy, or add distributed",
			zap.String("zone", name), zap.String("fail_policy", zc.FailPolicy))
	}
	if !hasPlaceholder(zc.Key) && zc.Key != constantKey {
		fix := "write the placeholder in braces, e.g. key {client_ip}"
		if strings.Trim(zc.Key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == "" {
			fix = "did you mean key {" + zc.Key + "}?"
		}
		logger.Warn("a zone's key has no placeholder: every request shares one bucket; "+fix+" (for one bucket on purpose, write key "+constantKey+")",
			zap.String("zone", name), zap.String("key", zc.Key))
	}
	// Where the handler runs is not known here (a route's order is the
	// config's, not the handler's): the warning is given whenever an auth
	// placeholder is read, and a request without it is logged once more
	// (emptyKey).
	if setting, tpl := zc.readsAuth(); setting != "" {
		logger.Warn("a zone reads a placeholder that authentication sets: "+authOrder+" (when it already runs after authentication, this line is only a reminder)",
			zap.String("zone", name), zap.String("setting", setting), zap.String("placeholder", tpl))
	}
}

// authPlaceholder is how the placeholders authentication handlers set
// begin: {http.auth.user.id}, {http.auth.user.*} (basic_auth, JWT modules).
const authPlaceholder = "{http.auth."

// readsAuth returns the first of the zone's key and per-request templates
// that reads a placeholder authentication sets, and its setting's name.
func (zc *Zone) readsAuth() (setting, tpl string) {
	templates := []struct{ setting, tpl string }{
		{"key", zc.Key}, {"events", zc.MaxEventsPlaceholder}, {"window", zc.WindowPlaceholder},
		{"burst", zc.BurstPlaceholder}, {"cost", zc.CostPlaceholder},
	}
	if zc.Quota != nil {
		templates = append(templates, struct{ setting, tpl string }{"quota", zc.Quota.LimitPlaceholder})
	}
	for _, t := range templates {
		if strings.Contains(t.tpl, authPlaceholder) {
			return t.setting, t.tpl
		}
	}
	return "", ""
}

// authOrder is how to make rate_limit run after authentication, which the
// Caddyfile orders it before.
const authOrder = "rate_limit must run after authentication, or the placeholder is empty for every request (one bucket for everyone, one plan for all); " +
	"the Caddyfile orders rate_limit before basic_auth and other authentication: put both in route { basic_auth … rate_limit … }, or add the global option order rate_limit after basic_auth"

// constantKey is the key template that says "one bucket for every request"
// on purpose: any other template without a placeholder is warned about at
// load (key client_ip, without braces, is a typo).
const constantKey = "static"

// hasPlaceholder reports whether the template has a placeholder, {name},
// whose brace is not escaped.
func hasPlaceholder(tpl string) bool {
	for i := 0; i < len(tpl); i++ {
		switch tpl[i] {
		case '\\':
			i++
		case '{':
			if end := strings.IndexByte(tpl[i+1:], '}'); end > 0 {
				return true
			}
		}
	}
	return false
}

// canBeEmpty reports whether the template can expand to nothing: it is
// placeholders only, each of which may be unset or empty.
func canBeEmpty(tpl string) bool {
	for i := 0; i < len(tpl); i++ {
		if tpl[i] != '{' {
			return false
		}
		end := strings.IndexByte(tpl[i:], '}')
		if end < 0 {
			return false
		}
		i += end
	}
	return tpl != ""
}

// learnBans reads the zone's fleet-wide bans every interval (async mode:
// the bans other instances started), until unregister.
func (z *zoneHandler) learnBans(l zones.BanList, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-z.stopBans:
			return
		case <-tick.C:
		}
		start := z.BanSyncStart()
		bans, err := l.ListBans(context.Background(), z.Name)
		if err == nil {
			z.LearnBans(start, bans, monotime.Now())
		}
	}
}

// unregister gives back the registration and the reset subscription that
// provision took, when the handler's config goes, and stops reading bans.
func (z *zoneHandler) unregister() {
	live.Unregister(z.Zone)
	if z.stopReset != nil {
		z.stopReset()
	}
	if z.stopBans != nil {
		close(z.stopBans)
	}
}

// releaseState gives back the reference to the zone's state that provision
// took, once the handler's requests and charges are done with it.
func (z *zoneHandler) releaseState() {
	live.ReleaseState(z.stateID)
	if z.overridesKey != "" {
		live.ReleaseOverrideHolder(z.overridesKey)
	}
}

// compareZones orders zones by kind, then tightest first (compareKinds),
// then rate zones by burst, then by name.
func compareZones(a, b *zoneHandler) int {
	burst := 0
	if kind, _ := tightness(a.Zone); kind == 0 {
		// Not the difference: as an int it would wrap where int is
		// 32 bits (bursts go to 2^40).
		burst = cmp.Compare(a.Limit().Burst, b.Limit().Burst)
	}
	return cmp.Or(compareKinds(a.Zone, b.Zone), burst, strings.Compare(a.Name, b.Name))
}

// compareKinds orders rate zones first, by rate; then quota zones, by their
// usual rate: a request a rate zone denies never counts in a quota, whose
// refunds are Redis round trips too; then concurrency zones, smallest
// first: a request a rate zone denies never takes a slot, and a slot, unlike
// a GCRA step, has to be given back.
func compareKinds(a, b *zones.Zone) int {
	ka, ta := tightness(a)
	kb, tb := tightness(b)
	return cmp.Or(cmp.Compare(ka, kb), cmp.Compare(ta, tb))
}

// tightness is z's kind in compareKinds's order and its limit per second
// (a concurrency zone's: its concurrency).
func tightness(z *zones.Zone) (kind int, limit float64) {
	switch {
	case z.IsAdaptive():
		return 2, float64(z.Adaptive.Max)
	case z.IsConcurrency():
		return 2, float64(z.Concurrency)
	case z.IsQuota():
		return 1, float64(z.Quota) / nominalSeconds[z.Period]
	}
	return 0, float64(z.Events) / float64(z.Window)
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

// expandKey expands the zone's key template for the request. A key that
// expands to nothing (a missing header, a misspelt placeholder) is counted
// and logged once: such requests share one bucket.
func (z *zoneHandler) expandKey(r *http.Request, repl *caddy.Replacer) string {
	var key string
	switch {
	case z.keyHeader != "":
		// What {http.request.header.*} gives: the values joined by ",".
		key = strings.Join(r.Header[z.keyHeader], ",")
	case z.keyVar != "":
		key, _ = repl.GetString(z.keyVar)
	default:
		key = repl.ReplaceAll(z.key, "")
	}
	if key == "" {
		z.emptyKey()
	}
	return key
}

// emptyKey counts a request whose key is empty, and logs the first.
func (z *zoneHandler) emptyKey() {
	add(z.metrics.emptyKeys, 1)
	if z.logger == nil { // not provisioned (a unit test's zoneHandler)
		return
	}
	if !z.loggedEmptyKey.Load() && z.loggedEmptyKey.CompareAndSwap(false, true) {
		fix := "check the key's placeholders, reject such requests before rate_limit, or key them by another value"
		if strings.Contains(z.key, authPlaceholder) {
			// An authenticated request carries the placeholder: this
			// one reached rate_limit before authentication.
			fix = "the key reads what authentication sets, and this request reached rate_limit without it: " + authOrder
		}
		z.logger.Warn("a request's key is empty: every request whose key is empty shares one bucket (counted in caddy_rate_limit_empty_keys_total; logged once per zone and load); "+fix,
			zap.String("zone", z.Name), zap.String("key", z.key))
	}
}

// banDropped counts the bans the zone did not keep (zones.Zone.OnBanDropped)
// and logs the first of each kind.
func (z *zoneHandler) banDropped(fromList bool, n int64) {
	from, msg := 0, "a ban was not kept: the zone's ban table is full of running bans (max_keys), and running bans are never evicted; the key has the zone's rate without the ban (counted in caddy_rate_limit_bans_dropped_total{from=\"table\"}; logged once per zone and load); raise max_keys"
	if fromList {
		from, msg = 1, "running bans were dropped from the zone's fleet-wide list of bans, which keeps the 1000 that end last: the instance that started them enforces them, in async mode the others do not learn them (counted in caddy_rate_limit_bans_dropped_total{from=\"list\"}; logged once per zone and load)"
	}
	add(z.metrics.droppedBans[from], float64(n))
	if z.logger != nil && !z.loggedDroppedBans[from].Load() && z.loggedDroppedBans[from].CompareAndSwap(false, true) {
		z.logger.Warn(msg, zap.String("zone", z.Name), zap.Int64("dropped", n))
	}
}

// readsReplacer reports whether the zone's key, limit or cost reads the
// request's replacer.
func (z *zoneHandler) readsReplacer() bool {
	return z.keyHeader == "" || z.vars.any() || z.costs.costVar != "" || z.priority != nil && z.classHeader == ""
}

// classFor is the request's priority class in an adaptive zone with
// priority (0, the highest, in any other zone). A class read from one
// request header is read from the request directly, as the key is.
func (z *zoneHandler) classFor(r *http.Request, repl *caddy.Replacer) int {
	switch {
	case z.priority == nil:
		return 0
	case z.classHeader != "":
		var v string
		switch vs := r.Header[z.classHeader]; len(vs) {
		case 0:
		case 1:
			v = vs[0]
		default:
			v = strings.Join(vs, ",")
		}
		return z.priority.classOf(v)
	}
	return z.priority.classOf(repl.ReplaceAll(z.priority.Placeholder, ""))
}

// logStoreError logs (sampled) a decision the store could not make.
func (z *zoneHandler) logStoreError(now int64, d zones.Decision) {
	if c := z.logs.storeError.Check(z.logger, now, zapcore.DebugLevel, "store unavailable; fail policy applied"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.String("fail_policy", z.FailPolicy.String()), zap.Error(d.Err))
	}
}
