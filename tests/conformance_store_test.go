package tests

// The store conformance suite: one table of scenarios, each a sequence of a
// zone's operations (decide, a post-charged check and charge, a refund after
// a later zone's denial, peek, reset, Redis going away), run through
// zones.Zone against every store a zone decides with: none (local), strict,
// async, and scope global over strict and over async. Every store must give
// the same answers (allowed or denied, Remaining, Retry-After to within
// retrySlack, a ban and whether this step started it, a wait for a turn,
// the fail policy's source); where a mode is documented to answer
// otherwise, the step says so in its own field (async, local), never by
// loosening the common expectation.
//
// Limits are slow (a token every 12 minutes; every 50 seconds for delay,
// whose wait is at most a minute; a quota per day) so that nothing refills
// while a scenario runs, even on a loaded machine; conditions are polled,
// never slept for.
//
// The seams between a zone and what surrounds it (slots, adaptive zones,
// overrides, the one read, the multi-zone Admit) are the suite's too, in
// conformance_seams_test.go, over the same stores.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// retrySlack is how much earlier than the scenario's figure a Retry-After,
// a reset or a wait may be: the time the scenario has run so far, on a
// loaded machine, rounded up generously. None may be later (but for a
// microsecond's rounding).
const retrySlack = 30 * time.Second

// confSyncInterval is the async stores' sync interval: a denial an async
// instance makes before it has heard from Redis lasts until its next sync.
const confSyncInterval = 100 * time.Millisecond

// confOp is one step of a scenario.
type confOp uint8

const (
	opDecide confOp = iota // DecideWith the zone's plan, at cost
	opCheck                // a post-charged zone's Check
	opCharge               // a post-charged zone's Charge, at cost
	opRefund               // RefundWith the last decision (a later zone denied the request)
	opPeek                 // Peek (the admin read)
	opReset                // Reset (the admin reset)
	opSettle               // async: wait until a sync started after this step has landed; else nothing
	opDown                 // Redis dies (SIGKILL); wait until the zone's store errors
)

func (o confOp) String() string {
	return [...]string{"decide", "check", "charge", "refund", "peek", "reset", "settle", "down"}[o]
}

// confWant is what a step must answer. Zero fields are checked too (a
// denial must not say banned), but for the figures a step leaves at -1.
type confWant struct {
	allowed   bool
	remaining int64         // -1: not checked
	retry     time.Duration // denied: Retry-After, within retrySlack below; -1: to the quota period's end
	retryMax  time.Duration // denied: Retry-After at most this, instead of retry (async before a sync)
	reset     time.Duration // peek: ResetAfter within retrySlack below (0: not checked)
	banned    bool
	started   time.Duration // BanStarted, within retrySlack below
	delay     time.Duration // admitted for later: the wait, within retrySlack below
	queueFull bool
	fail      string // "": decided by the store or the table; else the fail policy (open, closed, local)
	unknown   bool   // peek: ErrUnknownKey
	skip      bool   // not checked in this mode: a race noted in the suite's report
	remAtMost bool   // remaining is an upper bound, allowed and Retry-After follow it (async's peek counts leases as spent)
}

// confStep is one operation and its answer; async, local and strict, when
// set, replace want in that mode (strict: scope global over strict too):
// async's documented differences, and the undocumented divergences this
// suite found, each pinned where it is written with a note, so that the
// re-cut keeps or fixes them knowingly.
type confStep struct {
	op     confOp
	cost   int64
	want   confWant
	async  *confWant
	local  *confWant
	strict *confWant
}

// confScenario is a zone definition and what it answers, step by step, on
// key "k".
type confScenario struct {
	name     string
	cfg      zones.Config
	outage   bool // has an opDown: not for a local zone
	rateOnly bool // not a quota zone: scope global applies
	steps    []confStep
}

// confStoreKind is a store a zone decides with.
type confStoreKind struct {
	name   string
	mode   string // local, strict or async
	global bool   // scope global over the mode's store
}

var confStores = []confStoreKind{
	{"local", "local", false},
	{"strict", "strict", false},
	{"async", "async", false},
	{"global_strict", "strict", true},
	{"global_async", "async", true},
}

// A zone under test, with what the scenario's steps need of its store.
type confEnv struct {
	t     *testing.T
	zone  *zones.Zone
	plan  zones.Plan
	redis *redisServer       // nil for a local zone
	async *distributed.Async // the async store, in async mode
}

// openConfZone opens cfg's zone over a fresh store of kind, closed with the
// test.
func openConfZone(t *testing.T, kind confStoreKind, cfg zones.Config) *confEnv {
	t.Helper()
	state := zones.NewState(cfg, time.Minute)
	t.Cleanup(func() { _ = state.Destruct() })
	e := &confEnv{t: t}
	var store zones.Store
	switch kind.mode {
	case "strict":
		e.redis = startRedis(t)
		s := openStore(t, distributed.Options{Addresses: []string{e.redis.Addr}, Timeout: time.Second}, nil)
		waitSubscribed(t, s.ResetsSubscribed)
		store = s
	case "async":
		e.redis = startRedis(t)
		a, err := distributed.OpenAsync(distributed.Options{Addresses: []string{e.redis.Addr}, Mode: "async",
			SyncInterval: confSyncInterval, Timeout: time.Second, Instance: nextTestInstance()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		waitSubscribed(t, a.ResetsSubscribed)
		e.async, store = a, a
	}
	if kind.global {
		store = globalOver(t, store, e.redis.Addr, cfg)
	}
	e.zone = mustZone(cfg, state, store)
	e.plan = e.zone.Plan()
	return e
}

// waitSubscribed waits until a store is subscribed to resets: its first
// subscription drops the denials cached before it (resets made meanwhile
// were not heard), and on a loaded machine it landed between a scenario's
// denial and its check of the deny cache.
func waitSubscribed(t *testing.T, subscribed func() bool) {
	t.Helper()
	waitFor(t, 10*time.Second, "the store to subscribe to resets", subscribed)
}

// globalOver wraps store for a scope global zone cfg, in the only region
// (weight 1) of a global store on the same redis-server (its own prefix):
// once the region has synced, its share is the whole limit, so the zone
// must answer exactly as over store itself. The region's loops never tick
// (sync interval 1h): its share stays what SyncNow read, Redis or no Redis.
func globalOver(t *testing.T, store zones.Store, addr string, cfg zones.Config) zones.Store {
	t.Helper()
	reg, err := distributed.OpenRegion(store, distributed.RegionOptions{
		Region:       "eu",
		Regions:      []distributed.RegionWeight{{Name: "eu", Weight: 1}},
		Global:       distributed.Options{Addresses: []string{addr}, KeyPrefix: "global:", Timeout: 2 * time.Second},
		SyncInterval: time.Hour,
		Lease:        3 * time.Hour,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	shared := reg.Wrap(store, cfg.Name, cfg.Limit())
	waitFor(t, 10*time.Second, "the only region to hold the whole limit", func() bool {
		reg.SyncNow()
		return reg.Share(cfg.Name, "k") == distributed.ShareScale
	})
	return shared
}

// settle waits, in async mode, until a sync that started a sync interval
// after now has landed: the instance's view is then Redis's.
func (e *confEnv) settle() {
	if e.async == nil {
		return
	}
	// The sync after next: the next one may have been due before now, and
	// a denial made before it holds until it is due.
	after := time.Now().Add(confSyncInterval)
	waitFor(e.t, 10*time.Second, "an async sync", func() bool { return e.async.LastSync().After(after) })
}

// down kills Redis and waits until the zone's store errors, which a probe
// key tells: at once in strict mode, once its view is stale in async mode
// (it decides from its leases until then, as documented).
func (e *confEnv) down() {
	e.redis.Kill()
	ctx := context.Background()
	probes := 0
	waitFor(e.t, 15*time.Second, "the zone's store to fail", func() bool {
		// A fresh key each time: a denied or banned one would be answered
		// here, without the store.
		probes++
		d := e.zone.DecideWith(ctx, fmt.Sprintf("probe-%d", probes), monotime.Now(), &e.plan, 1)
		return failOf(d.Source) != ""
	})
}

func failOf(s zones.Source) string {
	switch s {
	case zones.SourceFailOpen:
		return "open"
	case zones.SourceFailClosed:
		return "closed"
	case zones.SourceFailLocal:
		return "local"
	}
	return ""
}

// toDayEnd is the time to the end of the current UTC day: a quota zone's
// Retry-After, read before the step (a scenario run across midnight UTC
// fails).
func toDayEnd() time.Duration {
	now := time.Now().UTC()
	return now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now)
}

// near reports whether got is want, earlier by at most retrySlack (the
// time the scenario has run), later by at most a millisecond (rounding to
// Redis's microseconds and back).
func near(got, want time.Duration) bool {
	return got <= want+time.Millisecond && got >= want-retrySlack
}

// run runs sc's steps on e, failing at the first answer that differs.
func (e *confEnv) run(sc confScenario, mode string) {
	t := e.t
	ctx := context.Background()
	var last zones.Decision
	for i, st := range sc.steps {
		w := st.want
		if st.async != nil && mode == "async" {
			w = *st.async
		}
		if st.local != nil && mode == "local" {
			w = *st.local
		}
		if st.strict != nil && mode == "strict" {
			w = *st.strict
		}
		cost := max(st.cost, 1)
		dayEnd := toDayEnd() // before the step: Redis's clock reads it later
		now := monotime.Now()
		var d zones.Decision
		var err error
		switch st.op {
		case opDecide:
			d = e.zone.DecideWith(ctx, "k", now, &e.plan, cost)
			last = d
		case opCheck:
			d = e.zone.Check(ctx, "k", now, &e.plan)
		case opCharge:
			e.zone.Charge(ctx, "k", now, &e.plan, cost)
			continue
		case opRefund:
			d, err = e.zone.RefundWith(ctx, "k", now, last, &e.plan, cost)
			if err != nil {
				t.Fatalf("step %d (refund): %v", i, err)
			}
		case opPeek:
			tk := zones.Ticket[struct{}]{Zone: e.zone, Key: "k", Plan: e.zone.LastPlan("k", now), Cost: 1}
			s, err := tk.Read(ctx, now)
			if err != nil {
				t.Fatalf("step %d (read): %v", i, err)
			}
			if d = s.Decision; w.unknown {
				if s.Tracked {
					t.Fatalf("step %d (read): %+v; want the key untracked", i, s)
				}
				continue
			}
		case opReset:
			if err := e.zone.Reset(ctx, "k"); err != nil {
				t.Fatalf("step %d (reset): %v", i, err)
			}
			continue
		case opSettle:
			e.settle()
			continue
		case opDown:
			e.down()
			continue
		}
		if w.skip {
			continue
		}
		if msg := w.mismatch(d, dayEnd); msg != "" {
			t.Fatalf("step %d (%v, cost %d): %s\ngot %+v", i, st.op, cost, msg, d)
		}
		if d.Allowed && d.Delay > 0 && st.op == opDecide {
			e.zone.EndWait()
		}
	}
}

// mismatch says how d differs from w, "" when it does not.
func (w confWant) mismatch(d zones.Decision, dayEnd time.Duration) string {
	if d.Allowed != w.allowed && !w.remAtMost {
		return fmt.Sprintf("allowed %v, want %v", d.Allowed, w.allowed)
	}
	if got := failOf(d.Source); got != w.fail {
		return fmt.Sprintf("fail policy %q decided, want %q", got, w.fail)
	}
	if w.remaining >= 0 {
		if w.remAtMost && d.Remaining > w.remaining {
			return fmt.Sprintf("remaining %d, want at most %d", d.Remaining, w.remaining)
		}
		if !w.remAtMost && d.Remaining != w.remaining {
			return fmt.Sprintf("remaining %d, want %d", d.Remaining, w.remaining)
		}
	}
	if !d.Allowed && !w.remAtMost {
		switch {
		case w.retryMax > 0:
			if d.RetryAfter <= 0 || d.RetryAfter > w.retryMax {
				return fmt.Sprintf("Retry-After %v, want at most %v", d.RetryAfter, w.retryMax)
			}
		case w.retry < 0:
			if !near(d.RetryAfter, dayEnd) {
				return fmt.Sprintf("Retry-After %v, want the period's end, %v", d.RetryAfter, dayEnd)
			}
		case !near(d.RetryAfter, w.retry):
			return fmt.Sprintf("Retry-After %v, want %v", d.RetryAfter, w.retry)
		}
	}
	if w.reset > 0 && !near(d.ResetAfter, w.reset) && !(w.remAtMost && d.ResetAfter >= w.reset) {
		return fmt.Sprintf("ResetAfter %v, want %v", d.ResetAfter, w.reset)
	}
	if d.Banned != w.banned {
		return fmt.Sprintf("banned %v, want %v", d.Banned, w.banned)
	}
	if (d.BanStarted == 0) != (w.started == 0) || (w.started > 0 && !near(d.BanStarted, w.started)) {
		return fmt.Sprintf("ban started %v, want %v", d.BanStarted, w.started)
	}
	if (d.Delay == 0) != (w.delay == 0) || (w.delay > 0 && !near(d.Delay, w.delay)) {
		return fmt.Sprintf("delay %v, want %v", d.Delay, w.delay)
	}
	if d.QueueFull != w.queueFull {
		return fmt.Sprintf("queue full %v, want %v", d.QueueFull, w.queueFull)
	}
	return ""
}

// Step constructors, so that the table reads as the scenario.
func allow(rem int64) confWant { return confWant{allowed: true, remaining: rem} }

func deny(retry time.Duration) confWant { return confWant{remaining: 0, retry: retry} }

// beforeSync is an async instance's denial before it has heard from Redis:
// until its next sync (record.result), a documented difference.
func beforeSync() *confWant {
	return &confWant{remaining: 0, retryMax: confSyncInterval + retrySlack/10}
}

func (w *confWant) withStarted(d time.Duration) *confWant { w.started = d; return w }

func decide(w confWant) confStep { return confStep{op: opDecide, want: w} }

func decideCost(cost int64, w confWant) confStep { return confStep{op: opDecide, cost: cost, want: w} }

func check(w confWant) confStep { return confStep{op: opCheck, want: w} }

func charge(cost int64) confStep { return confStep{op: opCharge, cost: cost} }

func step(op confOp) confStep { return confStep{op: op} }

func (s confStep) inAsync(w *confWant) confStep { s.async = w; return s }

func (s confStep) inStrict(w confWant) confStep { s.strict = &w; return s }

// The scenarios' limits.
const (
	slowT  = 12 * time.Minute // events 5 per hour
	delayT = 50 * time.Second // events 72 per hour, for delay 1m
)

func rateZone() zones.Config { return zones.Config{Name: "conf", Events: 5, Window: time.Hour} }

func delayZone() zones.Config {
	return zones.Config{Name: "conf", Events: 72, Window: time.Hour, Burst: 2, Delay: time.Minute}
}

func quotaZone() zones.Config {
	return zones.Config{Name: "conf", Quota: 3, Period: algorithms.Day, Location: time.UTC}
}

func with(c zones.Config, f func(*zones.Config)) zones.Config { f(&c); return c }

func confScenarios() []confScenario {
	fiveAllowed := []confStep{decide(allow(4)), decide(allow(3)), decide(allow(2)), decide(allow(1)), decide(allow(0))}
	banned := func(started time.Duration) confWant {
		return confWant{remaining: 0, retry: time.Hour, banned: true, started: started}
	}
	return []confScenario{
		{name: "decide", cfg: rateZone(), rateOnly: true, steps: append(fiveAllowed,
			decide(deny(slowT)).inAsync(beforeSync()),
			step(opSettle),
			decide(deny(slowT)),
		)},
		{name: "decide_cost", cfg: rateZone(), rateOnly: true, steps: []confStep{
			decideCost(3, allow(2)),
			decideCost(3, deny(slowT)).inAsync(beforeSync()),
			// Not documented, noted in the suite's report: a strict zone's
			// deny cache holds a weighted request's denial until its own
			// retry, and so denies a cheaper request the key has room for
			// (the table and async's record, which caches a denial only
			// with no unit left, admit it).
			decideCost(2, allow(0)).inStrict(deny(slowT)),
			step(opSettle),
			decide(deny(slowT)),
		}},
		{name: "check_then_charge", cfg: rateZone(), rateOnly: true, steps: []confStep{
			check(allow(5)),
			charge(3),
			check(allow(2)),
			charge(3),
			// Six charged of five: a unit is back after two intervals.
			check(deny(2 * slowT)).inAsync(beforeSync()),
			step(opSettle),
			check(deny(2 * slowT)),
		}},
		{name: "refund_after_later_zone_denied", cfg: rateZone(), rateOnly: true, steps: []confStep{
			decide(allow(4)),
			step(opRefund).withWant(allow(5)),
			decide(allow(4)), decide(allow(3)), decide(allow(2)), decide(allow(1)), decide(allow(0)),
			decide(deny(slowT)).inAsync(beforeSync()),
		}},
		{name: "refund_cost", cfg: rateZone(), rateOnly: true, steps: []confStep{
			decideCost(4, allow(1)),
			confStep{op: opRefund, cost: 4, want: allow(5)},
			decideCost(5, allow(0)),
		}},
		{name: "peek", cfg: rateZone(), rateOnly: true, steps: []confStep{
			step(opPeek).withWant(confWant{unknown: true}),
			decide(allow(4)), decide(allow(3)),
			step(opSettle),
			// Async: Redis counts the instance's lease as spent.
			step(opPeek).withWant(confWant{allowed: true, remaining: 3, reset: 2 * slowT}).
				inAsync(&confWant{allowed: true, remaining: 3, remAtMost: true, reset: 2 * slowT}),
		}},
		{name: "reset", cfg: rateZone(), rateOnly: true, steps: append(fiveAllowed,
			decide(deny(slowT)).inAsync(beforeSync()),
			step(opReset),
			decide(allow(4)),
		)},
		{name: "ban", cfg: with(rateZone(), func(c *zones.Config) { c.Ban = time.Hour }), rateOnly: true, steps: append(fiveAllowed,
			decide(banned(time.Hour)),
			decide(banned(0)),
			check(banned(0)),
			step(opReset),
			decide(allow(4)),
		)},
		// A check's denial starts a ban. Not after a charge (noted in the
		// suite's report): a charge's reply fills the deny cache, which a
		// check consults before it waits for the key's pending charges,
		// so whether the check right after starts a ban depends on
		// whether the charge has landed.
		{name: "ban_on_check", cfg: with(rateZone(), func(c *zones.Config) { c.Ban = time.Hour }), rateOnly: true, steps: []confStep{
			check(allow(5)),
			decide(allow(4)), decide(allow(3)), decide(allow(2)), decide(allow(1)), decide(allow(0)),
			check(banned(time.Hour)),
			check(banned(0)),
			decide(banned(0)),
		}},
		{name: "delay", cfg: delayZone(), rateOnly: true, steps: []confStep{
			decide(allow(1)), decide(allow(0)),
			decide(confWant{allowed: true, remaining: -1, delay: delayT}),
			// Retry-After counts the reserved turn.
			decide(deny(2 * delayT)),
			decide(deny(2 * delayT)),
		}},
		{name: "delay_refund", cfg: delayZone(), rateOnly: true, steps: []confStep{
			decide(allow(1)), decide(allow(0)),
			decide(confWant{allowed: true, remaining: -1, delay: delayT}),
			// The client left while waiting: its turn goes back.
			step(opRefund).withWant(confWant{allowed: true, remaining: -1, delay: delayT}),
			// Not documented, noted in the suite's report: async's refund
			// of an admission for later gives its allowance a token it
			// never took from it, so the next request goes at once.
			decide(confWant{allowed: true, remaining: -1, delay: delayT}).
				inAsync(&confWant{allowed: true, remaining: 0}),
		}},
		{name: "delay_ban", cfg: with(delayZone(), func(c *zones.Config) { c.Ban = time.Hour }), rateOnly: true, steps: []confStep{
			decide(allow(1)), decide(allow(0)),
			decide(confWant{allowed: true, remaining: -1, delay: delayT}),
			decide(banned(time.Hour)),
			decide(banned(0)),
		}},
		{name: "dry_run", cfg: with(delayZone(), func(c *zones.Config) { c.DryRun, c.Ban = true, time.Hour }), rateOnly: true, steps: []confStep{
			decide(allow(1)), decide(allow(0)),
			// No delay, no ban: the denial reports the ban it would start.
			decide(confWant{remaining: 0, retry: delayT, started: time.Hour}).
				inAsync(beforeSync().withStarted(time.Hour)),
			// A would-be ban is reported once: while it would run, a
			// denial reports none, in every mode (a store's from its
			// deny cache, local's decided again).
			decide(deny(delayT)).inAsync(beforeSync()),
			step(opSettle),
			// Nothing was reserved: the key has a token back at delayT;
			// the would-be ban still runs.
			check(deny(delayT)),
		}},
		{name: "quota_decide", cfg: quotaZone(), steps: []confStep{
			decide(allow(2)), decide(allow(1)), decide(allow(0)),
			decide(deny(-1)),
			decide(deny(-1)),
		}},
		{name: "quota_cost", cfg: quotaZone(), steps: []confStep{
			decideCost(2, allow(1)),
			decideCost(2, deny(-1)),
			decide(allow(0)),
		}},
		{name: "quota_check_then_charge", cfg: quotaZone(), steps: []confStep{
			check(allow(3)),
			charge(2),
			check(allow(1)),
			charge(2),
			check(deny(-1)),
		}},
		{name: "quota_refund", cfg: quotaZone(), steps: []confStep{
			decide(allow(2)),
			step(opRefund).withWant(allow(3)),
			decide(allow(2)), decide(allow(1)), decide(allow(0)),
			decide(deny(-1)),
		}},
		{name: "quota_peek", cfg: quotaZone(), steps: []confStep{
			step(opPeek).withWant(confWant{unknown: true}),
			decide(allow(2)),
			step(opSettle),
			step(opPeek).withWant(confWant{allowed: true, remaining: 2}).
				inAsync(&confWant{allowed: true, remaining: 2, remAtMost: true}),
		}},
		{name: "quota_reset", cfg: quotaZone(), steps: []confStep{
			decide(allow(2)), decide(allow(1)), decide(allow(0)),
			decide(deny(-1)),
			step(opReset),
			// Not documented, noted in the suite's report: an async quota
			// sync in flight at the reset writes the instance's use back
			// after the reset's DEL, and the key's next record adopts it:
			// now and then the key is still out of quota here.
			decide(allow(2)).inAsync(&confWant{skip: true}),
		}},
		{name: "fail_open", cfg: with(rateZone(), func(c *zones.Config) { c.FailPolicy = zones.FailOpen }), outage: true, rateOnly: true, steps: []confStep{
			decide(allow(4)),
			step(opDown),
			decide(confWant{allowed: true, remaining: 5, fail: "open"}),
			check(confWant{allowed: true, remaining: 5, fail: "open"}),
		}},
		{name: "fail_closed", cfg: with(rateZone(), func(c *zones.Config) { c.FailPolicy = zones.FailClosed }), outage: true, rateOnly: true, steps: []confStep{
			decide(allow(4)),
			step(opDown),
			decide(confWant{remaining: 0, retry: zones.FailClosedRetryAfter, fail: "closed"}),
			check(confWant{remaining: 0, retry: zones.FailClosedRetryAfter, fail: "closed"}),
		}},
		{name: "fail_local", cfg: rateZone(), outage: true, rateOnly: true, steps: []confStep{
			decide(allow(4)), decide(allow(3)),
			step(opDown),
			// From the key's last state in Redis, at the whole limit (one instance).
			decide(confWant{allowed: true, remaining: 2, fail: "local"}),
			decide(confWant{allowed: true, remaining: 1, fail: "local"}),
			step(opRefund).withWant(confWant{allowed: true, remaining: 2, fail: "local"}),
			decide(confWant{allowed: true, remaining: 1, fail: "local"}),
			decide(confWant{allowed: true, remaining: 0, fail: "local"}),
			decide(confWant{remaining: 0, retry: slowT, fail: "local"}),
		}},
		{name: "fail_local_check_then_charge", cfg: rateZone(), outage: true, rateOnly: true, steps: []confStep{
			check(allow(5)),
			charge(2),
			check(allow(3)),
			step(opDown),
			check(confWant{allowed: true, remaining: 3, fail: "local"}),
			charge(3),
			check(confWant{remaining: 0, retry: slowT, fail: "local"}),
		}},
		{name: "fail_local_delay", cfg: delayZone(), outage: true, rateOnly: true, steps: []confStep{
			decide(allow(1)),
			step(opDown),
			decide(confWant{allowed: true, remaining: 0, fail: "local"}),
			decide(confWant{allowed: true, remaining: -1, delay: delayT, fail: "local"}),
			decide(confWant{remaining: 0, retry: 2 * delayT, fail: "local"}),
		}},
		{name: "fail_closed_ban_holds", cfg: with(rateZone(), func(c *zones.Config) { c.FailPolicy, c.Ban = zones.FailClosed, time.Hour }), outage: true, rateOnly: true, steps: append(fiveAllowed,
			decide(banned(time.Hour)),
			step(opDown),
			// The ban is known here: it holds through the outage, no fail policy.
			decide(banned(0)),
		)},
		{name: "fail_dry_run_never_bans", cfg: with(rateZone(), func(c *zones.Config) { c.DryRun, c.Ban = true, time.Hour }), outage: true, rateOnly: true, steps: []confStep{
			decide(allow(4)),
			step(opDown),
			decideCost(5, confWant{remaining: 0, retry: slowT, fail: "local"}),
			decide(confWant{allowed: true, remaining: 3, fail: "local"}),
		}},
		{name: "quota_fail_open", cfg: with(quotaZone(), func(c *zones.Config) { c.FailPolicy = zones.FailOpen }), outage: true, steps: []confStep{
			decide(allow(2)),
			step(opDown),
			// Async: what is left of the instance's lease is spent first
			// (a quota lease is spent in-process until the period's end).
			decide(confWant{allowed: true, remaining: 3, fail: "open"}).inAsync(&confWant{allowed: true, remaining: 1}),
			decide(confWant{allowed: true, remaining: 3, fail: "open"}),
		}},
		{name: "quota_fail_closed", cfg: with(quotaZone(), func(c *zones.Config) { c.FailPolicy = zones.FailClosed }), outage: true, steps: []confStep{
			decide(allow(2)),
			step(opDown),
			decide(confWant{remaining: 0, retry: zones.FailClosedRetryAfter, fail: "closed"}).inAsync(&confWant{allowed: true, remaining: 1}),
			decide(confWant{remaining: 0, retry: zones.FailClosedRetryAfter, fail: "closed"}),
		}},
		{name: "quota_fail_local", cfg: quotaZone(), outage: true, steps: []confStep{
			decide(allow(2)),
			step(opDown),
			// From what the fleet used, at the whole quota (one instance).
			decide(confWant{allowed: true, remaining: 1, fail: "local"}).inAsync(&confWant{allowed: true, remaining: 1}),
			decide(confWant{allowed: true, remaining: 0, fail: "local"}),
			decide(confWant{remaining: 0, retry: -1, fail: "local"}),
		}},
	}
}

func (s confStep) withWant(w confWant) confStep { s.want = w; return s }

// Every store answers every scenario alike (see the top of the file).
func TestConformance(t *testing.T) {
	for _, kind := range confStores {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			for _, sc := range confScenarios() {
				t.Run(sc.name, func(t *testing.T) {
					switch {
					case sc.outage && kind.mode == "local":
						t.Skip("a local zone has no store to lose")
					case !sc.rateOnly && kind.global:
						t.Skip("scope global applies to rate zones only (the Caddyfile refuses it on a quota zone)")
					}
					e := openConfZone(t, kind, sc.cfg)
					e.run(sc, kind.mode)
				})
			}
		})
	}
}
