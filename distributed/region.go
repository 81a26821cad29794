package distributed

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// Multi-region budgets: a `scope global` zone is decided in each region's
// Redis at the region's share of each key's limit; one coordinator per
// region trades shares through a global Redis (global.lua). Shares sum to
// at most 1 at every instant (docs/distributed.md, "Multi-region").

// ShareScale is a whole key's limit in share units (parts per million).
const ShareScale = 1_000_000

var (
	//go:embed global.lua
	globalLua string
	//go:embed region.lua
	regionLua    string
	globalScript = redis.NewScript(globalLua)
	regionScript = redis.NewScript(regionLua)
)

// RegionWeight is one region of the global budget and its weight.
type RegionWeight struct {
	Name   string
	Weight int64
}

// RegionOptions configures this instance's region.
type RegionOptions struct {
	Region  string         // this region's name, one of Regions
	Regions []RegionWeight // every region's weight, the same in every region
	// Global is the global Redis (standalone or Sentinel); its Timeout
	// defaults to SyncInterval, and at least 1s.
	Global Options
	// SyncInterval is how often the coordinator syncs (default 1s);
	// instances poll the region's shares four times as often.
	SyncInterval time.Duration
	// Lease is how long a region keeps its shares without contact before
	// it falls back to its floor (default 5m, at least 2×SyncInterval).
	Lease    time.Duration
	Instance string // the coordinator candidate's name (default: the regional store's)
	// Refresh is the longest the coordinator goes without reporting an
	// unchanged key (default 10×SyncInterval, from SyncInterval to Lease/2).
	Refresh time.Duration
}

// The defaults of RegionOptions.SyncInterval and RegionOptions.Lease.
const (
	DefaultGlobalSyncInterval = time.Second
	DefaultGlobalLease        = 5 * time.Minute
)

// Check reports the first thing wrong with the options, naming the fix.
func (o RegionOptions) Check() error {
	if len(o.Regions) == 0 {
		return errors.New("global: regions is required, e.g. regions eu:2 us:1")
	}
	names := make([]string, 0, len(o.Regions))
	for _, r := range o.Regions {
		if r.Weight <= 0 || r.Weight > 1_000_000 {
			return fmt.Errorf("global: region %s's weight must be a whole number from 1 to 1000000, e.g. %s:1", r.Name, r.Name)
		}
		if !zones.ValidName(r.Name) {
			return fmt.Errorf("global: region name %q is invalid: use letters, digits, '_' and '-'", r.Name)
		}
		if slices.Contains(names, r.Name) {
			return fmt.Errorf("global: region %s is listed twice: keep one", r.Name)
		}
		names = append(names, r.Name)
	}
	if o.Region == "" {
		return fmt.Errorf("global: a region is required with a global block: add region <name>, one of %s", strings.Join(names, ", "))
	}
	if !slices.Contains(names, o.Region) {
		return fmt.Errorf("region %s is not one of the global block's regions (%s): add it there, e.g. regions %s:1, or fix its name", o.Region, strings.Join(names, ", "), o.Region)
	}
	o = o.withDefaults()
	if o.Lease < 2*o.SyncInterval {
		return fmt.Errorf("global: lease %v is shorter than twice sync_interval %v: use lease %v or more", o.Lease, o.SyncInterval, 2*o.SyncInterval)
	}
	if o.Refresh < o.SyncInterval || o.Refresh > o.Lease/2 {
		return fmt.Errorf("global: refresh %v must be from sync_interval %v to half the lease %v", o.Refresh, o.SyncInterval, o.Lease/2)
	}
	return nil
}

func (o RegionOptions) withDefaults() RegionOptions {
	if o.SyncInterval <= 0 {
		o.SyncInterval = DefaultGlobalSyncInterval
	}
	if o.Lease <= 0 {
		o.Lease = DefaultGlobalLease
	}
	if o.Refresh <= 0 {
		o.Refresh = max(o.SyncInterval, min(10*o.SyncInterval, o.Lease/2))
	}
	if o.Global.Timeout <= 0 { // off the request path, across regions
		o.Global.Timeout = max(o.SyncInterval, time.Second)
	}
	o.Global = o.Global.withDefaults()
	return o
}

// Key identifies the setting for sharing a Region (it holds passwords:
// never log it).
func (o RegionOptions) Key(regional string) string {
	return regional + "\x01" + fmt.Sprintf("%#v", o.withDefaults())
}

// Region is this instance's view of its region's global shares, and its
// candidacy as the region's coordinator.
type Region struct {
	opts     RegionOptions
	spec     string // the regions as global.lua reads them
	weight   int64  // this region's default share (ppm)
	floor    int64  // this region's share with no contact for a lease
	regional redis.UniversalClient
	global   redis.UniversalClient
	prefix   string        // the regional key prefix
	async    bool          // the regional store is an *Async
	timeout  time.Duration // the regional store's
	logger   *zap.Logger
	member   string

	mu    sync.RWMutex
	zones map[string]*regionZone
	set   atomic.Pointer[zoneSet] // zones' copy for decisions, which take no shared lock

	floored   atomic.Bool  // the region had no contact for a lease
	polled    atomic.Int64 // monotime of the last successful poll
	contactAt atomic.Int64 // monotime of the region's last contact, as last polled (0: none)
	version   string       // of the shares last read (poll loop only)

	coord coordinator                        // the coordinator's state (sync loop only)
	hold  atomic.Pointer[chan chan struct{}] // HoldNextSync's
	stats RegionStats

	stop   chan struct{}
	done   sync.WaitGroup
	closed sync.Once
}

// RegionStats counts the region's global work, for metrics: syncs sent,
// answered, unanswered; share changes; syncs refused as a stale coordinator's.
type RegionStats struct {
	Syncs, Contacts, Failures, ShareChanges, Fenced atomic.Int64
	LastLatency                                     atomic.Int64 // ns
	Coordinating                                    atomic.Bool
}

type regionZone struct {
	name     string
	interval atomic.Int64 // the zone's emission interval, ns (hot-key detection)
	burst    atomic.Int64 // the zone's burst (raises in a strict region)
	users    int          // handlers that wrapped the zone (r.mu)
	// the shares applied here, replaced whole by a poll (nil: not read since
	// added: at the floor, others may apply cuts)
	shares  atomic.Pointer[map[string]int64]
	counts  sync.Map     // per key, *counter; one idle for a whole poll is retired
	counted atomic.Int64 // counters in counts, at most maxCounted
	dropped atomic.Int64 // decisions not counted: maxCounted other keys were
}

// maxCounted bounds the keys a zone counts: a new key is dropped while
// maxCounted others were decided since the last poll but one.
const maxCounted = 10_000

// counter is one key's admitted and denied cost since the last take (a
// retired one holds dead: an add stays below deadBelow and counts again on
// a fresh counter), and the longest span B·T (ns) of a plan's limit it was
// decided with (0: the zone's), plant's hint.
type counter struct {
	n    [2]atomic.Int64
	span atomic.Int64
}

const (
	dead      = math.MinInt64 / 2
	deadBelow = math.MinInt64 / 4
)

// regionalStore is a *Strict or an *Async: its link, and whether async.
type regionalStore interface{ regionLink() (*link, bool) }

func (s *Strict) regionLink() (*link, bool) { return s.link, false }
func (a *Async) regionLink() (*link, bool)  { return a.link, true }

// OpenRegion starts this instance's region over its regional store (a
// *Strict or an *Async) without contacting either Redis.
func OpenRegion(regional zones.Store, opts RegionOptions, logger *zap.Logger) (*Region, error) {
	if err := opts.Check(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	logger = cmp.Or(logger, zap.NewNop())
	rs, ok := regional.(regionalStore)
	if !ok {
		return nil, fmt.Errorf("global: the regional store is a %T, not a tally store", regional)
	}
	c, async := rs.regionLink()
	uopts, err := opts.Global.universalOptions()
	if err != nil {
		return nil, fmt.Errorf("global: %v", err)
	}
	var sum, own int64
	spec := make([]string, 0, len(opts.Regions))
	for _, w := range opts.Regions {
		sum += w.Weight
		spec = append(spec, w.Name+":"+strconv.FormatInt(w.Weight, 10))
		if w.Name == opts.Region {
			own = w.Weight
		}
	}
	r := &Region{
		opts:     opts,
		spec:     strings.Join(spec, ","),
		weight:   own * ShareScale / sum,
		regional: c.client,
		global:   redis.NewUniversalClient(uopts),
		prefix:   c.opts.KeyPrefix,
		async:    async,
		timeout:  c.opts.Timeout,
		logger:   logger,
		member:   cmp.Or(opts.Instance, c.member),
		zones:    map[string]*regionZone{},
		stop:     make(chan struct{}),
	}
	r.floor = r.weight / 10
	r.rebuild()
	r.floored.Store(true)
	r.done.Go(func() { r.every(r.poll) })
	r.done.Go(func() { r.every(func() { r.tick(monotime.Now()) }) })
	return r, nil
}

// Close stops the region's loops and closes the global client.
func (r *Region) Close() (err error) {
	r.closed.Do(func() {
		close(r.stop)
		r.done.Wait()
		err = r.global.Close()
	})
	return err
}

// Destruct closes the region (caddy.Destructor); Stats and Name are for
// metrics and the admin API.
func (r *Region) Destruct() error     { return r.Close() }
func (r *Region) Stats() *RegionStats { return &r.stats }
func (r *Region) Name() string        { return r.opts.Region }

// AddZone makes zone (whole limit: limit) global in this region, for one
// more handler.
func (r *Region) AddZone(zone string, limit algorithms.Limit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	z, ok := r.zones[zone]
	if !ok {
		z = &regionZone{name: zone}
		r.zones[zone] = z
		r.rebuild()
	}
	z.users++
	z.interval.Store(limit.EmissionInterval)
	z.burst.Store(limit.Burst)
}

// ReleaseZone undoes AddZone: with its last handler the zone stops being
// polled and synced (its records expire).
func (r *Region) ReleaseZone(zone string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	z, ok := r.zones[zone]
	if !ok {
		return
	}
	if z.users--; z.users == 0 {
		delete(r.zones, zone)
		r.rebuild()
	}
}

func (r *Region) zone(name string) *regionZone { return r.set.Load().byName[name] }

// Share is this region's share of key in zone now (ppm): its floor after a
// lease without contact, or when this instance did not read the shares for
// confirmMargin (it may have missed a cut) or since the zone was added;
// else what the global store granted, else the region's weight.
func (r *Region) Share(zone, key string) int64 {
	if r.floored.Load() || time.Duration(monotime.Now()-r.polled.Load()) > r.confirmMargin() {
		return r.floor
	}
	z := r.zone(zone)
	if z == nil {
		return r.weight
	}
	m := z.shares.Load()
	if m == nil {
		return r.floor
	}
	if s, ok := (*m)[key]; ok {
		return s
	}
	return r.weight
}

// Coordinated is the number of zone's keys with a share other than the weight.
func (r *Region) Coordinated(zone string) int {
	if z := r.zone(zone); z != nil {
		if m := z.shares.Load(); m != nil {
			return len(*m)
		}
	}
	return 0
}

// DemandDropped is the number of zone's decisions left out of the demand
// (maxCounted).
func (r *Region) DemandDropped(zone string) int64 {
	if z := r.zone(zone); z != nil {
		return z.dropped.Load()
	}
	return 0
}

// Weight is this region's default share (ppm); Floor a tenth of it.
func (r *Region) Weight() int64 { return r.weight }
func (r *Region) Floor() int64  { return r.floor }

// count notes one decision of key at limit (the whole) for the region's
// demand: on the hot path, a sync.Map load and an atomic add.
func (r *Region) count(zone, key string, allowed bool, cost int64, limit algorithms.Limit) {
	z := r.zone(zone)
	if z == nil {
		return
	}
	i := b2i(!allowed) // n[0] admitted, n[1] denied
	var span int64     // 0: the zone's own
	if limit.EmissionInterval != z.interval.Load() || limit.Burst != z.burst.Load() {
		span = limit.Burst * limit.EmissionInterval
	}
	for {
		v, ok := z.counts.Load(key)
		if !ok {
			if z.counted.Add(1) > maxCounted {
				z.counted.Add(-1)
				if z.dropped.Add(1) == 1 {
					r.logger.Warn("global zone decides more keys in a poll than its demand counts: the others' demand is not reported",
						zap.String("zone", zone), zap.Int("most", maxCounted), zap.Duration("poll", r.pollInterval()))
				}
				return
			}
			var loaded bool
			if v, loaded = z.counts.LoadOrStore(key, new(counter)); loaded {
				z.counted.Add(-1)
			}
		}
		c := v.(*counter)
		if c.n[i].Add(cost) > deadBelow {
			if span > 0 {
				for s := c.span.Load(); span > s && !c.span.CompareAndSwap(s, span); s = c.span.Load() {
				}
			}
			return
		}
		z.counts.CompareAndDelete(key, v) // retired by take: count on a fresh one
	}
}

// take returns the zone's counts (admitted, denied, span) since the last
// take. An add that found its counter live happened before take swapped
// it: each decision is in exactly one take.
func (z *regionZone) take() map[string][3]int64 {
	out := make(map[string][3]int64)
	z.counts.Range(func(k, v any) bool {
		c := v.(*counter)
		a, d := c.n[0].Swap(0), c.n[1].Swap(0)
		if a == 0 && d == 0 {
			a, d = c.n[0].Swap(dead), c.n[1].Swap(dead) // idle: retire it, with what came meanwhile
			z.counts.CompareAndDelete(k, v)
			z.counted.Add(-1)
		}
		if a != 0 || d != 0 {
			out[k.(string)] = [3]int64{a, d, c.span.Swap(0)}
		}
		return true
	})
	return out
}

// zoneSet is the region's zones and region.lua's KEYS for them: a poll or a
// sync takes one set for all its calls, so that no call's zones shift.
type zoneSet struct {
	zones  []*regionZone
	keys   []string
	byName map[string]*regionZone
}

// rebuild replaces the zone set; r.mu is held.
func (r *Region) rebuild() {
	set := &zoneSet{keys: []string{r.prefix + "global{r}.meta", r.prefix + "global{r}.lock"},
		byName: make(map[string]*regionZone, len(r.zones))}
	for _, n := range slices.Sorted(maps.Keys(r.zones)) {
		z := r.zones[n]
		set.zones = append(set.zones, z)
		set.keys = append(set.keys, r.prefix+"global{r}.demand:"+n, r.prefix+"global{r}.shares:"+n)
		set.byName[n] = z
	}
	r.set.Store(set)
}

// pollInterval is how often instances push counts and read the shares: a
// cut is in force everywhere well within the margin.
func (r *Region) pollInterval() time.Duration {
	return max(10*time.Millisecond, r.opts.SyncInterval/4)
}

// confirmMargin is how long after publishing a cut the old share is still
// reported held: two polls (one may fail) and two regional timeouts, within
// which every instance applies the cut or holds its floor (Share).
func (r *Region) confirmMargin() time.Duration {
	return 2*r.pollInterval() + 2*r.timeout
}

func (r *Region) every(f func()) {
	tick := time.NewTicker(r.pollInterval())
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
			f()
		}
	}
}

// poll pushes this instance's counts and reads the region's shares if changed.
func (r *Region) poll() {
	set := r.set.Load()
	zs := set.zones
	known := r.version
	if slices.ContainsFunc(zs, func(z *regionZone) bool { return z.shares.Load() == nil }) {
		known = "" // a zone added since: read every zone's shares
	}
	args := []any{"poll", known, (10 * r.opts.SyncInterval).Milliseconds(), len(zs)}
	for _, z := range zs {
		counts := z.take()
		args = append(args, len(counts))
		for k, c := range counts {
			args = append(args, k, c[0], c[1], c[2]/1000) // the span in µs, as Redis's TATs
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout+r.pollInterval())
	defer cancel()
	began := monotime.Now()
	v, err := regionScript.Run(ctx, r.regional, set.keys, args...).Slice()
	now := monotime.Now()
	if err != nil || len(v) < 3 {
		return // Share floors this instance once the margin passes
	}
	rd := reader(v)
	rnow, contact, version := rd.int(), rd.int(), rd.str()
	r.floored.Store(contact < 0 || time.Duration(rnow-contact)*time.Millisecond > r.opts.Lease)
	if contact >= 0 {
		r.contactAt.Store(max(1, now-int64(time.Duration(rnow-contact)*time.Millisecond)))
	}
	for i := 0; version != known && i < len(zs); i++ {
		m := make(map[string]int64)
		for range rd.n(2) {
			k := rd.str()
			m[k] = rd.int()
		}
		zs[i].shares.Store(&m)
	}
	r.version = version
	r.polled.Store(began)
}

// reader reads a region.lua or global.lua reply in order: a value past its
// end, or of another type, reads as zero.
type reader []any

func (rd *reader) next() (v any) {
	if len(*rd) > 0 {
		v, *rd = (*rd)[0], (*rd)[1:]
	}
	return v
}

// int reads an integer, or a hash field's decimal string.
func (rd *reader) int() int64 {
	switch v := rd.next().(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

func (rd *reader) str() string {
	s, _ := rd.next().(string)
	return s
}

// n reads the count of entries of width values that follow, at most as
// many as the reply has left.
func (rd *reader) n(width int) int {
	return int(min(max(rd.int(), 0), int64(len(*rd)/width)))
}

// Shared is the store a `scope global` zone decides with: the regional
// store at the region's share of the key's limit.
type Shared struct {
	zones.Records // inner's (async mode), or nil; Fallback and Peek at the share
	inner         zones.Store
	offers        zones.Offers // inner's
	region        *Region
}

// Wrap returns the Shared store over inner of a zone (whole limit: limit)
// and makes the zone global in the region.
func (r *Region) Wrap(inner zones.Store, zone string, limit algorithms.Limit) *Shared {
	r.AddZone(zone, limit)
	o := inner.Offers()
	return &Shared{Records: o.Records, inner: inner, offers: o, region: r}
}

// Region is the region whose share the store applies.
func (s *Shared) Region() *Region { return s.region }

// Scale is limit at share (ppm): T divided by it, B multiplied (at least
// 1). The span B·T is the same at every share, so a key's debt means the
// same at each (plantScript).
func Scale(limit algorithms.Limit, share int64) algorithms.Limit {
	if share >= ShareScale {
		return limit
	}
	share = max(1, share)
	t := min(float64(limit.EmissionInterval)*ShareScale/float64(share), math.MaxInt64/4)
	return algorithms.Limit{EmissionInterval: int64(t), Burst: max(1, limit.Burst*share/ShareScale)}
}

// Rate runs st at this region's share of its limit. A decision, a failed
// check, a charge (a ban's denial too) count as demand; a peek, a refund, a
// reset not.
func (s *Shared) Rate(ctx context.Context, zone, key string, st zones.RateStep) (zones.RateReply, error) {
	whole := st.Limit
	if st.Op != zones.OpReset {
		st.Limit = Scale(whole, s.region.Share(zone, key))
	}
	rep, err := s.inner.Rate(ctx, zone, key, st)
	if err != nil {
		return rep, err
	}
	switch {
	case st.Op == zones.OpDecide, st.Op == zones.OpCharge:
		s.region.count(zone, key, rep.Allowed || st.Op == zones.OpCharge, st.Cost, whole)
	case st.Op == zones.OpCheck && !rep.Allowed:
		s.region.count(zone, key, false, 1, whole)
	}
	return rep, nil
}

// Quota is not offered: scope global is for rate zones.
func (s *Shared) Quota(context.Context, string, string, zones.QuotaStep) (zones.QuotaResult, error) {
	return zones.QuotaResult{}, errors.New("distributed: scope global zones keep no quotas")
}

// Offers is the regional store's without quotas and slots, with this
// store's records; a deny-cache denial counts as demand (at a small share
// its retry time is longer than a sync interval).
func (s *Shared) Offers() zones.Offers {
	o := s.offers
	o.Quotas, o.Slots = false, nil
	o.Denied = func(zone, key string, l algorithms.Limit) { s.region.count(zone, key, false, 1, l) }
	if o.Records != nil {
		o.Records = s
	}
	return o
}

// Instances is the regional count divided by the region's weight:
// fail_policy local splits the region's default share.
func (s *Shared) Instances() int {
	n := int64(max(1, s.inner.Instances()))
	return int(min(math.MaxInt32, (n*ShareScale+s.region.weight-1)/max(1, s.region.weight)))
}

// Fallback is the async store's fail_policy local step at the region's share.
func (s *Shared) Fallback(zone, key string, now int64, limit, share algorithms.Limit, op zones.Op, cost, ahead int64) algorithms.Result {
	return s.Records.Fallback(zone, key, now, Scale(limit, s.region.Share(zone, key)), share, op, cost, ahead)
}

// Peek is the async store's record of key at the region's share.
func (s *Shared) Peek(zone, key string, now int64, limit algorithms.Limit) (algorithms.Result, bool) {
	return s.Records.Peek(zone, key, now, Scale(limit, s.region.Share(zone, key)))
}

// Interface guards.
var (
	_ zones.Store   = (*Shared)(nil)
	_ zones.Records = (*Shared)(nil)
)
