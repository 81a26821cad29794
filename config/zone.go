// Package config is tally's configuration as a user writes it: in JSON (the
// types, whose doc comments make Caddy's JSON docs of
// http.handlers.rate_limit) and in the Caddyfile (ParseDirective, and the
// argument readers the listener wrapper shares). It checks what the config
// alone can tell, with errors that name the file, line and fix; package
// ratelimit provisions what needs a running handler (stores, matchers,
// metrics). Each block's type and Caddyfile reader share a file;
// caddyfile.go holds the directive, the zone block and the argument
// readers.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Zone is one named limit: events per window per key, a calendar quota per
// key, or requests in flight per key.
type Zone struct {
	// The key template: placeholders such as {client_ip} or
	// {http.request.header.Authorization}. Requests with the same expanded
	// key share a limit. Required.
	Key string `json:"key,omitempty"`

	// Only requests that match one of these matcher sets count in this
	// zone; empty: all requests.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// How many requests a key may make per window. Required (except in a
	// concurrency zone); the fallback of max_events_placeholder.
	MaxEvents int64 `json:"max_events,omitempty"`

	// The window. Required (except in a concurrency zone); the fallback of
	// window_placeholder.
	Window caddy.Duration `json:"window,omitempty"`

	// How many requests a key may make at once. Default: max_events (a
	// fresh key may send max_events at once, then one every
	// window/max_events); 1 gives a perfectly smooth rate.
	Burst int64 `json:"burst,omitempty"`

	// A placeholder, such as {plan_rpm} set by a `map` of the customer's
	// plan or a JWT claim, whose value is this request's max_events: limits
	// per plan. A value empty, not a whole number or out of range (1 to
	// 2^40, and max_events_at_most) is replaced by max_events, counted in
	// caddy_rate_limit_plan_fallbacks_total and logged (sampled). It must
	// come from the operator, not the client: see max_events_at_most.
	MaxEventsPlaceholder string `json:"max_events_placeholder,omitempty"`

	// A placeholder whose value (a duration such as 1m or 1h) is this
	// request's window; window is the fallback, as for max_events.
	WindowPlaceholder string `json:"window_placeholder,omitempty"`

	// A placeholder whose value is this request's burst; burst (or the
	// request's max_events when burst is not set) is the fallback.
	BurstPlaceholder string `json:"burst_placeholder,omitempty"`

	// With max_events_placeholder, the most events a request's value may
	// give: a larger one falls back to max_events, counted and logged as
	// unusable. Otherwise a placeholder the client sets (a header, a query
	// string) can pick up to 2^40 events: plans should come from the
	// operator (a map, a verified JWT claim), and this bounds them. At
	// least max_events.
	MaxEventsAtMost int64 `json:"max_events_at_most,omitempty"`

	// With window_placeholder, the shortest window a request's value may
	// give: a shorter one falls back to window, as max_events_at_most does.
	// At most window.
	WindowAtLeast caddy.Duration `json:"window_at_least,omitempty"`

	// With burst_placeholder, the largest burst a request's value may give:
	// a larger one falls back, as max_events_at_most does. At least burst.
	BurstAtMost int64 `json:"burst_at_most,omitempty"`

	// What one request costs in max_events' units, when known before it
	// runs (a weighted endpoint). Default: 1; at most burst, or the request
	// could never pass. The fallback of cost_placeholder; in a post-charged
	// zone, what a counted response charges.
	Cost int64 `json:"cost,omitempty"`

	// A placeholder whose value is this request's cost, such as
	// {http.request.header.X-Search-Cost}. A value empty, not a whole
	// number or negative costs cost (counted in
	// caddy_rate_limit_cost_fallbacks_total and logged); 0 passes without
	// consuming; more than the burst is denied at once (it could never
	// pass), with a warning logged. With charge or charge_json it is an
	// estimate taken before the request (a key without the budget is
	// refused before the upstream is called), settled against what the
	// response charges after it.
	CostPlaceholder string `json:"cost_placeholder,omitempty"`

	// A floor on cost_placeholder's values: a value below it costs
	// cost_at_least (so that a client cannot make its requests free with
	// 0), counted in caddy_rate_limit_cost_fallbacks_total. At most cost. A
	// cost the client sets (http.request.*) without it logs a warning when
	// the zone is provisioned.
	CostAtLeast int64 `json:"cost_at_least,omitempty"`

	// A bound on cost_placeholder's values: a value above it costs
	// cost_at_most (asking for more never costs less), counted in
	// caddy_rate_limit_cost_fallbacks_total. At least cost.
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

	// Makes the zone post-charged from the response body: it charges the
	// sum of these dot paths of object keys (usage.total_tokens, from the
	// document's root or else from below one of its top-level keys), read
	// from an application/json response or a text/event-stream response's
	// events (each path from the last event that carries it) while the body
	// streams through untouched. Each value must be a whole number >= 0,
	// and all must be found; when not (no usage, malformed JSON, a
	// compressed body, the client left, an upstream error), the response
	// charges cost_placeholder's estimate, or else cost, counted in
	// caddy_rate_limit_charge_fallbacks_total by reason. Not with charge.
	ChargeJSON []string `json:"charge_json,omitempty"`

	// Makes the zone post-charged in dollars: each response's token usage
	// (read as charge tokens reads it) priced by its model. The zone's unit
	// must be usd. A response with no usage, or whose model has no price
	// and there is no default, charges cost_placeholder's estimate, or else
	// cost, counted in caddy_rate_limit_charge_fallbacks_total by reason
	// (no_price for the latter). Not with charge or charge_json.
	ChargeUSD *ChargeUSD `json:"charge_usd,omitempty"`

	// "usd": the zone's amounts (max_events, burst, quota.limit, cost, the
	// placeholders' values) are whole micro-dollars, written as dollars in
	// the Caddyfile (quota 20 usd per month). Requires charge_usd.
	Unit string `json:"unit,omitempty"`

	// "request": in a zone that charges LLM tokens or dollars, the cost
	// taken before the request is estimated from its body (read once, at
	// most 1 MiB; the upstream gets every byte): its prompt's bytes ÷ 4 in
	// input tokens, its max_tokens (or the API's like) or else the 95th
	// percentile of the zone's responses of its model in output tokens,
	// priced as the charge prices them; it takes at most what the key has
	// left, and the response settles it (docs/llm.md).
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
	// instead (e.g. 24).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// When the key is an IPv6 address, limit its /ipv6_prefix network
	// instead (e.g. 64).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// What to do when Redis cannot answer: "local" (default) enforces this
	// instance's part of the limit in-process, "open" allows, "closed"
	// denies. Only meaningful with distributed.
	FailPolicy string `json:"fail_policy,omitempty"`

	// The most keys this zone keeps in memory; when full, expired ones go
	// first. Default: 1000000.
	MaxKeys int64 `json:"max_keys,omitempty"`

	// Decide and report, but never deny.
	DryRun bool `json:"dry_run,omitempty"`

	// "region" (default): with distributed, the limit holds in this
	// region's Redis. "global": the limit holds across every region of
	// distributed's global block, each region enforcing its share of each
	// key in its own Redis. Rate zones only.
	Scope string `json:"scope,omitempty"`

	// Makes this a concurrency zone: at most this many requests of a key in
	// flight at once, instead of max_events per window (then left out). A
	// request holds its slot until the handlers after this one return,
	// whatever happens (error, panic, client gone, hijacked connection
	// closed). Denials carry Retry-After: 1.
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

	// A key this zone denies for lack of quota is then denied for this long
	// (a ban), fleet-wide with distributed, whatever the rate gives back
	// meanwhile: Retry-After is the ban's remaining time. A ban never
	// admits more than the zone without one: after it, the key has what the
	// rate gave back. Not in concurrency or quota zones. Dry run only logs
	// and counts the bans it would start.
	Ban caddy.Duration `json:"ban,omitempty"`

	// With ban, makes bans escalate: a key's ban that starts within ban_max
	// of its last one's end lasts twice that one, at most ban_max; a key
	// not banned for ban_max starts over at ban.
	BanMax caddy.Duration `json:"ban_max,omitempty"`

	// Lets a request the zone would deny wait for its turn instead, when
	// that turn is at most this far away (at most 1m): its slot is reserved
	// at once (fleet-wide in strict mode, in the same Redis step), the
	// request waits, then goes on with the headers of an allowed one and
	// {http.rate_limit.delay} set to its wait. A client that goes away
	// while waiting gives its slot back. Requests further away are denied
	// as without delay; Retry-After is when they would pass at once. Not in
	// concurrency, quota or post-charged (count, charge) zones.
	Delay caddy.Duration `json:"delay,omitempty"`

	// With delay: at most this many requests of the zone wait at once on
	// this instance; beyond it a request is decided as without delay
	// (denied when over the limit). Default: 1000.
	Queue int64 `json:"queue,omitempty"`

	// Makes this an adaptive concurrency zone: its limit of requests in
	// flight per key follows the upstream's latency toward a target
	// (docs/configuration.md, adaptive concurrency zones), decided on this
	// instance whatever distributed says. Shed requests get 503 with
	// Retry-After: 1 (status_code changes it).
	Adaptive *Adaptive `json:"adaptive,omitempty"`

	// With adaptive: the requests' priority classes, read from a
	// placeholder; at the limit, the lowest class is shed first.
	Priority *Priority `json:"priority,omitempty"`

	// The HTTP status of this zone's denials. Default: the handler's status
	// (429), and 503 in an adaptive zone (overload is not the client's
	// fault).
	StatusCode int `json:"status_code,omitempty"`

	// Answers a browser's navigation the zone would deny with a
	// proof-of-work page; a solved one earns a cookie limited under the
	// block's own events per window (challenge.go). Rate zones only.
	Challenge *Challenge `json:"challenge,omitempty"`
}

// Adaptive is an adaptive concurrency zone's controller settings.
type Adaptive struct {
	// The latency the upstream should keep at its 90th percentile: the time
	// from the call of the handlers after rate_limit to the response's
	// headers. Required.
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

	// The class names, highest first; a request whose value is none of them
	// is of the last.
	Classes []string `json:"classes,omitempty"`
}

// ClassOf is the index of the request's class: the position of value in
// classes, the last class when it is none of them.
func (p *Priority) ClassOf(value string) int {
	for i, c := range p.Classes {
		if c == value {
			return i
		}
	}
	return len(p.Classes) - 1
}

// Configure sets cfg's adaptive settings, with defaults, from a.
func (a *Adaptive) Configure(name string, cfg *zones.Config, prio *Priority) error {
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

// Limits is the zone's events, window, burst, concurrency, prefixes and
// max_keys, the base of its zones.Config.
func (zc *Zone) Limits(name string) zones.Config {
	return zones.Config{Name: name, Concurrency: zc.Concurrency, Events: zc.MaxEvents, Window: time.Duration(zc.Window), Burst: zc.Burst,
		IPv4Prefix: zc.IPv4Prefix, IPv6Prefix: zc.IPv6Prefix, MaxKeys: zc.MaxKeys}
}

// Warn logs, at provision, what the zone's config accepts but that cannot
// do what it says: a fail policy with no store to fail (distributed says
// whether the handler has one), a key with no placeholder (one bucket for
// everyone, unless written key static), and a template that reads what
// authentication sets, which the Caddyfile runs after rate_limit.
func (zc *Zone) Warn(name string, distributed bool, logger *zap.Logger) {
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
		logger.Warn("a zone reads a placeholder that authentication sets: "+AuthOrder+" (when it already runs after authentication, this line is only a reminder)",
			zap.String("zone", name), zap.String("setting", setting), zap.String("placeholder", tpl))
	}
}

// AuthPlaceholder is how the placeholders authentication handlers set
// begin: {http.auth.user.id}, {http.auth.user.*} (basic_auth, JWT modules).
const AuthPlaceholder = "{http.auth."

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
		if strings.Contains(t.tpl, AuthPlaceholder) {
			return t.setting, t.tpl
		}
	}
	return "", ""
}

// AuthOrder is how to make rate_limit run after authentication, which the
// Caddyfile orders it before.
const AuthOrder = "rate_limit must run after authentication, or the placeholder is empty for every request (one bucket for everyone, one plan for all); " +
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

// CanBeEmpty reports whether the template can expand to nothing: it is
// placeholders only, each of which may be unset or empty.
func CanBeEmpty(tpl string) bool {
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

// SinglePlaceholder returns the name of the placeholder when the template
// is exactly one placeholder such as {http.request.header.X-API-Key}, the
// common case, which can then be looked up without building a string.
func SinglePlaceholder(tpl string) string {
	if len(tpl) < 3 || tpl[0] != '{' || tpl[len(tpl)-1] != '}' || strings.ContainsAny(tpl[1:len(tpl)-1], "{}\\") {
		return ""
	}
	return tpl[1 : len(tpl)-1]
}

// CheckTokenCount refuses a charge_tokens that is none of input, output and
// total.
func CheckTokenCount(s string) error {
	if slices.Contains([]string{"total", "input", "output"}, s) {
		return nil
	}
	return errors.New(`"` + s + `": count input, output or total tokens (total if left out)`)
}
