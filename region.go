package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

// Global shares the limits of `scope global` zones between regions, each
// with its own Redis (distributed's): every region enforces its share of
// each key in its own Redis, and one coordinator per region trades shares
// with the others through this store every sync_interval. No request waits
// on it; while it is unreachable every region keeps its last shares, and
// after lease without contact a region falls back to a tenth of its
// weight.
type Global struct {
	// The global Redis (standalone or Sentinel). Required.
	Redis *Redis `json:"redis,omitempty"`

	// Every region's weight, the same in every region: the shares a key
	// has while no region pushes against it. Required; whole numbers from
	// 1 to 1000000.
	Regions map[string]int64 `json:"regions,omitempty"`

	// How often the region's coordinator syncs with the global store.
	// Default: 1s.
	SyncInterval caddy.Duration `json:"sync_interval,omitempty"`

	// How long a region that cannot reach the global store keeps its
	// shares; the global store reassigns them only after twice this.
	// Default: 5m; at least twice sync_interval.
	Lease caddy.Duration `json:"lease,omitempty"`
}

// regionOptions is the setting of dist's region.
func (dist *Distributed) regionOptions(logger *zap.Logger) (distributed.RegionOptions, error) {
	g := dist.Global
	if g.Redis == nil || len(g.Redis.Addresses) == 0 {
		return distributed.RegionOptions{}, errors.New("distributed: global needs its Redis, e.g. redis rediss://global.internal:6380")
	}
	gopts, err := g.Redis.options(logger)
	if err != nil {
		return distributed.RegionOptions{}, fmt.Errorf("distributed: global: %v", strings.TrimPrefix(err.Error(), "distributed: "))
	}
	gopts.KeyPrefix = dist.KeyPrefix
	opts := distributed.RegionOptions{Region: dist.Region, Global: gopts,
		SyncInterval: time.Duration(g.SyncInterval), Lease: time.Duration(g.Lease)}
	for _, n := range slices.Sorted(maps.Keys(g.Regions)) {
		opts.Regions = append(opts.Regions, distributed.RegionWeight{Name: n, Weight: g.Regions[n]})
	}
	if err := opts.Check(); err != nil {
		return opts, fmt.Errorf("distributed: %v", err)
	}
	return opts, nil
}

// openRegion opens (or shares) the handler's region over its store.
func (h *Handler) openRegion() error {
	opts, err := h.Distributed.regionOptions(h.logger)
	if err != nil {
		return err
	}
	h.region, h.regionKey, err = live.OpenRegion(h.store, h.storeKey, opts, h.logger)
	return err
}

// globalStore is the store zone zc decides with: the handler's, or for a
// scope global zone the region's share of it (then also returned as
// shared).
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

// unmarshalCaddyfile reads the global block of distributed
// (docs/distributed.md).
func (g *Global) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	var leaseLine int
	err := subdirectives(d, nil, "", func(sub string) (err error) {
		switch sub {
		case "redis":
			g.Redis = new(Redis)
			err = g.Redis.unmarshalCaddyfile(d)
		case "regions":
			err = g.unmarshalRegions(d)
		case "sync_interval":
			g.SyncInterval, err = durationArg(d)
		case "lease":
			leaseLine = d.Line()
			g.Lease, err = durationArg(d)
		default:
			err = d.Errf("unknown subdirective %q: expected redis, regions, sync_interval or lease", sub)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("global: %w", err)
	}
	switch {
	case g.Redis == nil:
		return d.Err("global needs the global Redis: add e.g. redis rediss://global.internal:6380")
	case len(g.Regions) == 0:
		return d.Err("global needs the regions and their weights: add e.g. regions eu:2 us:1")
	}
	sync := cmp.Or(time.Duration(g.SyncInterval), distributed.DefaultGlobalSyncInterval)
	lease := cmp.Or(time.Duration(g.Lease), distributed.DefaultGlobalLease)
	if lease < 2*sync {
		return fmt.Errorf("global: lease %v is shorter than twice sync_interval %v: a region must outlive two syncs without contact; use lease %v or more, at %s:%d", lease, sync, 2*sync, d.File(), cmp.Or(leaseLine, d.Line()))
	}
	return nil
}

// unmarshalRegions reads `regions <name>:<weight>...`.
func (g *Global) unmarshalRegions(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.Err("regions needs each region's weight, e.g. regions eu:2 us:1 ap:1")
	}
	g.Regions = map[string]int64{}
	for _, a := range args {
		name, w, ok := strings.Cut(a, ":")
		weight, err := strconv.ParseInt(w, 10, 64)
		switch {
		case !ok || !zones.ValidName(name):
			return d.Errf("regions: %q is not <name>:<weight>: write e.g. eu:2 (names of letters, digits, '_' and '-')", a)
		case err != nil || weight < 1 || weight > 1_000_000:
			return d.Errf("regions: the weight of %s must be a positive whole number (1 to 1000000), e.g. %s:1, not %q", name, name, w)
		}
		if _, dup := g.Regions[name]; dup {
			return d.Errf("regions: %s is listed twice: keep one", name)
		}
		g.Regions[name] = weight
	}
	return nil
}

// globalCollector reports, at scrape time, each live scope global zone's
// coordination: its region's syncs with the global store (repeated for
// every such zone of the region), their failures, the last one's latency,
// the share changes applied, and the zone's keys whose share is not the
// region's weight.
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
