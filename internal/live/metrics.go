package live

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// MetricPrefix begins every metric's name.
const MetricPrefix = "caddy_rate_limit_"

// The collectors are created once per process and registered into each
// config's registry, so counts survive reloads.
var collectors struct {
	sync.Mutex
	all  []prometheus.Collector
	vecs []*prometheus.MetricVec // a zone's series go with the zone (dropSeries)
}

// Collect lists c for each config's registry; vec, when not nil, is c's
// vector labelled by zone first, whose series go with the zone.
func Collect(c prometheus.Collector, vec *prometheus.MetricVec) {
	collectors.Lock()
	defer collectors.Unlock()
	collectors.all = append(collectors.all, c)
	if vec != nil {
		collectors.vecs = append(collectors.vecs, vec)
	}
}

// CounterVec makes and lists a counter labelled by zone, then labels.
func CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPrefix + name, Help: help}, append([]string{"zone"}, labels...))
	Collect(v, v.MetricVec)
	return v
}

// HistogramVec makes and lists a histogram labelled by zone.
func HistogramVec(name, help string, buckets ...float64) *prometheus.HistogramVec {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricPrefix + name, Help: help, Buckets: buckets}, []string{"zone"})
	Collect(v, v.MetricVec)
	return v
}

// zoneGauge reports value of each running zone it applies to (ok).
type zoneGauge struct {
	desc  *prometheus.Desc
	value func(z *zones.Zone, now int64) (v float64, ok bool)
}

// Gauge lists a gauge labelled by zone, read from each running zone at
// scrape time.
func Gauge(name, help string, value func(z *zones.Zone, now int64) (float64, bool)) {
	Collect(&zoneGauge{prometheus.NewDesc(MetricPrefix+name, help, []string{"zone"}, nil), value}, nil)
}

func (g *zoneGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *zoneGauge) Collect(ch chan<- prometheus.Metric) {
	now := monotime.Now()
	for name, z := range Zones() {
		if v, ok := g.value(z, now); ok {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, v, name)
		}
	}
}

// RegisterMetrics makes every listed collector visible in reg, a config's
// registry (nil: metrics are off).
func RegisterMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	collectors.Lock()
	all := collectors.all
	collectors.Unlock()
	for _, c := range all {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

// dropSeries deletes the series of a zone no loaded config defines any
// more, so that a reload that removes a zone leaves nothing behind.
func dropSeries(name string) {
	collectors.Lock()
	defer collectors.Unlock()
	for _, v := range collectors.vecs {
		v.DeletePartialMatch(prometheus.Labels{"zone": name})
	}
}

// Decisions are a zone's series of one decision counter, by decision; only
// those that can move are bound: dryRunDenied is nil unless the zone is in
// dry run, denied nil when it is.
type Decisions struct {
	allowed, denied, dryRunDenied prometheus.Counter
}

// NewDecisions binds zone's series of v, a counter labelled by zone and
// decision.
func NewDecisions(v *prometheus.CounterVec, zone string, dryRun bool) Decisions {
	m := Decisions{allowed: v.WithLabelValues(zone, "allowed")}
	if dryRun {
		m.dryRunDenied = v.WithLabelValues(zone, "dry_run_denied")
	} else {
		m.denied = v.WithLabelValues(zone, "denied")
	}
	return m
}

// Count counts one decision.
func (m *Decisions) Count(allowed, dryRun bool) {
	switch {
	case allowed:
		m.allowed.Inc()
	case dryRun:
		m.dryRunDenied.Inc()
	default:
		m.denied.Inc()
	}
}

// Bound reports whether m's series are bound (false: the zero Decisions of
// a module with metrics off).
func (m *Decisions) Bound() bool { return m.allowed != nil }

// The lines a request or a connection can log are sampled so that a flood
// of requests cannot flood the log: in each second, for each handler (or
// wrapper) and line, the first logFirst, then one in logThereafter. Lines
// no request causes (provisioning, Redis outages: logged once each) are not
// sampled, nor the DEBUG line of a failed refund. It is zap's sampler's rule
// for one atomic add a line: zap's reads the clock and hashes each it drops.
const (
	logFirst      = 10
	logThereafter = 1000
)

// Sampler samples one line by the rule above.
type Sampler struct {
	second atomic.Int64 // monotime seconds of the current second
	count  atomic.Int64 // events in it
}

// allow reports whether the event at now (monotime) is logged.
func (s *Sampler) allow(now int64) bool {
	sec := now / int64(time.Second)
	if old := s.second.Load(); old != sec && s.second.CompareAndSwap(old, sec) {
		s.count.Store(0)
	}
	n := s.count.Add(1)
	return n <= logFirst || (n-logFirst)%logThereafter == 0
}

// Check is logger.Check(lvl, msg) for a line the sampler lets through, nil
// otherwise; a level the logger leaves out is not counted.
func (s *Sampler) Check(logger *zap.Logger, now int64, lvl zapcore.Level, msg string) *zapcore.CheckedEntry {
	if !logger.Core().Enabled(lvl) || !s.allow(now) {
		return nil
	}
	return logger.Check(lvl, msg)
}
