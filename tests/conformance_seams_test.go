package tests

// The conformance suite's seams between a zone and what surrounds it,
// run over every store the suite runs (confStores): concurrency slots,
// adaptive zones, overrides kept through zones.Offers.Overrides, the one
// read (zones.Ticket.Read) and the multi-zone zones.Admit. Where a seam
// does not apply to a store the subtest says why when it skips: scope
// global is for rate zones (its store offers no slots, no quotas), and an
// adaptive zone is decided in the instance whatever its store (zones.New
// drops it), which the scenario checks on each store that a zone may have.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// seamEnv is one store of a kind, which any number of zones decide with,
// each resolving overrides from its own holder.
type seamEnv struct {
	t      *testing.T
	kind   confStoreKind
	redis  *redisServer // nil for local
	store  zones.Store  // the mode's store, nil for local
	async  *distributed.Async
	region *distributed.Region // scope global
}

func openSeams(t *testing.T, kind confStoreKind) *seamEnv {
	t.Helper()
	e := &seamEnv{t: t, kind: kind}
	switch kind.mode {
	case "strict":
		e.redis = startRedis(t)
		s := openStore(t, distributed.Options{Addresses: []string{e.redis.Addr}, Timeout: time.Second}, nil)
		waitSubscribed(t, s.ResetsSubscribed)
		e.store = s
	case "async":
		e.redis = startRedis(t)
		a, err := distributed.OpenAsync(distributed.Options{Addresses: []string{e.redis.Addr}, Mode: "async",
			SyncInterval: confSyncInterval, Timeout: time.Second, Instance: nextTestInstance()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		waitSubscribed(t, a.ResetsSubscribed)
		e.async, e.store = a, a
	}
	if kind.global {
		reg, err := distributed.OpenRegion(e.store, distributed.RegionOptions{
			Region:       "eu",
			Regions:      []distributed.RegionWeight{{Name: "eu", Weight: 1}},
			Global:       distributed.Options{Addresses: []string{e.redis.Addr}, KeyPrefix: "global:", Timeout: 2 * time.Second},
			SyncInterval: time.Hour,
			Lease:        3 * time.Hour,
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close() })
		e.region = reg
	}
	return e
}

// seamZone is a zone on the env's store with its override holder.
type seamZone struct {
	*zones.Zone
	overrides *zones.Overrides
	store     zones.Store // what it decides with, nil for local
}

// zone opens cfg's zone on the env's store (scope global: in the only
// region, once it holds the whole limit for each of keys).
func (e *seamEnv) zone(cfg zones.Config, keys ...string) seamZone {
	e.t.Helper()
	state := zones.NewState(cfg, time.Minute)
	e.t.Cleanup(func() { _ = state.Destruct() })
	store := e.store
	if e.region != nil {
		shared := e.region.Wrap(e.store, cfg.Name, cfg.Limit())
		waitFor(e.t, 10*time.Second, "the only region to hold the whole limit", func() bool {
			e.region.SyncNow()
			for _, k := range keys {
				if e.region.Share(cfg.Name, k) != distributed.ShareScale {
					return false
				}
			}
			return true
		})
		store = shared
	}
	z := seamZone{Zone: mustZone(cfg, state, store), overrides: &zones.Overrides{}, store: store}
	z.UseOverrides(z.overrides)
	return z
}

// settle: see confEnv.settle.
func (e *seamEnv) settle() {
	if e.async == nil {
		return
	}
	after := time.Now().Add(confSyncInterval)
	waitFor(e.t, 10*time.Second, "an async sync", func() bool { return e.async.LastSync().After(after) })
}

type seamTicket = zones.Ticket[struct{}]

// admit admits one request of key in z, its override resolved, at cost 1.
func (z seamZone) admit(key string) seamTicket {
	tk := z.ticket(key)
	tk.Admit(context.Background(), monotime.Now())
	return tk
}

// ticket is a ticket of key in z under the zone's plan, resolved.
func (z seamZone) ticket(key string) seamTicket {
	tk := seamTicket{Zone: z.Zone, Key: key, Plan: z.Plan(), Cost: 1}
	if z.IsConcurrency() {
		tk.Plan = zones.Plan{} // the zone's limit, unless an override's n
	}
	tk.Resolve()
	return tk
}

// read is the one read of key in z, its override resolved.
func (z seamZone) read(t *testing.T, key string) zones.KeyState {
	t.Helper()
	tk := z.ticket(key)
	s, err := tk.Read(context.Background(), monotime.Now())
	if err != nil {
		t.Fatalf("reading %s in %s: %v", key, z.Name, err)
	}
	return s
}

func wantAllowed(t *testing.T, what string, d zones.Decision, remaining int64) {
	t.Helper()
	if !d.Allowed || d.Remaining != remaining {
		t.Fatalf("%s: allowed %v remaining %d, want allowed with %d left\ngot %+v", what, d.Allowed, d.Remaining, remaining, d)
	}
}

func wantDenied(t *testing.T, what string, d zones.Decision, retry time.Duration) {
	t.Helper()
	if d.Allowed || d.Remaining != 0 || !near(d.RetryAfter, retry) {
		t.Fatalf("%s: allowed %v remaining %d Retry-After %v, want denied with none left for %v\ngot %+v", what, d.Allowed, d.Remaining, d.RetryAfter, retry, d)
	}
}

type seamScenario struct {
	name string
	skip func(kind confStoreKind) string // why the scenario does not apply, "" when it does
	run  func(t *testing.T, e *seamEnv)
}

func notGlobal(why string) func(confStoreKind) string {
	return func(k confStoreKind) string {
		if k.global {
			return why
		}
		return ""
	}
}

var seamScenarios = []seamScenario{
	{"slots", notGlobal("a scope global store holds no slots (zones.New refuses a concurrency zone on it)"), seamSlots},
	{"adaptive", notGlobal("scope global applies to rate zones only"), seamAdaptive},
	{"overrides", nil, seamOverrides},
	{"read", nil, seamRead},
	{"read_quota", notGlobal("scope global applies to rate zones only (the Caddyfile refuses it on a quota zone)"), seamReadQuota},
	{"admit_denied_in_third_zone", nil, seamAdmitThird},
}

// Every store answers the seams' scenarios alike (see the top of the file).
func TestConformanceSeams(t *testing.T) {
	for _, kind := range confStores {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			for _, sc := range seamScenarios {
				t.Run(sc.name, func(t *testing.T) {
					if sc.skip != nil {
						if why := sc.skip(kind); why != "" {
							t.Skip(why)
						}
					}
					sc.run(t, openSeams(t, kind))
				})
			}
		})
	}
}

// A concurrency zone of n 2: two slots, the third refused, a release frees
// one; an override's n is the key's limit, for admission and the read.
func seamSlots(t *testing.T, e *seamEnv) {
	z := e.zone(zones.Config{Name: "slots", Concurrency: 2, Lease: time.Hour})
	a, b := z.admit("k"), z.admit("k")
	wantAllowed(t, "slot 1", a.Decision, 1)
	wantAllowed(t, "slot 2", b.Decision, 0)
	c := z.admit("k")
	wantDenied(t, "slot 3 of 2", c.Decision, zones.ConcurrencyRetryAfter)
	if c.Holds() || !a.Holds() || !b.Holds() {
		t.Fatalf("holds %v %v %v, want the two admitted only", a.Holds(), b.Holds(), c.Holds())
	}
	if s := z.read(t, "k"); s.Limit != 2 || s.InFlight != 2 || s.Remaining != 0 || s.Allowed {
		t.Fatalf("read with 2 of 2 held: %+v", s)
	}
	a.Release()
	// A release never waits for the store: poll until it landed.
	var d seamTicket
	waitFor(t, 10*time.Second, "a released slot to be free again", func() bool {
		d = z.admit("k")
		return d.Allowed
	})
	wantAllowed(t, "the released slot", d.Decision, 0)
	set(t, z.overrides, &zones.Override{ID: "wide", Key: "k", Plan: zones.ConcurrencyPlan(3)})
	o := z.admit("k")
	wantAllowed(t, "slot 3 of the override's 3", o.Decision, 0)
	if o.Quota() != 3 {
		t.Fatalf("q %d under the override, want 3", o.Quota())
	}
	wantDenied(t, "slot 4 of the override's 3", z.admit("k").Decision, zones.ConcurrencyRetryAfter)
	if s := z.read(t, "k"); s.Limit != 3 || s.InFlight != 3 || s.Remaining != 0 {
		t.Fatalf("read with 3 of the override's 3 held: %+v", s)
	}
	for _, tk := range []*seamTicket{&b, &d, &o} {
		tk.Release()
	}
	waitFor(t, 10*time.Second, "every slot to be free", func() bool {
		s := z.read(t, "k")
		return s.InFlight == 0 && s.Remaining == 3 && s.Allowed
	})
}

// set makes list the override set the zone resolves from.
func set(t *testing.T, o *zones.Overrides, list ...*zones.Override) {
	t.Helper()
	s, err := zones.NewOverrideSet(list)
	if err != nil {
		t.Fatal(err)
	}
	o.Store(s)
}

// An adaptive zone decides in the instance on every store (its limit
// follows the upstream this instance sees): min = max = 3 places, the
// fourth shed, a finished request's place given back; an exempt override
// takes no place.
func seamAdaptive(t *testing.T, e *seamEnv) {
	z := e.zone(zones.Config{Name: "adaptive", Adaptive: algorithms.AdaptiveLimit{Target: int64(time.Second), Min: 3, Max: 3}})
	var held []seamTicket
	for i := range 3 {
		tk := z.admit("k")
		wantAllowed(t, fmt.Sprintf("place %d", i+1), tk.Decision, int64(2-i))
		if tk.Source != zones.SourceLocal || tk.Quota() != 3 {
			t.Fatalf("place %d: source %v q %d, want decided in the instance at 3", i+1, tk.Source, tk.Quota())
		}
		held = append(held, tk)
	}
	wantDenied(t, "place 4 of 3", z.admit("k").Decision, zones.ConcurrencyRetryAfter)
	if s := z.read(t, "k"); s.Limit != 3 || s.InFlight != 3 || s.Remaining != 0 {
		t.Fatalf("read with 3 of 3 held: %+v", s)
	}
	held[0].Finish(monotime.Now(), 10*time.Millisecond, false)
	held[0] = z.admit("k")
	wantAllowed(t, "a finished request's place", held[0].Decision, 0)
	set(t, z.overrides, &zones.Override{ID: "vip", Key: "k", Exempt: true})
	ex := z.admit("k")
	if !ex.Allowed || ex.Source != zones.SourceOverride || ex.Holds() {
		t.Fatalf("exempt at 3 of 3: %+v (holds %v), want admitted by the override, no place taken", ex.Decision, ex.Holds())
	}
	z.overrides.Store(nil)
	for i := range held {
		held[i].Finish(monotime.Now(), 10*time.Millisecond, false)
	}
	if s := z.read(t, "k"); s.InFlight != 0 || s.Remaining != 3 {
		t.Fatalf("read with every place given back: %+v", s)
	}
}

// ovInstance plays one instance's override holder over a store's
// zones.OverrideStore (nil: a local zone's, kept in the instance): it
// reads what changed, gives the store its copies back when the store lost
// them (a new epoch), and resolves the records, each after the ones
// changed before it, into the zone's set, as the module's holder does.
type ovInstance struct {
	t       *testing.T
	zone    seamZone
	remote  *zones.OverrideStore
	at      zones.OverridesAt
	records map[string]zones.StoredOverride
	local   int64 // a local zone's versions
}

// ovRecord is what the test stores as an override's record.
type ovRecord struct {
	Key          string
	Events       int64
	Exempt, Deny bool
}

func (i *ovInstance) put(id string, r ovRecord, expires time.Time) {
	i.t.Helper()
	data, _ := json.Marshal(r)
	o := zones.StoredOverride{ID: id, Expires: expires, Record: data}
	if i.remote == nil {
		i.local++
		o.Version = i.local
		i.records[id] = o
	} else if _, err := i.remote.Put(context.Background(), i.zone.Name, o); err != nil {
		i.t.Fatalf("put %s: %v", id, err)
	}
	i.sync()
}

// sync reads the store's changes and rebuilds the zone's set.
func (i *ovInstance) sync() {
	i.t.Helper()
	ctx := context.Background()
	if i.remote != nil {
		read, err := i.remote.Read(ctx, i.zone.Name, i.at)
		if err != nil {
			i.t.Fatalf("reading the overrides: %v", err)
		}
		if i.at.Epoch != "" && read.At.Epoch != i.at.Epoch && len(i.records) > 0 {
			// In the order of their changes: the store versions them
			// anew in the order given.
			if _, err := i.remote.Restore(ctx, i.zone.Name, i.inOrder()); err != nil {
				i.t.Fatalf("restoring the overrides: %v", err)
			}
			if read, err = i.remote.Read(ctx, i.zone.Name, zones.OverridesAt{}); err != nil {
				i.t.Fatalf("reading the overrides back: %v", err)
			}
		}
		if read.All {
			clear(i.records)
		}
		for _, o := range read.Changes {
			if o.Record == nil {
				delete(i.records, o.ID)
			} else {
				i.records[o.ID] = o
			}
		}
		i.at = read.At
	}
	var list []*zones.Override
	for _, s := range i.inOrder() {
		var r ovRecord
		if err := json.Unmarshal(s.Record, &r); err != nil {
			i.t.Fatalf("override %s: %v", s.ID, err)
		}
		o := &zones.Override{ID: s.ID, Key: r.Key, Exempt: r.Exempt, Deny: r.Deny}
		if !s.Expires.IsZero() {
			o.Expires = s.Expires.UnixNano()
		}
		if r.Events > 0 {
			p, err := zones.NewPlan(r.Events, time.Hour, 0)
			if err != nil {
				i.t.Fatal(err)
			}
			o.Plan = p
		}
		list = append(list, o)
	}
	set(i.t, i.zone.overrides, list...)
}

// inOrder is the overrides in force, in the order of their changes; a
// lapsed one is dropped.
func (i *ovInstance) inOrder() []zones.StoredOverride {
	order := make([]zones.StoredOverride, 0, len(i.records))
	for id, o := range i.records {
		if !o.Expires.IsZero() && !o.Expires.After(time.Now()) {
			delete(i.records, id)
			continue
		}
		order = append(order, o)
	}
	slices.SortFunc(order, func(a, b zones.StoredOverride) int {
		return cmp.Or(cmp.Compare(a.Version, b.Version), strings.Compare(a.ID, b.ID))
	})
	return order
}

// ids is the ids the instance holds, sorted.
func (i *ovInstance) ids() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for id := range i.records {
			if !yield(id) {
				return
			}
		}
	})
}

// Overrides kept through the store's zones.Offers.Overrides (a local
// zone's in the instance): a raise and a deny are in force at once, an
// expiring deny lapses, of two with the same match the latest change is
// in force, and a store that lost its data (FLUSHALL) while another
// instance set one more gets this instance's copies back: every override
// holds again, on both instances.
func seamOverrides(t *testing.T, e *seamEnv) {
	keys := []string{"raise", "lapse", "same"}
	z := e.zone(rateZone(), keys...)
	inst := &ovInstance{t: t, zone: z, records: map[string]zones.StoredOverride{}}
	if z.store != nil {
		if inst.remote = z.store.Offers().Overrides; inst.remote == nil {
			t.Fatalf("the %s store offers no overrides", e.kind.name)
		}
	}
	inst.put("raise", ovRecord{Key: "raise", Events: 10}, time.Time{})
	wantAllowed(t, "a key raised to 10", z.admit("raise").Decision, 9)

	inst.put("lapse", ovRecord{Key: "lapse", Deny: true}, time.Now().Add(time.Second))
	d := z.admit("lapse")
	if d.Allowed || d.Source != zones.SourceOverride || d.RetryAfter > time.Second {
		t.Fatalf("a key denied for a second: %+v", d.Decision)
	}
	// The zone passes over a lapsed override before its holder drops it.
	waitFor(t, 10*time.Second, "the deny override to lapse", func() bool { return z.Override("lapse") == nil })
	if inst.sync(); slices.Contains(inst.ids(), "lapse") {
		t.Fatalf("the instance still holds a lapsed override: %v", inst.ids())
	}
	wantAllowed(t, "a key whose deny lapsed", z.admit("lapse").Decision, 4)

	// "b-deny" sorts after "a-exempt": only the order of the changes may
	// put the exempt one in force.
	exempt := func(what string) {
		t.Helper()
		if got := z.admit("same"); !got.Allowed || got.Source != zones.SourceOverride {
			t.Fatalf("%s: %+v, want exempt in force", what, got.Decision)
		}
	}
	inst.put("b-deny", ovRecord{Key: "same", Deny: true}, time.Time{})
	inst.put("a-exempt", ovRecord{Key: "same", Exempt: true}, time.Time{})
	exempt("exempt set after deny on the same key")
	inst.put("b-deny", ovRecord{Key: "same", Deny: true}, time.Time{})
	if got := z.admit("same"); got.Allowed || got.Source != zones.SourceOverride {
		t.Fatalf("deny set again after exempt on the same key: %+v, want deny in force", got.Decision)
	}
	inst.put("a-exempt", ovRecord{Key: "same", Exempt: true}, time.Time{})
	exempt("exempt set again after deny on the same key")
	if e.redis == nil {
		return // a local zone's overrides are the instance's: no store to lose
	}
	if err := e.redis.Client().FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// Another instance sets one more first: the hash is back, at another
	// epoch, with that one override only.
	other := &ovInstance{t: t, zone: seamZone{Zone: z.Zone, overrides: &zones.Overrides{}}, remote: inst.remote,
		records: map[string]zones.StoredOverride{}}
	other.put("late", ovRecord{Key: "late", Exempt: true}, time.Time{})
	inst.sync()
	want := []string{"a-exempt", "b-deny", "late", "raise"}
	if got := inst.ids(); !slices.Equal(got, want) {
		t.Fatalf("after FLUSHALL this instance holds %v, want %v (its copies restored)", got, want)
	}
	other.sync()
	if got := other.ids(); !slices.Equal(got, want) {
		t.Fatalf("after FLUSHALL the other instance reads %v, want %v", got, want)
	}
	if r := z.admit("raise"); !r.Allowed || r.Quota() != 10 {
		t.Fatalf("the raise after FLUSHALL: %+v at q %d, want admitted at 10", r.Decision, r.Quota())
	}
	exempt("the latest of the same match after FLUSHALL")
	if o := other.zone.overrides.Load().Lookup("same", time.Now().UnixNano()); o == nil || !o.Exempt {
		t.Fatalf("the other instance resolves %+v for the same match, want the latest, exempt", o)
	}
}

// The one read is the state now: a fresh key reads its whole burst; after
// a request, that request's Remaining; a denied key none, with the
// denial's Retry-After.
func seamRead(t *testing.T, e *seamEnv) {
	z := e.zone(rateZone(), "k")
	if s := z.read(t, "k"); !s.Allowed || s.Remaining != 5 || s.RetryAfter != 0 || s.Tracked || s.Limit != 5 || s.Window != time.Hour {
		t.Fatalf("a fresh key reads %+v, want 5 of 5 left, untracked", s)
	}
	first := z.admit("k")
	wantAllowed(t, "the first request", first.Decision, 4)
	if s := z.read(t, "k"); !s.Allowed || s.Remaining != first.Remaining || !s.Tracked {
		t.Fatalf("after one request the key reads %+v, want its remaining, %d", s, first.Remaining)
	}
	for i := range 4 {
		wantAllowed(t, fmt.Sprintf("request %d", i+2), z.admit("k").Decision, int64(3-i))
	}
	e.settle() // async: the denial is then Redis's, not the instance's before it heard
	denied := z.admit("k")
	wantDenied(t, "request 6 of 5", denied.Decision, slowT)
	s := z.read(t, "k")
	if s.Allowed || s.Remaining != 0 || s.RetryAfter > denied.RetryAfter || s.RetryAfter < denied.RetryAfter-retrySlack {
		t.Fatalf("a denied key reads %+v, want none left for its denial's %v", s, denied.RetryAfter)
	}
}

// The one read of a quota zone: the period's units left.
func seamReadQuota(t *testing.T, e *seamEnv) {
	z := e.zone(quotaZone(), "k")
	if s := z.read(t, "k"); !s.Allowed || s.Remaining != 3 || s.Used != 0 || s.Tracked {
		t.Fatalf("a fresh key reads %+v, want 3 of 3 left", s)
	}
	first := z.admit("k")
	wantAllowed(t, "the first unit", first.Decision, 2)
	// Not what the one read promises, noted in the suite's report: an
	// async instance's read of a quota key is the store's count, which
	// holds the instance's whole lease as used (as the suite's quota_peek
	// pins), so it reads less than the request's remaining.
	if s := z.read(t, "k"); s.Remaining != first.Remaining && !(e.async != nil && s.Remaining < first.Remaining) {
		t.Fatalf("after one unit the key reads %+v, want %d left", s, first.Remaining)
	}
	z.admit("k")
	z.admit("k")
	dayEnd := toDayEnd() // before the step: the store's clock reads it later
	denied := z.admit("k")
	wantDenied(t, "unit 4 of 3", denied.Decision, dayEnd)
	// An async instance's lease ends early by its take's round trip, which
	// the store's timeout (1s) bounds: its denial may say that much less
	// than Redis, which the read asks.
	early := time.Duration(0)
	if e.async != nil {
		early = time.Second
	}
	s := z.read(t, "k")
	if s.Allowed || s.Remaining != 0 || s.RetryAfter > denied.RetryAfter+early+time.Millisecond || s.RetryAfter < denied.RetryAfter-retrySlack {
		t.Fatalf("an exhausted key reads %+v, want none left for %v", s, denied.RetryAfter)
	}
}

// A request admitted by two zones and denied by the third consumes
// nothing in the first two (Admit cancels them), read back through the
// one read.
func seamAdmitThird(t *testing.T, e *seamEnv) {
	second := with(quotaZone(), func(c *zones.Config) { c.Name = "conf2" })
	full := int64(3)
	if e.kind.global {
		second, full = with(rateZone(), func(c *zones.Config) { c.Name = "conf2" }), 5
	}
	zs := []seamZone{
		e.zone(with(rateZone(), func(c *zones.Config) { c.Name = "conf1" }), "k"),
		e.zone(second, "k"),
		e.zone(with(rateZone(), func(c *zones.Config) { c.Name = "conf3" }), "k"),
	}
	spent := zs[2].ticket("k")
	spent.Cost = 5
	if spent.Admit(context.Background(), monotime.Now()); !spent.Allowed {
		t.Fatalf("spending the third zone's key: %+v", spent.Decision)
	}
	tickets := []seamTicket{zs[0].ticket("k"), zs[1].ticket("k"), zs[2].ticket("k")}
	var seen []int
	adm := zones.Admit(context.Background(), tickets, monotime.Now(), func(i int) { seen = append(seen, i) },
		func(int64) (context.Context, bool) { t.Fatal("no zone has delay"); return nil, false })
	if adm.Denied != 2 || adm.Gone || !slices.Equal(seen, []int{0, 1, 2}) {
		t.Fatalf("admission %+v, zones seen %v; want denied by the third, each seen", adm, seen)
	}
	if !tickets[0].Allowed || !tickets[1].Allowed || tickets[2].Allowed {
		t.Fatalf("decisions %v %v %v, want the first two allowed, the third denied", tickets[0].Allowed, tickets[1].Allowed, tickets[2].Allowed)
	}
	for i, want := range []int64{5, full} {
		// Async's quota read holds its lease as used (see read_quota).
		if s := zs[i].read(t, "k"); !s.Allowed || s.Remaining != want && !(e.async != nil && zs[i].IsQuota()) {
			t.Fatalf("zone %d after the third denied: %+v, want %d of %d left (nothing consumed)", i+1, s, want, want)
		}
		// The next request is the key's first, in every mode.
		wantAllowed(t, fmt.Sprintf("zone %d's next request", i+1), zs[i].admit("k").Decision, want-1)
	}
}
