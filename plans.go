package ratelimit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/zones"
)

// planVars names the placeholders a zone reads its limit from ("" for a
// literal) and their bounds (0: none) (docs/configuration.md, "Limits per
// plan"): a value invalid for a request falls back to the literal, counted
// and logged (sampled), never a 500.
type planVars struct {
	events, window, burst string
	eventsMax, burstMax   int64
	windowMin             time.Duration
	quota                 string // a quota zone's limit (configureQuota)
	quotaMax              int64
}

var (
	errAboveAtMost  = errors.New("above the zone's at_most")
	errBelowAtLeast = errors.New("below the zone's at_least")
)

// newPlanVars checks and resolves zone name's plan settings, and warns of
// an unbounded placeholder a client can set (http.request.*).
func newPlanVars(name string, zc *Zone, logger *zap.Logger) (planVars, error) {
	v := planVars{
		events: zc.MaxEventsPlaceholder, window: zc.WindowPlaceholder, burst: zc.BurstPlaceholder,
		eventsMax: zc.MaxEventsAtMost, windowMin: time.Duration(zc.WindowAtLeast), burstMax: zc.BurstAtMost,
	}
	for _, ph := range []*string{&v.events, &v.window, &v.burst} {
		if *ph != "" && config.SinglePlaceholder(*ph) == "" {
			return v, fmt.Errorf("zone %s: %q is not a placeholder: write one placeholder such as {plan_rpm}", name, *ph)
		}
		*ph = config.SinglePlaceholder(*ph)
	}
	for _, b := range []struct {
		setting, ph string
		set         bool
		bad         string // what is wrong with the bound, "" when nothing
	}{
		{"events at_most", v.events, v.eventsMax != 0, boundError(v.eventsMax < 0 || v.eventsMax > zones.MaxEvents,
			"must be a whole number from 1 to 2^40", v.eventsMax != 0 && v.eventsMax < zc.MaxEvents,
			fmt.Sprintf("%d is less than the fallback, events %d", v.eventsMax, zc.MaxEvents))},
		{"window at_least", v.window, v.windowMin != 0, boundError(v.windowMin < 0,
			"must be a positive duration", v.windowMin > time.Duration(zc.Window),
			fmt.Sprintf("%v is longer than the fallback, window %v", v.windowMin, time.Duration(zc.Window)))},
		{"burst at_most", v.burst, v.burstMax != 0, boundError(v.burstMax < 0 || v.burstMax > zones.MaxEvents,
			"must be a whole number from 1 to 2^40", v.burstMax != 0 && v.burstMax < zc.Burst,
			fmt.Sprintf("%d is less than the fallback, burst %d", v.burstMax, zc.Burst))},
	} {
		switch {
		case b.set && b.ph == "":
			return v, fmt.Errorf("zone %s: %s bounds the values of a placeholder: give the setting one, e.g. events {plan_rpm} 60 at_most 6000", name, b.setting)
		case b.bad != "":
			return v, fmt.Errorf("zone %s: %s %s", name, b.setting, b.bad)
		case b.ph != "" && !b.set && strings.HasPrefix(b.ph, "http.request."):
			logger.Warn("a zone's limit comes from the request, which the client sets, with no bound: it can pick any limit tally can represent (2^40 events, one per microsecond); "+
				"take plans from the operator (map, a verified JWT claim) or bound them (events at_most, window at_least, burst at_most)",
				zap.String("zone", name), zap.String("setting", strings.Fields(b.setting)[0]), zap.String("placeholder", "{"+b.ph+"}"))
		}
	}
	return v, nil
}

func boundError(outOfRange bool, rangeText string, beyondFallback bool, fallbackText string) string {
	switch {
	case outOfRange:
		return rangeText
	case beyondFallback:
		return fallbackText + ": the fallback is what the zone allows without a usable value, so it must be within the bound"
	}
	return ""
}

func (v planVars) any() bool {
	return v.events != "" || v.window != "" || v.burst != "" || v.quota != ""
}

// planFor is the plan the request is decided under.
func (z *httpZone) planFor(repl *caddy.Replacer, now int64) zones.Plan {
	lit := z.Plan()
	if !z.vars.any() {
		return lit
	}
	var fb fellBack
	if z.vars.quota != "" {
		// The literal quota may be 0: then nothing passes.
		if n := fb.limit(repl, "quota", z.vars.quota, z.vars.quotaMax, 0); fb.setting == "" {
			return zones.QuotaPlan(n)
		}
		z.planFallback(now, fb)
		return lit
	}
	events, window, burst := lit.Events, lit.Window, z.Config.Burst
	if z.vars.events != "" {
		events = fb.limit(repl, "events", z.vars.events, z.vars.eventsMax, events)
	}
	if z.vars.window != "" {
		s, _ := repl.GetString(z.vars.window)
		switch d, err := caddy.ParseDuration(strings.TrimSpace(s)); {
		case err != nil || d <= 0:
			fb.note("window", s, nil)
		case d < z.vars.windowMin:
			fb.note("window", s, errBelowAtLeast)
		default:
			window = d
		}
	}
	if z.vars.burst != "" {
		burst = fb.limit(repl, "burst", z.vars.burst, z.vars.burstMax, burst)
	}
	p, err := zones.NewPlan(events, window, burst)
	if err != nil {
		// Fine alone but not together (more than one event per
		// microsecond, B·T over 100 years).
		p = lit
		fb.note("plan", strconv.FormatInt(events, 10)+"/"+window.String(), err)
	}
	if fb.setting != "" {
		z.planFallback(now, fb)
	}
	return p
}

// fellBack is a request's first setting that fell back, for the log.
type fellBack struct {
	setting, value string
	why            error
}

func (f *fellBack) note(setting, value string, why error) {
	if f.setting == "" {
		*f = fellBack{setting, value, why}
	}
}

// limit is ph's value when it is from 1 to 2^40 and at most atMost (0: no
// bound), else lit, noted.
func (f *fellBack) limit(repl *caddy.Replacer, setting, ph string, atMost, lit int64) int64 {
	s, _ := repl.GetString(ph)
	switch n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); {
	case err != nil || n < 1 || n > zones.MaxEvents:
		f.note(setting, s, nil)
	case atMost > 0 && n > atMost:
		f.note(setting, s, errAboveAtMost)
	default:
		return n
	}
	return lit
}

func (z *httpZone) planFallback(now int64, fb fellBack) {
	add(z.metrics.planFallbacks, 1)
	if c := z.logs.planFallback.Check(z.logger, now, zapcore.WarnLevel, "per-request limit is empty or invalid; using the zone's literal value"); c != nil {
		fields := []zap.Field{zap.String("zone", z.Name), zap.String("setting", fb.setting), zap.String("value", fb.value)}
		if fb.why != nil {
			fields = append(fields, zap.Error(fb.why))
		}
		c.Write(fields...)
	}
}

// configureQuota sets quota q into a zone's config and its placeholder
// into vars, and warns of an unbounded one the client sets.
func configureQuota(q *Quota, name string, cfg *zones.Config, vars *planVars, logger *zap.Logger) error {
	p, err := algorithms.ParsePeriod(q.Per)
	if err != nil {
		return fmt.Errorf("zone %s: quota: %v", name, err)
	}
	loc, err := q.Location()
	if err != nil {
		return fmt.Errorf("zone %s: quota: %v", name, err)
	}
	cfg.Quota, cfg.Period, cfg.Location = q.Limit, p, loc
	switch {
	case q.LimitAtMost != 0 && q.LimitPlaceholder == "":
		return fmt.Errorf("zone %s: quota limit_at_most bounds the values of limit_placeholder: give one, or remove the bound", name)
	case q.LimitAtMost < 0 || q.LimitAtMost > zones.MaxEvents:
		return fmt.Errorf("zone %s: quota limit_at_most must be a whole number from 1 to 2^40", name)
	case q.LimitAtMost != 0 && q.Limit > q.LimitAtMost:
		return fmt.Errorf("zone %s: quota limit_at_most %d is less than the fallback, limit %d", name, q.LimitAtMost, q.Limit)
	}
	if q.LimitPlaceholder != "" {
		if vars.quota = config.SinglePlaceholder(q.LimitPlaceholder); vars.quota == "" {
			return fmt.Errorf("zone %s: %q is not a placeholder: write one placeholder such as {plan_quota}", name, q.LimitPlaceholder)
		}
		vars.quotaMax = q.LimitAtMost
		if q.LimitAtMost == 0 && strings.HasPrefix(vars.quota, "http.request.") {
			logger.Warn("a zone's quota comes from the request, which the client sets, with no bound: it can pick any quota up to 2^40; "+
				"take plans from the operator (map, a verified JWT claim) or bound them (quota {placeholder} <fallback> at_most <n> per ...)",
				zap.String("zone", name), zap.String("placeholder", q.LimitPlaceholder))
		}
	}
	return nil
}
