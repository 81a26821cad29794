package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/internal/usage"
	"github.com/caddy-tally/ratelimit/zones"
)

// costVars are a zone's cost settings (docs/configuration.md, "What a
// request costs"): `cost` is one GCRA step before the request; `count` and
// `charge` make the zone post-charged, charged after the response.
type costVars struct {
	cost             int64       // literal cost, the fallback of the placeholders; default 1
	costVar          string      // placeholder name of `cost`, "" for a literal
	chargeVar        string      // placeholder name of `charge`, read after the response
	body             *bodyCharge // what the zone charges from the response body
	estimate         bool        // the cost taken before the request is settled after it
	llm              *llmZone    // the zone charges LLM tokens or dollars
	costMin, costMax int64       // bounds of costVar's values (0: no bound)
	count            *caddyhttp.ResponseMatcher
	params           string // RateLimit-Policy's parameters
}

func (c costVars) postCharged() bool {
	return c.count != nil || c.chargeVar != "" || c.body != nil
}

func (c costVars) usd() *usage.Prices {
	if c.body == nil {
		return nil
	}
	return c.body.prices
}

// weighted: requests may cost other than 1, so q and r are in cost units.
func (c costVars) weighted() bool {
	return c.cost != 1 || c.costVar != "" || c.chargeVar != "" || c.body != nil
}

// costFor is the cost of the request before it runs; math.MaxInt64 for a
// value too large to represent (it can never pass).
func (z *httpZone) costFor(r *http.Request, repl *caddy.Replacer, now int64) int64 {
	if z.costs.llm != nil {
		if n, ok := z.costs.llm.cost(r, z.costs.cost); ok {
			return n
		}
	}
	if z.costs.costVar == "" {
		return z.costs.cost
	}
	n := z.readCost(repl, now, z.costs.costVar, "cost", z.costs.cost)
	switch c := z.costs; {
	case n < c.costMin:
		z.costClamped(now, n, c.costMin, "at_least")
		return c.costMin
	case c.costMax > 0 && n > c.costMax:
		z.costClamped(now, n, c.costMax, "at_most")
		return c.costMax
	}
	return n
}

// costClamped counts and logs (sampled) a cost n beyond the zone's bound.
func (z *httpZone) costClamped(now, n, bound int64, setting string) {
	add(z.metrics.costFallbacks, 1)
	if c := z.logs.costFallback.Check(z.logger, now, zapcore.WarnLevel, "request cost is beyond the zone's bound; the request costs the bound"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.Int64("value", n), zap.String("bound", setting), zap.Int64("cost", bound))
	}
}

// readCost reads a cost placeholder: a whole number >= 0, math.MaxInt64 for
// one too large to represent, else fallback, counted and, unless empty
// (routine), logged.
func (z *httpZone) readCost(repl *caddy.Replacer, now int64, name, setting string, fallback int64) int64 {
	s, _ := repl.GetString(name)
	s = strings.TrimSpace(s)
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err == nil && n >= 0:
		return n
	case errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(s, "-"):
		return math.MaxInt64
	}
	add(z.metrics.costFallbacks, 1)
	if s == "" {
		return fallback
	}
	if c := z.logs.costFallback.Check(z.logger, now, zapcore.WarnLevel, "request cost is empty or invalid; using the zone's literal cost or the estimate"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.String("setting", setting), zap.String("value", s), zap.Int64("cost", fallback))
	}
	return fallback
}

// logOverBurst logs (sampled) a request whose cost is more than the key
// can ever have: it is denied at once.
func (z *httpZone) logOverBurst(now int64, cost int64, p zones.Plan) {
	msg, limit, what := "request cost exceeds the zone's burst: it can never pass", p.Burst, "burst"
	if z.IsQuota() {
		msg, limit, what = "request cost exceeds the key's quota: it can never pass", p.Events, "quota"
	}
	if c := z.logs.costOverBurst.Check(z.logger, now, zapcore.WarnLevel, msg); c != nil {
		c.Write(zap.String("zone", z.Name), zap.Int64("cost", cost), zap.Int64(what, limit))
	}
}

// countCost counts the cost of an allowed request in its weighted,
// pre-charged zones (post-charged zones count when they charge).
func countCost(tickets []ticket) {
	for i := range tickets {
		v := &tickets[i]
		if v.Allowed && v.Owner.metrics.cost != nil && !v.Owner.costs.postCharged() {
			v.Owner.metrics.cost.Add(float64(v.Cost))
		}
	}
}

// bindMetrics binds m's cost series. A quota zone counts its use, in
// units, whatever its cost.
func (c costVars) bindMetrics(m *zoneMetrics, name string, quota bool) {
	if c.weighted() || c.postCharged() || quota {
		m.cost = costVec.WithLabelValues(name)
	}
	if c.costVar != "" || c.chargeVar != "" {
		m.costFallbacks = costFallsVec.WithLabelValues(name)
	}
	if c.postCharged() {
		m.chargeFailures = chargeFailsVec.WithLabelValues(name)
	}
	if c.usd() != nil {
		m.spend = spendVec.WithLabelValues(name)
	}
	if c.body != nil {
		m.chargeFallbacks = map[string]prometheus.Counter{}
		for _, r := range chargeFallbackReasons() {
			m.chargeFallbacks[r] = chargeFallsVec.WithLabelValues(name, r)
		}
		if c.body.paths == nil {
			m.tokenCharges = make([]prometheus.Counter, len(usage.Formats()))
			for f, format := range usage.Formats()[1:] {
				m.tokenCharges[f+1] = tokenChargesVec.WithLabelValues(name, format)
			}
		}
	}
}

// chargeFailed counts and logs (sampled) a charge that did not reach Redis.
func (z *httpZone) chargeFailed(err error) {
	add(z.metrics.chargeFailures, 1)
	if c := z.logs.chargeFailure.Check(z.logger, monotime.Now(), zapcore.WarnLevel, "charge after the response did not reach Redis; fail policy applied"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.String("fail_policy", z.FailPolicy.String()), zap.Error(err))
	}
}

// usdPrices checks a zone's unit against its charge and is its price
// table, nil when it charges no dollars (docs/configuration.md, "Budgets
// in dollars"): a usd zone counts whole micro-dollars and is charged by
// charge usd, which charges only a usd zone.
func usdPrices(name string, zc *Zone) (*usage.Prices, error) {
	switch {
	case zc.Unit != "" && zc.Unit != config.UnitUSD:
		return nil, fmt.Errorf("zone %s: unit %q is unknown: the one unit is usd (amounts in micro-dollars)", name, zc.Unit)
	case zc.ChargeUSD == nil && zc.Unit == config.UnitUSD:
		return nil, fmt.Errorf("zone %s: a budget in dollars is charged by charge usd { model <pattern> input <$/1M> output <$/1M> }: add it", name)
	case zc.ChargeUSD == nil:
		return nil, nil
	case zc.Unit != config.UnitUSD:
		return nil, fmt.Errorf("zone %s: charge usd counts dollars: give the budget in dollars, e.g. quota 20 usd per month, or events 5 usd with window", name)
	case zc.Charge != "" || zc.ChargeJSON != nil:
		return nil, fmt.Errorf("zone %s: a zone charges one thing: charge usd, or charge with a placeholder or json paths; keep one", name)
	}
	t, err := zc.ChargeUSD.Table()
	if err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	return t, nil
}

// zoneCosts checks and resolves a zone's cost settings.
func zoneCosts(name string, zc *Zone, plan zones.Plan, logger *zap.Logger) (costVars, error) {
	c := costVars{cost: cmp.Or(zc.Cost, 1), count: zc.Count, costMin: zc.CostAtLeast, costMax: zc.CostAtMost}
	prices, err := usdPrices(name, zc)
	if err != nil {
		return c, err
	}
	if prices != nil {
		c.body = &bodyCharge{prices: prices}
	}
	if zc.Concurrency > 0 || zc.Adaptive != nil {
		if zc.Cost != 0 || zc.CostPlaceholder != "" || zc.CostAtLeast != 0 || zc.CostAtMost != 0 || zc.Count != nil || zc.Charge != "" || zc.ChargeJSON != nil || zc.ChargeUSD != nil || zc.ChargeTokens != "" {
			return c, fmt.Errorf("zone %s: cost, count and charge apply to events/window zones, not concurrency zones", name)
		}
		return c, nil
	}
	switch {
	case zc.Cost < 0:
		return c, fmt.Errorf("zone %s: cost must be a whole number of at least 1", name)
	case zc.Quota != nil:
		if c.cost > plan.Burst && plan.Burst > 0 && !c.postCharged() && zc.Charge == "" && zc.ChargeJSON == nil && zc.ChargeTokens == "" {
			return c, fmt.Errorf("zone %s: cost %d is more than the quota (%d): such requests could never pass; lower cost or raise the quota", name, c.cost, plan.Burst)
		}
	case c.cost > plan.Burst:
		return c, fmt.Errorf("zone %s: cost %d is more than the burst (%d): such requests could never pass; lower cost or raise burst", name, c.cost, plan.Burst)
	}
	for _, s := range [][2]string{{"cost", zc.CostPlaceholder}, {"charge", zc.Charge}} {
		if s[1] != "" && config.SinglePlaceholder(s[1]) == "" {
			return c, fmt.Errorf("zone %s: %s %q is not a placeholder: write one placeholder such as {http.response.header.X-Tokens-Used}", name, s[0], s[1])
		}
	}
	c.costVar, c.chargeVar = config.SinglePlaceholder(zc.CostPlaceholder), config.SinglePlaceholder(zc.Charge)
	if zc.ChargeJSON != nil {
		if c.chargeVar != "" {
			return c, fmt.Errorf("zone %s: charge is read from a placeholder or from the body (charge_json), not both: keep one", name)
		}
		p, err := usage.ParsePaths(zc.ChargeJSON)
		if err != nil {
			return c, fmt.Errorf("zone %s: charge_json: %v", name, err)
		}
		c.body = &bodyCharge{paths: &p}
	}
	if zc.ChargeTokens != "" {
		if c.usd() != nil {
			return c, fmt.Errorf("zone %s: charge_tokens and charge_usd both read the body's token usage: keep one", name)
		}
		if c.chargeVar != "" || c.body != nil {
			return c, fmt.Errorf("zone %s: charge_tokens reads the body's token usage: leave out charge and charge_json", name)
		}
		if err := config.CheckTokenCount(zc.ChargeTokens); err != nil {
			return c, fmt.Errorf("zone %s: charge_tokens: %v", name, err)
		}
		c.body = &bodyCharge{tokens: tokenCount(zc.ChargeTokens)}
	}
	c.estimate = c.costVar != "" && (c.chargeVar != "" || c.body != nil)
	if c.llm, err = llmZoneOf(name, zc, c.body); err != nil {
		return c, err
	}
	c.estimate = c.estimate || (c.llm != nil && c.llm.estimate)
	switch {
	case (c.costMin != 0 || c.costMax != 0) && c.costVar == "":
		return c, fmt.Errorf("zone %s: cost_at_least and cost_at_most bound the values of cost_placeholder: give one, e.g. cost {http.request.header.X-Search-Cost} 1 at_least 1 at_most 100", name)
	case c.costMin < 0 || c.costMin > zones.MaxEvents || c.costMax < 0 || c.costMax > zones.MaxEvents:
		return c, fmt.Errorf("zone %s: cost_at_least and cost_at_most must be whole numbers from 1 to 2^40", name)
	case c.costMax != 0 && c.costMin > c.costMax:
		return c, fmt.Errorf("zone %s: cost_at_least %d is more than cost_at_most %d", name, c.costMin, c.costMax)
	case c.costMin > c.cost || (c.costMax != 0 && c.costMax < c.cost):
		return c, fmt.Errorf("zone %s: cost %d is outside cost_at_least and cost_at_most: the fallback is what a request costs without a usable value, so it must be within the bounds", name, c.cost)
	case strings.HasPrefix(c.costVar, "http.request.") && c.costMin == 0:
		logger.Warn("a zone's cost comes from the request, which the client sets, with no floor: a client that sends 0 passes without consuming; "+
			"bound it: cost {placeholder} <fallback> at_least 1 [at_most <n>]",
			zap.String("zone", name), zap.String("placeholder", "{"+c.costVar+"}"))
	}
	// Vendor parameters where draft-10 has no quota unit (docs/headers.md).
	if c.weighted() {
		c.params += ";tally-cost"
	}
	if c.postCharged() {
		c.params += ";tally-post-charged"
	}
	if c.usd() != nil {
		// Not qu: its IANA registry has no currency.
		c.params += `;tally-unit="usd-micro"`
	}
	return c, nil
}
