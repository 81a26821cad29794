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

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/internal/usage"
	"github.com/caddy-tally/ratelimit/zones"
)

// The configuration types are package config's; these names keep
// ratelimit.Zone and the others (and Caddy's JSON docs) resolving.
type (
	Zone        = config.Zone
	Adaptive    = config.Adaptive
	Priority    = config.Priority
	Quota       = config.Quota
	ChargeUSD   = config.ChargeUSD
	ModelPrice  = config.ModelPrice
	TokenPrices = config.TokenPrices
	Challenge   = config.Challenge
	Distributed = config.Distributed
	Redis       = config.Redis
	Global      = config.Global
	Persist     = config.Persist
)

// Defaults and bounds of the configuration (package config's).
const (
	DefaultAdaptiveMax     = config.DefaultAdaptiveMax
	MaxDifficulty          = config.MaxDifficulty
	DefaultPersistInterval = config.DefaultPersistInterval
	DefaultPersistMaxAge   = config.DefaultPersistMaxAge
	MinPersistInterval     = config.MinPersistInterval
)

// httpZone is a provisioned zone: the zones.Zone that decides, and its HTTP side.
type httpZone struct {
	*zones.Zone
	matchers          caddyhttp.MatcherSets
	key               string // the key template
	keyVar            string // when the template is exactly one placeholder: its name
	keyHeader         string // keyVar's request header, canonical: read directly, the replacer would box it
	nameValue         any    // the zone's name as a placeholder value, boxed once
	vars              planVars
	costs             costVars
	dryRun            bool
	priority          *Priority           // adaptive zones with priority classes, else nil
	waits             bool                // an adaptive zone with delay: its requests may wait for a place
	classHeader       string              // priority's placeholder's header, as keyHeader
	status            int                 // the HTTP status of a denial
	region            *distributed.Region // scope global: its share is the q a client can get here
	denial            error               // the HandlerError a denial returns, boxed once
	metrics           zoneMetrics         // no series when metrics are disabled
	timed             bool                // metrics on and every decision asks Redis (strict)
	logger            *zap.Logger         // the handler's
	logs              *logSamplers        // the handler's, which all its zones share
	loggedEmptyKey    atomic.Bool
	loggedDroppedBans [2]atomic.Bool // from the table, the list
	challenge         *zoneChallenge // nil unless the zone has a challenge block

	// What provision took, for release.
	stateID      live.StateID
	freshState   bool          // provision created the state (persist restores into it)
	stopReset    func()        // nil without a store that shares resets
	stopBans     chan struct{} // async zones with ban: stops learnBans
	overridesKey string        // "" when not taken
}

// provisionZone checks and sets up zone zc of h. A zone it returns an
// error for holds nothing.
func (h *Handler) provisionZone(ctx caddy.Context, name string, zc *Zone) (*httpZone, error) {
	policy, err := zones.ParseFailPolicy(zc.FailPolicy)
	if err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	cfg := zc.Limits(name)
	cfg.FailPolicy, cfg.DryRun = policy, zc.DryRun || h.DryRun
	cfg.Lease, cfg.Ban, cfg.BanMax = time.Duration(zc.Lease), time.Duration(zc.Ban), time.Duration(zc.BanMax)
	cfg.Delay, cfg.Queue = time.Duration(zc.Delay), zc.Queue
	switch {
	case zc.Adaptive != nil && zc.FailPolicy != "":
		return nil, fmt.Errorf("zone %s: fail_policy does not apply to an adaptive zone: it never asks Redis, so there is no store to fail; remove fail_policy", name)
	case zc.Adaptive != nil:
		if err := zc.Adaptive.Configure(name, &cfg, zc.Priority); err != nil {
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
		if err := configureQuota(zc.Quota, name, &cfg, &vars, h.logger); err != nil {
			return nil, err
		}
	}
	var chal *zoneChallenge
	if zc.Challenge != nil {
		if chal, err = provisionChallenge(ctx, zc.Challenge, name, zc, !h.DisableMetrics); err != nil {
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

	zc.Warn(name, h.store != nil, h.logger)

	status := h.StatusCode
	if cfg.IsAdaptive() {
		status = http.StatusServiceUnavailable
	}
	status = cmp.Or(zc.StatusCode, status)
	zh := &httpZone{
		priority:  zc.Priority,
		waits:     cfg.IsAdaptive() && cfg.Delay > 0 && !cfg.DryRun,
		status:    status,
		key:       zc.Key,
		keyVar:    config.SinglePlaceholder(zc.Key),
		keyHeader: headerPlaceholder(config.SinglePlaceholder(zc.Key)),
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
		zh.classHeader = headerPlaceholder(config.SinglePlaceholder(zc.Priority.Placeholder))
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
	var remote *zones.OverrideStore
	if h.store != nil {
		remote = h.store.Offers().Overrides
	}
	ov, ovKey, err := live.LoadOverrideHolder(ctx, cfg, remote, h.storeKey, h.logger)
	if err != nil {
		zh.releaseState()
		return nil, err
	}
	zh.overridesKey = ovKey
	if zh.Zone, err = zones.New(cfg, state, store); err != nil {
		zh.releaseState()
		return nil, err
	}
	if fresh && store == nil {
		// A reload that replaces a local zone's definition gives every
		// key its full limit back.
		live.LogAfresh(h.logger, id)
	}
	if n := h.backend.Resets; n != nil {
		zh.stopReset = n.OnReset(name, zh.Zone)
	}
	if !h.DisableMetrics {
		// Async decisions are local: timing them would fill the
		// histogram with zeros.
		zh.timed = h.store != nil && zh.Mode() == "strict"
		zh.metrics = newZoneMetrics(cfg, zc.Key, h.store != nil && !cfg.IsAdaptive(), zh.timed)
		costs.bindMetrics(&zh.metrics, cfg.Name, cfg.IsQuota())
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
	zh.Zone.UseOverrides(ov.Set())
	emit := func(event string, data map[string]any) { h.events.Emit(h.ctx, event, data) }
	live.Register(zh.Zone, false, live.ZoneView{Regional: h.store, Shared: shared, Health: h.backend.Health, Overrides: ov, Emit: emit, USD: zh.usdFields, Handler: zh})
	return zh, nil
}

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

// reasonNoPrice: a usd zone's response whose model has no price.
const reasonNoPrice = "no_price"

// unitMicroUSD names what a usd zone's integers count.
const unitMicroUSD = "usd-micro"

// learnBans reads the zone's fleet-wide bans every interval (async mode)
// until unregister.
func (z *httpZone) learnBans(l zones.BanList, interval time.Duration) {
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

// unregister undoes provision's registration, subscription and ban reader.
func (z *httpZone) unregister() {
	live.Unregister(z.Zone)
	if z.stopReset != nil {
		z.stopReset()
	}
	if z.stopBans != nil {
		close(z.stopBans)
	}
}

// releaseState gives back the zone's state and overrides holder.
func (z *httpZone) releaseState() {
	live.ReleaseState(z.stateID)
	if z.overridesKey != "" {
		live.ReleaseOverrideHolder(z.overridesKey)
	}
}

// compareZones orders rate zones first, by rate; then quota zones, by their
// usual rate: a request a rate zone denies never counts in a quota, whose
// refunds are Redis round trips too; then concurrency zones, smallest
// first: a slot, unlike a GCRA step, has to be given back. Ties: rate
// zones by burst, then by name.
func compareZones(a, b *httpZone) int {
	ka, ta := tightness(a.Zone)
	kb, tb := tightness(b.Zone)
	burst := 0
	if ka == 0 {
		burst = cmp.Compare(a.Limit().Burst, b.Limit().Burst)
	}
	return cmp.Or(cmp.Compare(ka, kb), cmp.Compare(ta, tb), burst, strings.Compare(a.Name, b.Name))
}

// tightness is z's kind in compareZones's order and its limit per second
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

// nominalSeconds orders quota periods: their usual lengths.
var nominalSeconds = map[algorithms.Period]float64{
	algorithms.Minute: 60, algorithms.Hour: 3600, algorithms.Day: 86400,
	algorithms.Week: 7 * 86400, algorithms.Month: 30.436875 * 86400,
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
func (z *httpZone) expandKey(r *http.Request, repl *caddy.Replacer) string {
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

func (z *httpZone) emptyKey() {
	add(z.metrics.emptyKeys, 1)
	if z.logger == nil { // not provisioned (a unit test's httpZone)
		return
	}
	if !z.loggedEmptyKey.Load() && z.loggedEmptyKey.CompareAndSwap(false, true) {
		fix := "check the key's placeholders, reject such requests before rate_limit, or key them by another value"
		if strings.Contains(z.key, config.AuthPlaceholder) {
			// An authenticated request carries the placeholder: this
			// one reached rate_limit before authentication.
			fix = "the key reads what authentication sets, and this request reached rate_limit without it: " + config.AuthOrder
		}
		z.logger.Warn("a request's key is empty: every request whose key is empty shares one bucket (counted in caddy_rate_limit_empty_keys_total; logged once per zone and load); "+fix,
			zap.String("zone", z.Name), zap.String("key", z.key))
	}
}

// banDropped counts the bans the zone did not keep and logs the first of each kind.
func (z *httpZone) banDropped(fromList bool, n int64) {
	from, msg := 0, "a ban was not kept: the zone's ban table is full of running bans (max_keys), and running bans are never evicted; the key has the zone's rate without the ban (counted in caddy_rate_limit_bans_dropped_total{from=\"table\"}; logged once per zone and load); raise max_keys"
	if fromList {
		from, msg = 1, "running bans were dropped from the zone's fleet-wide list of bans, which keeps the 1000 that end last: the instance that started them enforces them, in async mode the others do not learn them (counted in caddy_rate_limit_bans_dropped_total{from=\"list\"}; logged once per zone and load)"
	}
	add(z.metrics.droppedBans[from], float64(n))
	if z.logger != nil && !z.loggedDroppedBans[from].Load() && z.loggedDroppedBans[from].CompareAndSwap(false, true) {
		z.logger.Warn(msg, zap.String("zone", z.Name), zap.Int64("dropped", n))
	}
}

// readsReplacer reports whether the zone's key, limit or cost reads the replacer.
func (z *httpZone) readsReplacer() bool {
	return z.keyHeader == "" || z.vars.any() || z.costs.costVar != "" || z.priority != nil && z.classHeader == ""
}

// classFor is the request's priority class (0, the highest, without priority).
func (z *httpZone) classFor(r *http.Request, repl *caddy.Replacer) int {
	switch {
	case z.priority == nil:
		return 0
	case z.classHeader != "":
		return z.priority.ClassOf(strings.Join(r.Header[z.classHeader], ","))
	}
	return z.priority.ClassOf(repl.ReplaceAll(z.priority.Placeholder, ""))
}
