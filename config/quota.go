package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
	// The time zones ship in the module (about 450 KB): a quota in
	// Europe/Berlin must load in a container without /usr/share/zoneinfo
	// rather than fail there after working on the developer's machine. The
	// system's zoneinfo still comes first where there is one (Go's
	// time.LoadLocation order), so the embedded copy only fills a gap.
	_ "time/tzdata"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Quota is a zone's calendar quota: at most limit units of cost per
// calendar period of a time zone, counted from 0 at each period's start. A
// zone has either a quota or events and window, never both.
type Quota struct {
	// Units of cost a key may use per period (requests, with the default
	// cost of 1). With limit_placeholder, the fallback for requests whose
	// placeholder is empty or invalid; 0 there denies such requests.
	Limit int64 `json:"limit,omitempty"`

	// A placeholder, such as {plan_quota} set by a `map` of the customer's
	// plan, whose value is this request's limit: quotas per plan. A value
	// that is empty, not a whole number or out of range (1 to 2^40) is
	// replaced by limit, counted in caddy_rate_limit_plan_fallbacks_total
	// and logged (sampled). It must come from the operator (a map, a
	// verified JWT claim), not from what a client sends, or be bounded.
	LimitPlaceholder string `json:"limit_placeholder,omitempty"`

	// The largest value limit_placeholder may give; a larger one falls back
	// to limit, as an unusable one does. 0: no bound.
	LimitAtMost int64 `json:"limit_at_most,omitempty"`

	// The period: "minute", "hour", "day", "week" (ISO 8601: from Monday
	// 00:00) or "month". Required. Periods follow the time zone's wall
	// clock: a day where clocks go forward is 23 hours long, and months
	// have their real lengths.
	Per string `json:"per,omitempty"`

	// The IANA time zone whose calendar the periods follow, such as
	// Europe/Berlin. Default: UTC.
	TimeZone string `json:"time_zone,omitempty"`
}

// Location loads the quota's time zone.
func (q *Quota) Location() (*time.Location, error) {
	if q.TimeZone == "Local" {
		// Instances configured alike must agree on the periods.
		return nil, fmt.Errorf("time zone %q differs from machine to machine: name the zone, e.g. Europe/Berlin, or UTC", q.TimeZone)
	}
	loc, err := time.LoadLocation(q.TimeZone) // "" is UTC
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q: use an IANA name such as Europe/Berlin, America/New_York or UTC", q.TimeZone)
	}
	return loc, nil
}

// unmarshalQuota reads `quota <n|placeholder [fallback] [at_most <n>]> per
// <period> [<time zone>]`.
func unmarshalQuota(d *caddyfile.Dispenser) (*Quota, error) {
	const usage = "quota <n> per minute|hour|day|week|month [<time zone>], e.g. quota 100000 per month Europe/Berlin"
	args := d.RemainingArgs()
	per := slices.Index(args, "per")
	q := &Quota{}
	if at := per - 2; at >= 1 && args[at] == "at_most" {
		if !strings.HasPrefix(args[0], "{") {
			return nil, d.Errf("quota at_most bounds the values of a placeholder: quota {plan_quota} 100000 at_most 1000000 per month")
		}
		var err error
		if q.LimitAtMost, err = ParseInt64(d, "quota at_most", args[at+1], 1, zones.MaxEvents); err != nil {
			return nil, err
		}
		args = append(args[:at:at], args[per:]...)
		per = at
	}
	if per < 1 || per > 2 || len(args)-per < 2 || len(args)-per > 3 {
		return nil, d.Errf("quota needs a number and a period: %s", usage)
	}
	q.Per = args[per+1]
	limit := args[0]
	if strings.HasPrefix(limit, "{") {
		if SinglePlaceholder(limit) == "" {
			return nil, d.Errf("quota takes a number or one placeholder such as {plan_quota}, not %q", limit)
		}
		q.LimitPlaceholder, limit = limit, ""
		if per == 2 {
			limit = args[1]
		}
	} else if per == 2 {
		return nil, d.Errf("quota %s %s: only a placeholder takes a fallback: %s", args[0], args[1], usage)
	}
	if limit != "" {
		var err error
		if q.Limit, err = ParseInt64(d, "quota", limit, 1, zones.MaxEvents); err != nil {
			return nil, err
		}
	}
	if q.LimitAtMost > 0 && q.Limit > q.LimitAtMost {
		return nil, d.Errf("quota at_most %d is less than the fallback, %d: the fallback is what the zone allows without a usable value, so it must be within the bound", q.LimitAtMost, q.Limit)
	}
	if _, err := algorithms.ParsePeriod(q.Per); err != nil {
		return nil, d.Errf("quota: %v", err)
	}
	if len(args)-per == 3 {
		q.TimeZone = args[per+2]
	}
	if _, err := q.Location(); err != nil {
		return nil, d.Errf("quota: %v", err)
	}
	return q, nil
}
