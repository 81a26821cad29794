package ratelimit

import (
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/zones"
)

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

// nominalSeconds orders quota periods: their usual lengths.
var nominalSeconds = map[algorithms.Period]float64{
	algorithms.Minute: 60, algorithms.Hour: 3600, algorithms.Day: 86400,
	algorithms.Week: 7 * 86400, algorithms.Month: 30.436875 * 86400,
}
