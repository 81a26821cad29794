package ratelimit

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

var (
	counterVec   = live.CounterVec
	histogramVec = live.HistogramVec
	gauge        = live.Gauge
)

// The handler's collectors, created at init (so that a config with only
// the listener wrapper has the zone gauges too) and listed in internal/live.
var (
	requestsVec    = counterVec("requests_total", "Requests decided by a zone, by decision: allowed, denied, dry_run_denied.", "decision")
	storeErrorsVec = counterVec("store_errors_total", "Decisions the shared store (Redis) could not answer: errors, timeouts, open breaker.")
	failPolicyVec  = counterVec("fail_policy_total", "Decisions made by a zone's fail policy while the store was unavailable, by policy.", "policy")
	latencyVec     = histogramVec("store_latency_seconds", "Time a decision spent waiting for the shared store.",
		.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1)
	plansVec           = counterVec("plan_fallbacks_total", "Requests whose per-request events, window or burst was empty or invalid, decided under the zone's literal limit.")
	costVec            = counterVec("cost_total", "Units of cost counted by weighted, post-charged and quota zones: the cost of allowed requests, and what was charged after responses.")
	costFallsVec       = counterVec("cost_fallbacks_total", "Requests whose cost or charge placeholder was empty or invalid, counted at the zone's literal cost.")
	chargeFallsVec     = counterVec("charge_fallbacks_total", "Responses of a zone that charges from the body (charge json, charge tokens, charge usd) that did not carry every path's value, by reason: client_gone, upstream_error, no_price (charge usd: a model without a price), no_usage, malformed, too_large, encoded, not_json; each charged the estimate taken before (or the zone's cost).", "reason")
	tokenChargesVec    = counterVec("token_charges_total", "Responses of a zone with charge tokens charged from the usage they carried, by the format read: openai_chat, openai_responses, anthropic, gemini, ollama.", "format")
	spendVec           = counterVec("spend_usd_total", "Dollars charged by a usd zone (charge usd) after responses: its cost_total, in micro-dollars, as dollars.")
	chargeFailsVec     = counterVec("charge_failures_total", "Charges after the response that Redis did not take within the retry bound (the zone's fail policy then applied).")
	snapshotSecondsVec = histogramVec("snapshot_duration_seconds", "Time taken to copy, encode and store a persisted zone's snapshot.",
		.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
	snapshotKeysVec = counterVec("snapshot_keys_written_total", "Keys written in a persisted zone's snapshots, every snapshot counted.")
	restoredKeysVec = counterVec("snapshot_keys_restored_total", "Keys a persisted zone resumed from its snapshot when Caddy started.")
	writeFailsVec   = counterVec("snapshot_write_failures_total", "Snapshots of a persisted zone not written: storage error or timeout.")
	restoreFailsVec = counterVec("snapshot_restore_failures_total", "Snapshots of a persisted zone not restored at start though one may exist: corrupt, truncated, storage error or timeout.")
	bansVec         = counterVec("bans_total", "Bans started by a zone with ban on this instance (a key it denied for lack of quota, then denied for the ban).")
	dryRunBansVec   = counterVec("dry_run_bans_total", "Bans a dry-run zone with ban would have started.")
	droppedBansVec  = counterVec("bans_dropped_total", "Bans not kept: from=table, a ban this instance did not start or learn because the zone's ban table (max_keys) was full of running bans (the key had the rate without the ban); from=list, running bans the fleet-wide list (1000 per zone, the longest kept) dropped, which async instances other than the one that started them do not learn.", "from")
	emptyKeysVec    = counterVec("empty_keys_total", "Requests whose key expanded to nothing (a missing header, a misspelt placeholder): they share one bucket, the empty key.")
	delayedVec      = histogramVec("delay_seconds", "How long the requests a zone with delay admitted for later waited for their turn (its count: the delayed requests).",
		.01, .05, .1, .25, .5, 1, 2, 3, 5, 10, 30, 60)
	queueFullVec = counterVec("queue_full_total", "Requests a zone with delay denied though their turn was within the delay, because the zone's queue was full.")
	adaptiveVec  = counterVec("adaptive_requests_total", "Requests of an adaptive zone by priority class (all: the zone has no priority), whether the class is the zone's lowest (lowest=\"false\": a class the zone sheds last), and decision: served (admitted), shed, dry_run_shed (a dry run would have shed it).", "class", "lowest", "decision")
)

func init() {
	gauge("waiting", "Requests of a zone with delay waiting for their turn in this instance now.", func(z *zones.Zone, _ int64) (float64, bool) {
		return float64(z.Waiting()), z.Delay > 0 && !z.DryRun
	})
	gauge("banned_keys", "Keys this instance bans in the zone now: the running bans of its ban table, each enforced (at most max_keys).", func(z *zones.Zone, now int64) (float64, bool) {
		return float64(z.BannedKeys(now)), z.Ban > 0
	})
	live.Collect(newGlobalCollector(live.MetricPrefix+"global"), nil)
	gauge("overrides", "Overrides of the zone's limit in force (set through the admin API; fleet-wide for distributed zones).", func(z *zones.Zone, _ int64) (float64, bool) {
		return float64(z.OverrideCount()), !live.IsConnection(z)
	})
	gauge("keys", "Keys the zone holds in this instance's memory.", func(z *zones.Zone, _ int64) (float64, bool) { return float64(z.Keys()), true })
	gauge("in_flight", "Requests holding a slot of a concurrency zone in this instance.", func(z *zones.Zone, _ int64) (float64, bool) {
		return float64(z.InFlight()), z.IsConcurrency() && !live.IsConnection(z)
	})
	gauge("adaptive_limit", "An adaptive zone's limit of requests in flight in this instance now, summed over its keys.", func(z *zones.Zone, _ int64) (float64, bool) {
		l, _ := z.AdaptiveLimit()
		return float64(l), z.IsAdaptive()
	})
	gauge("adaptive_latency_seconds", "An adaptive zone's measured upstream latency: the p90 of the last window its controller closed (0 before one), any key.", func(z *zones.Zone, _ int64) (float64, bool) {
		_, p90 := z.AdaptiveLimit()
		return p90.Seconds(), z.IsAdaptive()
	})
	gauge("adaptive_unloaded_latency_seconds", "An adaptive zone's upstream latency, learned at min when it is above the latency target, which the controller then follows just above (0: none, the target holds), any key.", func(z *zones.Zone, _ int64) (float64, bool) {
		return z.AdaptiveUnloaded().Seconds(), z.IsAdaptive()
	})
}

// zoneMetrics are one zone's series, bound once so that the request path
// only adds to counters. Only series that can move are bound: a nil field
// is a series the zone does not have (none has, with metrics disabled).
type zoneMetrics struct {
	live.Decisions
	storeErrors, failPolicy             prometheus.Counter
	latency                             prometheus.Observer
	planFallbacks                       prometheus.Counter
	cost, costFallbacks, chargeFailures prometheus.Counter
	chargeFallbacks                     map[string]prometheus.Counter // by reason
	spend                               prometheus.Counter            // dollars
	tokenCharges                        []prometheus.Counter          // by usage.Format
	bans                                prometheus.Counter            // dry run: would-be bans
	droppedBans                         [2]prometheus.Counter         // from the table, the list
	delayed                             prometheus.Observer
	queueFull                           prometheus.Counter
	emptyKeys                           prometheus.Counter
	classes                             []classMetrics // adaptive zones: by priority class
}

type classMetrics struct {
	served, shed prometheus.Counter // shed: dry_run_shed in dry run
}

// newClassMetrics binds an adaptive zone's series by class ("all" without
// priority).
func newClassMetrics(zone string, prio *Priority, dryRun bool) []classMetrics {
	names := []string{"all"}
	if prio != nil {
		names = prio.Classes
	}
	shed := "shed"
	if dryRun {
		shed = "dry_run_shed"
	}
	m := make([]classMetrics, len(names))
	for i, n := range names {
		lowest := strconv.FormatBool(i == len(names)-1)
		m[i] = classMetrics{adaptiveVec.WithLabelValues(zone, n, lowest, "served"), adaptiveVec.WithLabelValues(zone, n, lowest, shed)}
	}
	return m
}

// countClass counts a decision of an adaptive zone (m.classes not nil).
func (m *zoneMetrics) countClass(k int, allowed bool) {
	c := &m.classes[min(max(k, 0), len(m.classes)-1)]
	if allowed {
		c.served.Inc()
	} else {
		c.shed.Inc()
	}
}

// newZoneMetrics binds zone cfg's series but its costs' (bindMetrics).
// distributed: the zone has a store; timed: its decisions wait for it.
func newZoneMetrics(cfg zones.Config, key string, distributed, timed bool) zoneMetrics {
	name, dryRun, bans := cfg.Name, cfg.DryRun, cfg.Ban > 0
	m := zoneMetrics{Decisions: live.NewDecisions(requestsVec, name, dryRun)}
	if distributed {
		m.storeErrors = storeErrorsVec.WithLabelValues(name)
		m.failPolicy = failPolicyVec.WithLabelValues(name, cfg.FailPolicy.String())
	}
	if timed {
		m.latency = latencyVec.WithLabelValues(name)
	}
	if cfg.PerRequest {
		m.planFallbacks = plansVec.WithLabelValues(name)
	}
	if bans && dryRun {
		m.bans = dryRunBansVec.WithLabelValues(name)
	} else if bans {
		m.bans = bansVec.WithLabelValues(name)
		m.droppedBans = [2]prometheus.Counter{droppedBansVec.WithLabelValues(name, "table"), droppedBansVec.WithLabelValues(name, "list")}
	}
	if cfg.Delay > 0 && !dryRun { // a dry run never waits
		m.delayed = delayedVec.WithLabelValues(name)
		m.queueFull = queueFullVec.WithLabelValues(name)
	}
	if config.CanBeEmpty(key) {
		m.emptyKeys = emptyKeysVec.WithLabelValues(name)
	}
	return m
}

// observe counts one decision; storeWait is 0 when it was not timed.
func (m *zoneMetrics) observe(d zones.Decision, dryRun bool, storeWait time.Duration) {
	if !m.Bound() { // metrics disabled
		return
	}
	m.Count(d.Allowed, dryRun)
	if d.Delay > 0 {
		m.delayed.Observe(d.Delay.Seconds())
	}
	if !d.Allowed && !dryRun && d.QueueFull && m.queueFull != nil {
		m.queueFull.Inc()
	}
	switch d.Source {
	case zones.SourceFailOpen, zones.SourceFailClosed, zones.SourceFailLocal:
		if m.storeErrors != nil {
			m.storeErrors.Inc()
			m.failPolicy.Inc()
		}
		fallthrough
	case zones.SourceStore:
		if storeWait > 0 && m.latency != nil {
			m.latency.Observe(storeWait.Seconds())
		}
	}
}

// add adds n to c, a series a zone may not have (nil).
func add(c prometheus.Counter, n float64) {
	if c != nil {
		c.Add(n)
	}
}
