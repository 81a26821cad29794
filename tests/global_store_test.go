package tests

// Multi-region budgets (issue 29) at the store level: two regions, each
// with its own redis-server and two tally stores, share one global
// redis-server reached through a proxy per region that adds 50–100 ms each
// way and can hang, cut or drop replies.

import (
	"context"
	"errors"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
	"go.uber.org/zap"
)

// The global limit of the tests: 600 per minute, burst 20.
var globalLimit = algorithms.NewLimit(600, int64(time.Minute), 20)

const globalZone = "api"

type testRegion struct {
	name    string
	redis   *redisServer
	proxy   *redisProxy   // to the global store
	links   []*redisProxy // each instance's to the regional Redis
	regions []*distributed.Region
	shared  []zones.Store
}

type globalFleet struct {
	t        *testing.T
	global   *redisServer
	regions  []*testRegion
	interval time.Duration
	lease    time.Duration
	admitted [][]int64 // per region: admission times, unix ns
	mu       sync.Mutex
	// decided and late count drive's decisions, and those that timed out
	// (a loaded machine's regional Redis answering late, where a fail
	// policy decides): at most 1 in 50 may.
	decided, late atomic.Int64
}

// startGlobalFleet starts the global store and two regions, eu and us, of
// weight 1 each, with two strict instances each.
func startGlobalFleet(t *testing.T, interval, lease time.Duration) *globalFleet {
	t.Helper()
	return startGlobalFleetIn(t, "strict", interval, lease, nil)
}

// startGlobalFleetIn is startGlobalFleet with the regions' stores in mode
// (strict or async, syncing with their regional Redis every 50 ms).
// logger, when not nil, is every region's logger.
func startGlobalFleetIn(t *testing.T, mode string, interval, lease time.Duration, logger *zap.Logger) *globalFleet {
	t.Helper()
	return startGlobalFleetWith(t, fleetOptions{mode: mode, interval: interval, lease: lease}, logger)
}

// fleetOptions are a test fleet's settings beyond startGlobalFleetIn's:
// the regional stores' timeout (0: 200 ms), the regions' Refresh (0: the
// default) and the zone's limit (zero: globalLimit; drive and checkBound
// assume globalLimit).
type fleetOptions struct {
	mode                              string
	interval, lease, timeout, refresh time.Duration
	limit                             algorithms.Limit
}

// startGlobalFleetWith is startGlobalFleetIn with every setting.
func startGlobalFleetWith(t *testing.T, o fleetOptions, logger *zap.Logger) *globalFleet {
	mode, interval, lease, timeout, refresh, limit := o.mode, o.interval, o.lease, o.timeout, o.refresh, o.limit
	if timeout == 0 {
		timeout = 200 * time.Millisecond
	}
	if limit == (algorithms.Limit{}) {
		limit = globalLimit
	}
	t.Helper()
	f := &globalFleet{t: t, global: startRedis(t), interval: interval, lease: lease}
	for _, name := range []string{"eu", "us"} {
		r := &testRegion{name: name, redis: startRedis(t)}
		r.proxy = startRedisProxy(t, f.global.Addr)
		r.proxy.SetLatency(50*time.Millisecond, 100*time.Millisecond)
		for range 2 {
			var s zones.Store
			link := startRedisProxy(t, r.redis.Addr)
			r.links = append(r.links, link)
			if mode == "async" {
				a, err := distributed.OpenAsync(distributed.Options{Addresses: []string{link.Addr}, Mode: "async",
					SyncInterval: 50 * time.Millisecond, Timeout: timeout, Instance: nextTestInstance()}, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { a.Close() })
				s = a
			} else {
				s = openStore(t, distributed.Options{Addresses: []string{link.Addr}, Timeout: timeout}, nil)
			}
			reg, err := distributed.OpenRegion(s, distributed.RegionOptions{
				Region:       name,
				Regions:      []distributed.RegionWeight{{Name: "eu", Weight: 1}, {Name: "us", Weight: 1}},
				Global:       distributed.Options{Addresses: []string{r.proxy.Addr}, Timeout: time.Second},
				SyncInterval: interval,
				Lease:        lease,
				Refresh:      refresh,
			}, logger)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { reg.Close() })
			r.regions = append(r.regions, reg)
			r.shared = append(r.shared, reg.Wrap(s, globalZone, limit))
		}
		f.regions = append(f.regions, r)
	}
	f.admitted = make([][]int64, len(f.regions))
	t.Cleanup(func() {
		if late, decided := f.late.Load(), f.decided.Load(); late*50 > decided {
			t.Errorf("%d of %d decisions timed out in the regional Redis (a fail policy decided them), more than 1 in 50", late, decided)
		}
	})
	return f
}

// isTimeout reports whether err is a store's answer that came too late
// (as distributed's breaker tells one: a net.Error, which a context's
// deadline is too).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// share is the most any instance of region i applies to key (ppm).
func (f *globalFleet) share(i int, key string) int64 {
	var s int64
	for _, reg := range f.regions[i].regions {
		s = max(s, reg.Share(globalZone, key))
	}
	return s
}

// drive sends rate requests per second for key through region i's
// instances, in turn, until stop is closed, timestamping admissions.
func (f *globalFleet) drive(i int, key string, rate int, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			sh := f.regions[i].shared[n%len(f.regions[i].shared)]
			res, err := stepDecide(sh, context.Background(), globalZone, key, globalLimit, 1)
			f.decided.Add(1)
			if isTimeout(err) {
				f.late.Add(1) // counted as not admitted: the bounds are upper bounds
				continue
			}
			if err != nil {
				f.t.Errorf("region %s: decision failed (a fail policy would have decided): %v", f.regions[i].name, err)
				return
			}
			if res.Allowed {
				f.mu.Lock()
				f.admitted[i] = append(f.admitted[i], time.Now().UnixNano())
				f.mu.Unlock()
			}
		}
	}()
}

// sampleShares checks Σ shares ≤ 1 for key every 20 ms until stop.
func (f *globalFleet) sampleShares(key string, stop <-chan struct{}, wg *sync.WaitGroup, worst *atomic.Int64) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var sum int64
			var each []int64
			for i := range f.regions {
				each = append(each, f.share(i, key))
				sum += each[i]
			}
			if sum > worst.Load() {
				worst.Store(sum)
			}
			if sum > distributed.ShareScale {
				f.t.Logf("%s: shares of %s %v", time.Now().Format("15:04:05.000"), key, each)
			}
		}
	}()
}

// checkBound compares every sliding window of the fleet's admissions with
// the strict bound B + ⌊d/T⌋, for the window lengths given.
func (f *globalFleet) checkBound(windows ...time.Duration) {
	f.t.Helper()
	f.checkBoundPlus(0, windows...)
}

// checkBoundPlus is checkBound with extra admissions allowed (async
// mode's term).
func (f *globalFleet) checkBoundPlus(extra int64, windows ...time.Duration) {
	f.t.Helper()
	f.mu.Lock()
	var all []int64
	for _, a := range f.admitted {
		all = append(all, a...)
	}
	f.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	for _, d := range windows {
		bound := globalLimit.Burst + int64(d)/globalLimit.EmissionInterval + extra
		most, j := 0, 0
		for i := range all {
			for all[i]-all[j] >= int64(d) {
				j++
			}
			most = max(most, i-j+1)
		}
		if int64(most) > bound {
			f.t.Errorf("%d admissions within %v fleet-wide, over the bound B + ⌊d/T⌋ = %d", most, d, bound)
		} else {
			f.t.Logf("at most %d admissions within %v fleet-wide (bound %d)", most, d, bound)
		}
	}
}

// waitShare polls until region i applies at least min of key on every
// instance, and returns how long it took, failing after limit.
func (f *globalFleet) waitShare(i int, key string, least int64, limit time.Duration) time.Duration {
	f.t.Helper()
	start := time.Now()
	for {
		ok := true
		for _, reg := range f.regions[i].regions {
			ok = ok && reg.Share(globalZone, key) >= least
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			f.t.Fatalf("region %s did not reach share %d of %s within %v (share now %d)", f.regions[i].name, least, key, limit, f.share(i, key))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitContact waits until every instance left its start-up floor (the
// coordinators reached the global store).
func (f *globalFleet) waitContact() {
	f.t.Helper()
	for i := range f.regions {
		f.waitShare(i, "probe", distributed.ShareScale/2, 10*time.Second)
	}
}

// stalls measures how long this process was not scheduled until the
// returned func is called: the sum of how much longer than 10 ms each
// 5 ms sleep took (5 ms of timer slack).
func stalls() (stop func() time.Duration) {
	const tick = 5 * time.Millisecond
	done := make(chan struct{})
	total := make(chan time.Duration)
	go func() {
		var lost time.Duration
		for {
			select {
			case <-done:
				total <- lost
				return
			default:
			}
			start := time.Now()
			time.Sleep(tick)
			lost += max(0, time.Since(start)-2*tick)
		}
	}()
	return func() time.Duration { close(done); return <-total }
}

func TestGlobalDemandMovesBetweenRegions(t *testing.T) {
	const interval = 200 * time.Millisecond
	f := startGlobalFleet(t, interval, 5*time.Second)
	f.waitContact()
	var wg, swg sync.WaitGroup
	var worst atomic.Int64
	sstop := make(chan struct{})
	f.sampleShares("k", sstop, &swg, &worst)
	// 2 × sync_interval, the cut's confirmation margin (two polls and
	// twice the regional timeout) and four round trips of up to 200 ms,
	// plus the time this process was not running meanwhile (a loaded
	// machine's stalls delay every sync by as much).
	reach := 2*interval + (2*interval/4 + 400*time.Millisecond) + 4*200*time.Millisecond
	for phase, i := range []int{0, 1, 0} {
		stop := make(chan struct{})
		f.drive(i, "k", 40, stop, &wg)
		began := time.Now()
		stalled := stalls()
		took := f.waitShare(i, "k", distributed.ShareScale*9/10, 5*reach)
		lost := stalled()
		t.Logf("phase %d: region %s reached 90%% of the limit in %v (%v of it stalled)", phase, f.regions[i].name, took, lost)
		if took > reach+lost {
			t.Errorf("phase %d: region %s took %v to reach 90%% of the limit, more than 2 × sync_interval + a few round trips (%v) + the %v this process stalled", phase, f.regions[i].name, took, reach, lost)
		}
		time.Sleep(time.Until(began.Add(20 * time.Second))) // the demand moves every 20 s
		close(stop)
		wg.Wait()
	}
	close(sstop)
	swg.Wait()
	if w := worst.Load(); w > distributed.ShareScale {
		t.Errorf("the regions' shares summed to %d ppm, over the whole limit", w)
	}
	f.checkBound(time.Second, 3*time.Second, 20*time.Second)
}

func TestGlobalSharesApplyInAsyncMode(t *testing.T) {
	f := startGlobalFleetIn(t, "async", testInterval, 5*time.Second, nil)
	f.waitContact()
	check := f.sumGuard("k")
	for _, i := range []int{0, 1} {
		stop := f.demandIn(i, "k")
		time.Sleep(time.Second)
		stop()
	}
	check()
	// Async's own bound, region by region: ⌊L/T⌋ more for the leases'
	// lifetime L = 30 × 50 ms (once: the regions' rates sum to 1/T), and
	// (N−1)·max(1, ⌊B_r/N⌋) per region, N = 2, B_r ≤ 19.
	f.checkBoundPlus(1500/100+2*9, time.Second, 3*time.Second)
}

// A region that keeps demanding a key it was cut on reports nothing new but
// the share it holds: that report alone confirms the cut and lets the
// other region have its part. Refresh is a minute here, so the cut moves
// within the test only if the confirmation is reported when the holding
// changes.
func TestGlobalCutIsConfirmedByTheHoldingAloneWhileDemandIsUnchanged(t *testing.T) {
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: testInterval, lease: 5 * time.Minute, refresh: time.Minute}, nil)
	f.waitContact()
	check := f.sumGuard("k")
	euStop := f.demandIn(0, "k") // eu denied: it wants the whole limit
	defer euStop()
	var wg sync.WaitGroup
	usStop := make(chan struct{})
	f.drive(1, "k", 40, usStop, &wg)
	defer func() { close(usStop); wg.Wait() }()
	// Both want everything: half each, once eu confirmed its cut.
	took := f.waitShare(1, "k", distributed.ShareScale*45/100, 15*time.Second)
	t.Logf("us reached 45%% of the limit %v after it started demanding", took)
	if s := f.share(0, "k"); s > distributed.ShareScale*55/100 {
		t.Errorf("eu still holds %d of k while both regions demand it", s)
	}
	check()
}

// A region that keeps pushing a key with the same demand re-reports it
// within Refresh: the global store never lets that demand lapse (its
// record's x.<region>, the demand's deadline, stays ahead of Redis's
// clock), however long the demand lasts.
func TestGlobalUnchangedDemandDoesNotLapseWhileTheRegionPushes(t *testing.T) {
	const refresh = 2 * testInterval
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: testInterval, lease: 5 * time.Second, refresh: refresh}, nil)
	f.waitContact()
	stop := f.demandIn(0, "k")
	defer stop()
	gdb := f.global.Client()
	ctx := context.Background()
	// The demand TTL is 2 × Refresh + the global timeout (1s) + a sync
	// interval: 2s. Watch three of them.
	deadline := time.Now().Add(6 * time.Second)
	changes, last := 0, ""
	for time.Now().Before(deadline) {
		m, err := gdb.HMGet(ctx, "tally:g.z:api:k", "d.eu", "x.eu").Result()
		if err != nil {
			t.Fatal(err)
		}
		now, err := gdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		x, _ := m[1].(string)
		lapse, _ := strconv.ParseInt(x, 10, 64)
		if m[0] == nil || lapse < now.UnixMilli() {
			t.Fatalf("eu's demand of k lapsed in the global store while eu still pushed it (d.eu %v, deadline %v, now %d)", m[0], m[1], now.UnixMilli())
		}
		if x != last {
			changes++
			last = x
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("eu's demand deadline moved %d times in 6s (sync interval %v, refresh %v)", changes, testInterval, refresh)
}

// A sync of a region whose demand did not change reports nothing of it
// (the record's deadline stays put); one whose demand is gone says so (the
// record loses the region's demand) without waiting for it to lapse.
func TestGlobalSyncReportsOnlyWhatChanged(t *testing.T) {
	global := startRedis(t)
	gdb := global.Client()
	ctx := context.Background()
	regs := driven(t, global.Addr, "eu", "us")
	eu := regs[0]
	syncDenied := func() {
		t.Helper()
		eu.Count("api", "k", false, 1)
		if !eu.SyncNow() {
			t.Fatal("eu's only instance did not coordinate")
		}
	}
	for _, reg := range regs {
		if !reg.SyncNow() { // registered, out of the start-up floor
			t.Fatal("a region's only instance did not coordinate")
		}
	}
	syncDenied()
	syncDenied() // eu now holds what it was granted
	syncDenied()
	before, err := gdb.HGetAll(ctx, "tally:g.z:api:k").Result()
	if err != nil || before["x.eu"] == "" {
		t.Fatalf("eu's demand of k is not in the global store: %v %v", before, err)
	}
	syncDenied()
	after, err := gdb.HGetAll(ctx, "tally:g.z:api:k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if after["x.eu"] != before["x.eu"] {
		t.Errorf("eu reported k again with the same demand and holding (deadline %s, then %s)", before["x.eu"], after["x.eu"])
	}
	if !eu.SyncNow() { // no decisions of k: its demand is gone
		t.Fatal("eu's only instance did not coordinate")
	}
	gone, err := gdb.HGetAll(ctx, "tally:g.z:api:k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if gone["x.eu"] != "" || gone["d.eu"] != "" {
		t.Errorf("eu's demand of k is still in the global store after eu stopped deciding it: %v", gone)
	}
}

// driven opens a region of each name, weight 1 each, over its own
// redis-server, sharing the global one at global, with the zone api: their
// loops never tick (sync_interval 1h), SyncNow drives them.
func driven(tb testing.TB, global string, names ...string) []*distributed.Region {
	var weights []distributed.RegionWeight
	for _, n := range names {
		weights = append(weights, distributed.RegionWeight{Name: n, Weight: 1})
	}
	var regs []*distributed.Region
	for _, name := range names {
		rs := startRedis(tb)
		s := openStore(tb, distributed.Options{Addresses: []string{rs.Addr}, Timeout: 2 * time.Second}, nil)
		reg, err := distributed.OpenRegion(s, distributed.RegionOptions{
			Region:       name,
			Regions:      weights,
			Global:       distributed.Options{Addresses: []string{global}, Timeout: 5 * time.Second},
			SyncInterval: time.Hour,
			Lease:        3 * time.Hour,
		}, nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { reg.Close() })
		reg.AddZone("api", globalLimit)
		regs = append(regs, reg)
	}
	return regs
}

// A zone that a reload adds to one instance while another instance of its
// region already applies a cut of it holds the region's floor until it has
// read the region's shares, and then the cut: never the weight, which
// would spend what the cut gave another region.
func TestGlobalZoneAddedLaterStartsFromTheRegionsShares(t *testing.T) {
	f := startGlobalFleet(t, 200*time.Millisecond, 5*time.Second)
	f.waitContact()
	eu, us := f.regions[0], f.regions[1]
	const zone = "late"
	var coord, other *distributed.Region
	if err := waitUntil(5*time.Second, func() bool {
		for i, reg := range us.regions {
			if reg.Stats().Coordinating.Load() {
				coord, other = reg, us.regions[1-i]
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("no instance of us coordinates: %v", err)
	}
	for _, reg := range append([]*distributed.Region{coord}, eu.regions...) {
		reg.AddZone(zone, globalLimit)
	}
	// eu pushes against k and us against up: us is cut to its floor of
	// k and raised for up, and its coordinator publishes both.
	defer countEvery(50*time.Millisecond, func(n int) {
		eu.regions[n%2].Count(zone, "k", false, 1)
		coord.Count(zone, "up", false, 1)
	})()
	floor := coord.Floor()
	raised := int64(distributed.ShareScale * 9 / 10)
	if err := waitUntil(10*time.Second, func() bool { return coord.Share(zone, "k") == floor && coord.Share(zone, "up") >= raised }); err != nil {
		t.Fatalf("us's coordinator applies %d of k and %d of up, want its floor (%d) and at least %d", coord.Share(zone, "k"), coord.Share(zone, "up"), floor, raised)
	}
	// The other instance adds the zone: at its floor until it has read
	// the shares, then what they are, within a second (five syncs, with
	// no change of the region's shares meanwhile).
	other.AddZone(zone, globalLimit)
	read := false
	for end := time.Now().Add(time.Second); time.Now().Before(end) && !read; time.Sleep(10 * time.Millisecond) {
		if s := other.Share(zone, "k"); s != floor {
			t.Fatalf("the instance that added the zone applies %d of k, want the region's cut to its floor (%d)", s, floor)
		}
		read = other.Share(zone, "up") >= raised
	}
	if !read {
		t.Errorf("the instance that added the zone applies %d of up a second later, want the region's raise (at least %d): it never read the shares", other.Share(zone, "up"), raised)
	}
}

// countEvery calls count(n), n = 0, 1, …, every period (at most 2000
// times) until the stop it returns is called: demand a test drives by
// Region.Count, with no decision.
func countEvery(period time.Duration, count func(n int)) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for n := 0; n < 2000; n++ {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			count(n)
		}
	}()
	return func() { close(quit); <-done }
}

// A region cut twice, the second time after the first cut was confirmed,
// reports as held what it may still apply: the first cut's share, not the
// share it had before the first cut (which would hold back the other
// region's raise for nothing, and count more than the region can spend).
// The regional timeout of 200 ms makes a cut's margin (500 ms) span more
// than one sync, so that the region reports while the second cut waits;
// a limit of 1,000 a second lets us want a steady part of it (0.48).
func TestGlobalSecondCutReportsTheFirstCutsShare(t *testing.T) {
	f := startGlobalFleetWith(t, fleetOptions{mode: "strict", interval: 200 * time.Millisecond, lease: 5 * time.Second,
		timeout: 200 * time.Millisecond, limit: algorithms.NewLimit(1000, int64(time.Second), 20)}, nil)
	f.waitContact()
	eu, us := f.regions[0], f.regions[1]
	gdb, ctx := f.global.Client(), t.Context()
	held := func() int64 { // what the global store counts as eu's of k
		v, _ := gdb.HGet(ctx, "tally:g.z:"+globalZone+":k", "a.eu").Int64()
		return v
	}
	var euDenied, usSome, usDenied atomic.Bool
	euDenied.Store(true)
	defer countEvery(25*time.Millisecond, func(n int) {
		if euDenied.Load() {
			eu.regions[n%2].Count(globalZone, "k", false, 1)
		}
		if usSome.Load() { // 400 a second: 0.4 of the limit
			us.regions[n%2].Count(globalZone, "k", true, 10)
		}
		if usDenied.Load() {
			us.regions[n%2].Count(globalZone, "k", false, 1)
		}
	})()
	if err := waitUntil(10*time.Second, func() bool { return held() >= distributed.ShareScale*9/10 }); err != nil {
		t.Fatalf("eu did not report holding 90%% of k: the global store counts %d", held())
	}
	// us wants 0.48: eu is cut to the rest, 0.52, and confirms it.
	usSome.Store(true)
	if err := waitUntil(10*time.Second, func() bool {
		h := held()
		return h > distributed.ShareScale/2 && h <= distributed.ShareScale*6/10
	}); err != nil {
		t.Fatalf("eu's first cut was not confirmed: the global store counts %d as eu's", held())
	}
	first := held()
	// eu's demand goes, us wants it all: eu is cut to its floor.
	euDenied.Store(false)
	usSome.Store(false)
	usDenied.Store(true)
	most := first
	if err := waitUntil(10*time.Second, func() bool {
		most = max(most, held())
		return f.share(1, "k") >= distributed.ShareScale*9/10
	}); err != nil {
		t.Fatalf("us did not reach 90%% of k: %v", err)
	}
	// (us's demand of 0.48 moves a little from sync to sync, and eu's
	// share with it: not back to what it had before the first cut)
	if most >= distributed.ShareScale*9/10 {
		t.Errorf("after its first cut to %d was confirmed, eu reported holding %d of k, what it had before", first, most)
	}
}
