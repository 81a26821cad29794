package ratelimit

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

// globalStore is the store zone zc decides with: the handler's, or for a
// scope global zone the region's share of it (also returned as shared).
func (h *Handler) globalStore(name string, zc *Zone, cfg zones.Config) (zones.Store, *distributed.Shared, error) {
	switch zc.Scope {
	case "", "region":
		return h.store, nil, nil
	case "global":
	default:
		return nil, nil, fmt.Errorf("zone %s: unknown scope %q: use global or region", name, zc.Scope)
	}
	if h.region == nil {
		return nil, nil, fmt.Errorf("zone %s: scope global needs a global block in distributed: distributed { region <name>; global { redis <url>; regions <name>:<weight>... } }", name)
	}
	if cfg.IsConcurrency() || cfg.IsQuota() {
		return nil, nil, fmt.Errorf("zone %s: scope global applies to rate zones (events per window), not to concurrency or quota zones: remove scope global", name)
	}
	h.globalZones = append(h.globalZones, name)
	sh := h.region.Wrap(h.store, name, cfg.Limit())
	return sh, sh, nil
}

// globalCollector reports, at scrape time, each scope global zone's
// coordination (its region's, repeated for every such zone of the region).
type globalCollector struct {
	syncs, failures, latency, changes, keys, coordinator, dropped *prometheus.Desc
}

func newGlobalCollector(prefix string) *globalCollector {
	zone := []string{"zone"}
	return &globalCollector{
		syncs:       prometheus.NewDesc(prefix+"_syncs_total", "Syncs this instance sent to the global store as its region's coordinator.", zone, nil),
		failures:    prometheus.NewDesc(prefix+"_sync_failures_total", "Syncs with the global store that got no answer (the region keeps its last shares).", zone, nil),
		latency:     prometheus.NewDesc(prefix+"_sync_seconds", "How long the last sync with the global store took.", zone, nil),
		changes:     prometheus.NewDesc(prefix+"_share_changes_total", "Shares of keys the global store changed for this region.", zone, nil),
		keys:        prometheus.NewDesc(prefix+"_keys", "Keys of the zone whose region share is not the region's weight (coordinated keys).", zone, nil),
		coordinator: prometheus.NewDesc(prefix+"_coordinator", "1 while this instance coordinates its region's global shares (holds the region's lock), else 0.", zone, nil),
		dropped:     prometheus.NewDesc(prefix+"_demand_dropped_total", "Decisions this instance left out of its region's demand: their keys came while it counted 10,000 others in one poll.", zone, nil),
	}
}

func (c *globalCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.syncs, c.failures, c.latency, c.changes, c.keys, c.coordinator, c.dropped} {
		ch <- d
	}
}

func (c *globalCollector) Collect(ch chan<- prometheus.Metric) {
	for name, z := range live.Zones() {
		sh := live.View(z).Shared
		if sh == nil {
			continue
		}
		r := sh.Region()
		st := r.Stats()
		ch <- prometheus.MustNewConstMetric(c.syncs, prometheus.CounterValue, float64(st.Syncs.Load()), name)
		ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(st.Failures.Load()), name)
		ch <- prometheus.MustNewConstMetric(c.latency, prometheus.GaugeValue, time.Duration(st.LastLatency.Load()).Seconds(), name)
		ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(st.ShareChanges.Load()), name)
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(r.Coordinated(name)), name)
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(r.DemandDropped(name)), name)
		coordinating := 0.0
		if st.Coordinating.Load() {
			coordinating = 1
		}
		ch <- prometheus.MustNewConstMetric(c.coordinator, prometheus.GaugeValue, coordinating, name)
	}
}
