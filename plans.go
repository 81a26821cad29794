package ratelimit

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/zones"
)

// Limits per plan: a zone's events, window and burst may each be a
// placeholder (a `map` of the customer's plan, a JWT claim). The zone's
// literal values are the fallback for a request whose value is empty or
// invalid; that is counted (caddy_rate_limit_plan_fallbacks_total) and
// logged, sampled, so that a misconfigured map is visible. A value is
// validated per request as the Caddyfile validates literals, so an invalid
// one never becomes a 500 or an unlimited key.

// planVars names the placeholders a zone reads its limit from ("" when the
// setting is a literal).
type planVars struct {
	events, window, burst string
}

func (v planVars) any() bool { return v.events != "" || v.window != "" || v.burst != "" }

// planFor returns the plan the request is decided under: the zone's
// literal plan (no lookup, no allocation) unless it reads one from the
// request. now (monotime) is for the sampled log of a fallback.
func (z *zoneHandler) planFor(repl *caddy.Replacer, now int64) zones.Plan {
	lit := z.Plan()
	if !z.vars.any() {
		return lit
	}
	events, window, burst := lit.Events, lit.Window, z.Config.Burst
	var bad string // the first setting that fell back, for the log
	var badValue string
	if z.vars.events != "" {
		s, _ := repl.GetString(z.vars.events)
		if n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil && n >= 1 && n <= zones.MaxEvents {
			events = n
		} else {
			bad, badValue = "events", s
		}
	}
	if z.vars.window != "" {
		s, _ := repl.GetString(z.vars.window)
		if d, err := caddy.ParseDuration(strings.TrimSpace(s)); err == nil && d > 0 {
			window = d
		} else if bad == "" {
			bad, badValue = "window", s
		}
	}
	if z.vars.burst != "" {
		s, _ := repl.GetString(z.vars.burst)
		if n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil && n >= 1 && n <= zones.MaxEvents {
			burst = n
		} else if bad == "" {
			bad, badValue = "burst", s
		}
	}
	p, err := zones.NewPlan(events, window, burst)
	if err != nil {
		// Each value is fine alone but not together (more than one event
		// per microsecond, B·T over 100 years): the literal plan.
		p = lit
		if bad == "" {
			bad, badValue = "plan", strconv.FormatInt(events, 10)+"/"+window.String()
		}
	}
	if bad != "" {
		z.planFallback(now, bad, badValue, err)
	}
	return p
}

// planFallback counts and logs (sampled) a request whose per-request limit
// was unusable.
func (z *zoneHandler) planFallback(now int64, setting, value string, err error) {
	if z.metrics != nil {
		z.metrics.planFallbacks.Inc()
	}
	if c := z.logs.planFallback.check(z.logger, now, zapcore.WarnLevel, "per-request limit is empty or invalid; using the zone's literal value"); c != nil {
		fields := []zap.Field{zap.String("zone", z.Name), zap.String("setting", setting), zap.String("value", value)}
		if err != nil {
			fields = append(fields, zap.Error(err))
		}
		c.Write(fields...)
	}
}
