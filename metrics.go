package ratelimit

import (
	"errors"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// The collectors are created once per process and registered into each
// config's registry, so counts survive reloads and a second registration is
// not an error.
var collectors = struct {
	once        sync.Once
	requests    *prometheus.CounterVec
	storeErrors *prometheus.CounterVec
	failPolicy  *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	keys        *keysCollector
	plans       *prometheus.CounterVec
	inFlight    *inFlightCollector
	cost        *prometheus.CounterVec
	costFalls   *prometheus.CounterVec
	chargeFails *prometheus.CounterVec
	connections *prometheus.CounterVec
	connsOpen   *connectionsCollector

	snapshotSeconds *prometheus.HistogramVec
	snapshotKeys    *prometheus.CounterVec
	restoredKeys    *prometheus.CounterVec
	writeFails      *prometheus.CounterVec
	restoreFails    *prometheus.CounterVec
	bans            *prometheus.CounterVec
	dryRunBans      *prometheus.CounterVec
	droppedBans     *prometheus.CounterVec
	banned          *bannedCollector
	delayed         *prometheus.HistogramVec
	queueFull       *prometheus.CounterVec
	waiting         *waitingCollector
	global          *globalCollector
	emptyKeys       *prometheus.CounterVec
}{}

func initCollectors() {
	const ns, sub = "caddy", "rate_limit"
	collectors.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "Requests decided by a zone, by decision: allowed, denied, dry_run_denied.",
	}, []string{"zone", "decision"})
	collectors.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "store_errors_total",
		Help: "Decisions the shared store (Redis) could not answer: errors, timeouts, open breaker.",
	}, []string{"zone"})
	collectors.failPolicy = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "fail_policy_total",
		Help: "Decisions made by a zone's fail policy while the store was unavailable, by policy.",
	}, []string{"zone", "policy"})
	collectors.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "store_latency_seconds",
		Help:    "Time a decision spent waiting for the shared store.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
	}, []string{"zone"})
	collectors.plans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "plan_fallbacks_total",
		Help: "Requests whose per-request events, window or burst was empty or invalid, decided under the zone's literal limit.",
	}, []string{"zone"})
	collectors.cost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cost_total",
		Help: "Units of cost counted by weighted, post-charged and quota zones: the cost of allowed requests, and what was charged after responses.",
	}, []string{"zone"})
	collectors.costFalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cost_fallbacks_total",
		Help: "Requests whose cost or charge placeholder was empty or invalid, counted at the zone's literal cost.",
	}, []string{"zone"})
	collectors.chargeFails = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "charge_failures_total",
		Help: "Charges after the response that Redis did not take within the retry bound (the zone's fail policy then applied).",
	}, []string{"zone"})
	collectors.connections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "connections_total",
		Help: "New TCP connections decided by a connection zone or a deny_while zone (listener wrapper rate_limit), by decision: allowed, denied, dry_run_denied.",
	}, []string{"zone", "decision"})
	collectors.snapshotSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_duration_seconds",
		Help:    "Time taken to copy, encode and store a persisted zone's snapshot.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"zone"})
	collectors.snapshotKeys = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_keys_written_total",
		Help: "Keys written in a persisted zone's snapshots, every snapshot counted.",
	}, []string{"zone"})
	collectors.restoredKeys = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_keys_restored_total",
		Help: "Keys a persisted zone resumed from its snapshot when Caddy started.",
	}, []string{"zone"})
	collectors.writeFails = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_write_failures_total",
		Help: "Snapshots of a persisted zone not written: storage error or timeout.",
	}, []string{"zone"})
	collectors.restoreFails = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_restore_failures_total",
		Help: "Snapshots of a persisted zone not restored at start though one may exist: corrupt, truncated, storage error or timeout.",
	}, []string{"zone"})
	collectors.bans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bans_total",
		Help: "Bans started by a zone with ban on this instance (a key it denied for lack of quota, then denied for the ban).",
	}, []string{"zone"})
	collectors.dryRunBans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "dry_run_bans_total",
		Help: "Bans a dry-run zone with ban would have started.",
	}, []string{"zone"})
	collectors.droppedBans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bans_dropped_total",
		Help: "Bans not kept: from=table, a ban this instance did not start or learn because the zone's ban table (max_keys) was full of running bans (the key had the rate without the ban); from=list, running bans the fleet-wide list (1000 per zone, the longest kept) dropped, which async instances other than the one that started them do not learn.",
	}, []string{"zone", "from"})
	collectors.emptyKeys = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "empty_keys_total",
		Help: "Requests whose key expanded to nothing (a missing header, a misspelt placeholder): they share one bucket, the empty key.",
	}, []string{"zone"})
	collectors.delayed = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "delay_seconds",
		Help: "How long the requests a zone with delay admitted for later waited for their turn (its count: the delayed requests).",
		// From one 100 ms turn to the longest delay, a minute.
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 3, 5, 10, 30, 60},
	}, []string{"zone"})
	collectors.queueFull = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "queue_full_total",
		Help: "Requests a zone with delay denied though their turn was within the delay, because the zone's queue was full.",
	}, []string{"zone"})
	collectors.waiting = &waitingCollector{desc: prometheus.NewDesc(ns+"_"+sub+"_waiting",
		"Requests of a zone with delay waiting for their turn in this instance now.", []string{"zone"}, nil)}
	collectors.banned = &bannedCollector{desc: prometheus.NewDesc(ns+"_"+sub+"_banned_keys",
		"Keys this instance bans in the zone now: the running bans of its ban table, each enforced (at most max_keys).", []string{"zone"}, nil)}
	collectors.global = newGlobalCollector(ns + "_" + sub + "_global")
	collectors.keys = &keysCollector{desc: prometheus.NewDesc(ns+"_"+sub+"_keys",
		"Keys the zone holds in this instance's memory.", []string{"zone"}, nil)}
	collectors.inFlight = &inFlightCollector{desc: prometheus.NewDesc(ns+"_"+sub+"_in_flight",
		"Requests holding a slot of a concurrency zone in this instance.", []string{"zone"}, nil)}
	collectors.connsOpen = &connectionsCollector{desc: prometheus.NewDesc(ns+"_"+sub+"_connections_in_flight",
		"Connections holding a slot of a connection concurrency zone (listener wrapper rate_limit) in this instance.", []string{"zone"}, nil)}
}

// registerMetrics makes the collectors visible in ctx's registry.
func registerMetrics(ctx caddy.Context) error {
	collectors.once.Do(initCollectors)
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{collectors.requests, collectors.storeErrors,
		collectors.failPolicy, collectors.latency, collectors.keys, collectors.plans, collectors.inFlight,
		collectors.cost, collectors.costFalls, collectors.chargeFails, collectors.connections, collectors.connsOpen,
		collectors.snapshotSeconds, collectors.snapshotKeys, collectors.restoredKeys, collectors.writeFails, collectors.restoreFails,
		collectors.bans, collectors.dryRunBans, collectors.droppedBans, collectors.banned, collectors.delayed, collectors.queueFull, collectors.waiting,
		collectors.global, collectors.emptyKeys} {
		if err := reg.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// zoneMetrics are one zone's series, bound once so that the request path only
// adds to counters. Only series that can move are bound: a dry-run zone never
// denies and a zone that always enforces never dry-run-denies; a local zone
// has no store to fail or wait for; only strict mode waits for Redis on the
// request path. A nil field is a series the zone does not have.
type zoneMetrics struct {
	allowed, denied, dryRunDenied prometheus.Counter
	storeErrors                   prometheus.Counter
	failPolicy                    prometheus.Counter
	latency                       prometheus.Observer
	planFallbacks                 prometheus.Counter // nil unless the zone reads its limit from requests
	// nil unless the zone is weighted or post-charged:
	cost, costFallbacks, chargeFailures prometheus.Counter
	bans                                prometheus.Counter    // nil unless the zone bans (dry run: would-be bans)
	droppedBans                         [2]prometheus.Counter // from the table, the list; nil unless the zone bans
	delayed                             prometheus.Observer   // nil unless the zone has delay
	queueFull                           prometheus.Counter    // nil unless the zone has delay
	emptyKeys                           prometheus.Counter    // nil unless the key template can expand to nothing
}

// newZoneMetrics binds the series of a zone. distributed says whether the
// zone has a store, timed whether its decisions wait for it, perRequest
// whether it reads its limit from requests, bans whether it has ban.
func newZoneMetrics(name string, policy zones.FailPolicy, dryRun, distributed, timed, perRequest, bans bool, costs costVars) *zoneMetrics {
	m := &zoneMetrics{allowed: collectors.requests.WithLabelValues(name, "allowed")}
	if dryRun {
		m.dryRunDenied = collectors.requests.WithLabelValues(name, "dry_run_denied")
	} else {
		m.denied = collectors.requests.WithLabelValues(name, "denied")
	}
	if distributed {
		m.storeErrors = collectors.storeErrors.WithLabelValues(name)
		m.failPolicy = collectors.failPolicy.WithLabelValues(name, policy.String())
	}
	if timed {
		m.latency = collectors.latency.WithLabelValues(name)
	}
	if perRequest {
		m.planFallbacks = collectors.plans.WithLabelValues(name)
	}
	if costs.weighted() || costs.postCharged() {
		m.cost = collectors.cost.WithLabelValues(name)
	}
	if costs.costVar != "" || costs.chargeVar != "" {
		m.costFallbacks = collectors.costFalls.WithLabelValues(name)
	}
	if costs.postCharged() {
		m.chargeFailures = collectors.chargeFails.WithLabelValues(name)
	}
	if bans && dryRun {
		m.bans = collectors.dryRunBans.WithLabelValues(name)
	} else if bans {
		m.bans = collectors.bans.WithLabelValues(name)
		m.droppedBans = [2]prometheus.Counter{collectors.droppedBans.WithLabelValues(name, "table"), collectors.droppedBans.WithLabelValues(name, "list")}
	}
	return m
}

// delays binds the series of a zone with delay (not in dry run, which
// never waits).
func (m *zoneMetrics) delays(name string) {
	m.delayed = collectors.delayed.WithLabelValues(name)
	m.queueFull = collectors.queueFull.WithLabelValues(name)
}

// observe counts one decision; storeWait is 0 when the decision was not
// timed (local and async modes).
func (m *zoneMetrics) observe(d zones.Decision, dryRun bool, storeWait time.Duration) {
	switch {
	case d.Allowed:
		m.allowed.Inc()
	case dryRun:
		m.dryRunDenied.Inc()
	default:
		m.denied.Inc()
		if d.QueueFull && m.queueFull != nil {
			m.queueFull.Inc()
		}
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

// dropZoneSeries deletes the series of a zone no loaded config defines any
// more, so that a reload that removes a zone leaves nothing behind.
func dropZoneSeries(name string) {
	collectors.once.Do(initCollectors)
	l := prometheus.Labels{"zone": name}
	collectors.requests.DeletePartialMatch(l)
	collectors.storeErrors.DeletePartialMatch(l)
	collectors.failPolicy.DeletePartialMatch(l)
	collectors.latency.DeletePartialMatch(l)
	collectors.plans.DeletePartialMatch(l)
	collectors.cost.DeletePartialMatch(l)
	collectors.costFalls.DeletePartialMatch(l)
	collectors.chargeFails.DeletePartialMatch(l)
	collectors.connections.DeletePartialMatch(l)
	collectors.snapshotSeconds.DeletePartialMatch(l)
	collectors.snapshotKeys.DeletePartialMatch(l)
	collectors.restoredKeys.DeletePartialMatch(l)
	collectors.writeFails.DeletePartialMatch(l)
	collectors.restoreFails.DeletePartialMatch(l)
	collectors.bans.DeletePartialMatch(l)
	collectors.dryRunBans.DeletePartialMatch(l)
	collectors.droppedBans.DeletePartialMatch(l)
	collectors.delayed.DeletePartialMatch(l)
	collectors.queueFull.DeletePartialMatch(l)
	collectors.emptyKeys.DeletePartialMatch(l)
}

// waitingCollector reports, at scrape time, the requests each live zone
// with delay has waiting for their turn in this process.
type waitingCollector struct{ desc *prometheus.Desc }

func (c *waitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *waitingCollector) Collect(ch chan<- prometheus.Metric) {
	for name, z := range liveZones() {
		if z.Delay > 0 && !z.DryRun {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(z.Waiting()), name)
		}
	}
}

// bannedCollector reports, at scrape time, the keys each live zone with ban
// knows to be banned.
type bannedCollector struct{ desc *prometheus.Desc }

func (c *bannedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *bannedCollector) Collect(ch chan<- prometheus.Metric) {
	now := monotime.Now()
	for name, z := range liveZones() {
		if z.Ban > 0 {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(z.BannedKeys(now)), name)
		}
	}
}

// keysCollector reports, at scrape time, how many keys each live zone holds.
type keysCollector struct{ desc *prometheus.Desc }

func (c *keysCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *keysCollector) Collect(ch chan<- prometheus.Metric) {
	for name, z := range liveZones() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(z.Keys()), name)
	}
}

// inFlightCollector reports, at scrape time, the requests each live
// concurrency zone has in flight in this process.
type inFlightCollector struct{ desc *prometheus.Desc }

func (c *inFlightCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *inFlightCollector) Collect(ch chan<- prometheus.Metric) {
	for name, z := range liveZones() {
		if z.IsConcurrency() && !isConnectionZone(z) {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(z.InFlight()), name)
		}
	}
}

// connectionsCollector reports, at scrape time, the connections each live
// connection concurrency zone holds open in this process.
type connectionsCollector struct{ desc *prometheus.Desc }

func (c *connectionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *connectionsCollector) Collect(ch chan<- prometheus.Metric) {
	for name, z := range liveZones() {
		if z.IsConcurrency() && isConnectionZone(z) {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(z.InFlight()), name)
		}
	}
}

// connectionMetrics are a connection zone's (or deny_while zone's) series of
// caddy_rate_limit_connections_total, bound once; dryRunDenied is nil unless
// the zone is in dry run, denied nil when it is.
type connectionMetrics struct {
	allowed, denied, dryRunDenied prometheus.Counter
}

func newConnectionMetrics(zone string, dryRun bool) *connectionMetrics {
	m := &connectionMetrics{allowed: collectors.connections.WithLabelValues(zone, "allowed")}
	if dryRun {
		m.dryRunDenied = collectors.connections.WithLabelValues(zone, "dry_run_denied")
	} else {
		m.denied = collectors.connections.WithLabelValues(zone, "denied")
	}
	return m
}

// Interface guards
var (
	_ prometheus.Collector = (*keysCollector)(nil)
	_ prometheus.Collector = (*inFlightCollector)(nil)
	_ prometheus.Collector = (*connectionsCollector)(nil)
	_ prometheus.Collector = (*bannedCollector)(nil)
)

// snapshotMetrics are a persisted zone's series (persist.go); a nil one
// records nothing (metrics disabled).
type snapshotMetrics struct {
	duration                       prometheus.Observer
	keysWritten, keysRestored      prometheus.Counter
	writeFailures, restoreFailures prometheus.Counter
}

func newSnapshotMetrics(zone string) *snapshotMetrics {
	return &snapshotMetrics{
		duration:        collectors.snapshotSeconds.WithLabelValues(zone),
		keysWritten:     collectors.snapshotKeys.WithLabelValues(zone),
		keysRestored:    collectors.restoredKeys.WithLabelValues(zone),
		writeFailures:   collectors.writeFails.WithLabelValues(zone),
		restoreFailures: collectors.restoreFails.WithLabelValues(zone),
	}
}

func (m *snapshotMetrics) written(keys int, took time.Duration) {
	if m != nil {
		m.duration.Observe(took.Seconds())
		m.keysWritten.Add(float64(keys))
	}
}

func (m *snapshotMetrics) restored(keys int) {
	if m != nil {
		m.keysRestored.Add(float64(keys))
	}
}

// failed counts a snapshot that was not written (stage "write") or not
// restored for another reason than there being none ("restore").
func (m *snapshotMetrics) failed(stage string) {
	if m == nil {
		return
	}
	if stage == "write" {
		m.writeFailures.Inc()
	} else {
		m.restoreFailures.Inc()
	}
}
