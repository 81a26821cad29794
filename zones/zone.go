// Package zones decides requests for one named rate-limit zone: its keys, its
// in-process state, and its fail policy when its shared Store cannot answer.
package zones

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/internal/topk"
)

// FailPolicy says what a zone does when its Store errors, times out or its
// breaker is open.
type FailPolicy uint8

const (
	// FailLocal enforces the zone in-process at this instance's part of the
	// limit (events/N, burst/N, at least 1, N = live instances last seen).
	FailLocal FailPolicy = iota
	// FailOpen allows the request.
	FailOpen
	// FailClosed denies the request with a short Retry-After.
	FailClosed
)

var failPolicyNames = [...]string{FailLocal: "local", FailOpen: "open", FailClosed: "closed"}

// ParseFailPolicy reads "open", "closed" or "local" ("" is local).
func ParseFailPolicy(s string) (FailPolicy, error) {
	for p, name := range failPolicyNames {
		if s == name || s == "" {
			return FailPolicy(p), nil
		}
	}
	return 0, fmt.Errorf("unknown fail_policy %q: use open, closed or local", s)
}

func (p FailPolicy) String() string {
	if int(p) >= len(failPolicyNames) {
		p = FailLocal
	}
	return failPolicyNames[p]
}

const (
	// FailClosedRetryAfter is the Retry-After a fail-closed zone sends while
	// its store is unavailable: short, so clients come back soon after recovery.
	FailClosedRetryAfter = time.Second
	// MaxKeyLength is the longest key kept as is; longer keys are replaced by
	// their SHA-256, so a hostile key costs bounded memory.
	MaxKeyLength = 256
	// OffendersPeriod is how long each of the two top-offender sketches
	// counts denials: the top list covers the last 5 to 10 minutes.
	OffendersPeriod = 5 * time.Minute
	// DefaultMaxKeys caps a zone's local table when max_keys is not set.
	DefaultMaxKeys = 1_000_000
	// MaxMaxKeys is the largest max_keys on every platform (a 32-bit table
	// holds at most math.MaxInt keys, more than fits in memory).
	MaxMaxKeys = 1 << 40
)

// ValidName reports whether name is letters, digits, '_' and '-' only, safe
// in a Redis key and a metric label.
func ValidName(name string) bool {
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return name != ""
}

// Config is a zone's definition.
type Config struct {
	Name       string
	Events     int64
	Window     time.Duration
	Burst      int64 // 0 = Events
	IPv4Prefix int   // 0 = no masking
	IPv6Prefix int   // 0 = no masking
	FailPolicy FailPolicy
	MaxKeys    int64 // 0 = DefaultMaxKeys; at most MaxMaxKeys
	DryRun     bool
	// PerRequest: some requests are decided under a plan read from the
	// request; the zone remembers each key's last plan.
	PerRequest bool
	// Concurrency > 0 makes a concurrency zone (concurrency.go): at most that
	// many requests of a key in flight, instead of Events per Window.
	Concurrency int64
	Lease       time.Duration // concurrency slots in a store; 0 = DefaultLease
	// Period != 0 makes a quota zone (quota.go): at most Quota units of cost
	// per calendar period in Location (nil: UTC). Quota 0 with PerRequest:
	// requests whose plan gives none are denied.
	Quota    int64
	Period   algorithms.Period
	Location *time.Location
	// Ban > 0: a key the zone denies for lack of quota is then denied for
	// Ban (ban.go); BanMax > Ban makes bans escalate up to it.
	Ban    time.Duration
	BanMax time.Duration
	// Delay > 0: a request the zone would deny whose allow time is at most
	// Delay away is admitted for later (delay.go), at most Queue (0:
	// DefaultQueue) waiting at once here.
	Delay time.Duration
	Queue int64
	// Adaptive.Target > 0 makes an adaptive concurrency zone (adaptive.go):
	// its limit per key follows the upstream's latency, shared by Classes
	// priority classes (0: one).
	Adaptive algorithms.AdaptiveLimit
	Classes  int
}

// MinEmissionInterval is the shortest window/events tally enforces (Redis
// keeps microseconds); with MaxSpan bounding the window, every TAT stays
// representable.
const MinEmissionInterval = time.Microsecond

// Validate reports the first thing wrong with the definition and how to fix it.
func (c Config) Validate() error {
	if !ValidName(c.Name) {
		return fmt.Errorf("zone name %q is invalid: use letters, digits, '_' and '-' only", c.Name)
	}
	kind := c.validateRate
	if c.IsQuota() {
		kind = c.validateQuota
	} else if c.IsAdaptive() {
		kind = c.validateAdaptive
	} else if c.Concurrency != 0 || c.Lease != 0 {
		kind = c.validateConcurrency
	}
	for _, check := range []func() error{c.validateBan, c.validateDelay, kind, c.checkKeys} {
		if err := check(); err != nil {
			return fmt.Errorf("zone %s: %v", c.Name, err)
		}
	}
	return nil
}

func (c Config) validateRate() error {
	if _, err := c.Check(); err != nil {
		return err
	}
	_, err := c.Plan()
	return err
}

// Check is Validate for a rate zone's limit: what is wrong, without the
// name, and the setting at fault, for a parser to point at its line.
func (c Config) Check() (setting string, err error) {
	switch {
	case c.Events <= 0:
		return "events", errors.New("events must be a positive number of requests per window (e.g. events 100)")
	case c.Window <= 0:
		return "window", errors.New("window must be a positive duration (e.g. window 1m)")
	case c.Window > MaxSpan:
		return "window", fmt.Errorf("window %v is longer than the %d years tally can represent", c.Window, MaxSpan/(365*24*time.Hour))
	case c.Window/time.Duration(c.Events) < MinEmissionInterval:
		return "window", fmt.Errorf("%d events per %v is more than one per microsecond, finer than tally can enforce: use fewer events or a longer window", c.Events, c.Window)
	case c.Burst < 0:
		return "burst", errors.New("burst must be at least 1 (or omitted for burst = events)")
	case c.Burst > int64(MaxSpan/(c.Window/time.Duration(c.Events))):
		t := c.Window / time.Duration(c.Events)
		return "burst", fmt.Errorf("burst %d at one request per %v takes longer to refill than the %d years tally can represent: use a smaller burst", c.Burst, t, MaxSpan/(365*24*time.Hour))
	}
	return "", nil
}

// checkKeys is Validate for the key settings every kind of zone has (a
// parser bounds them at their line).
func (c Config) checkKeys() error {
	switch {
	case c.IPv4Prefix < 0 || c.IPv4Prefix > 32:
		return errors.New("ipv4_prefix must be between 1 and 32")
	case c.IPv6Prefix < 0 || c.IPv6Prefix > 128:
		return errors.New("ipv6_prefix must be between 1 and 128")
	case c.MaxKeys < 0 || c.MaxKeys > MaxMaxKeys:
		return fmt.Errorf("max_keys must be a whole number from 1 to %d", int64(MaxMaxKeys))
	}
	return nil
}

// Limit is the zone's GCRA limit in nanoseconds; a concurrency or quota zone's
// is its concurrency (adaptive: max) or quota as a burst, so that two
// definitions with different limits differ.
func (c Config) Limit() algorithms.Limit {
	switch {
	case c.IsQuota():
		return algorithms.Limit{EmissionInterval: 1, Burst: c.Quota}
	case c.IsConcurrency(): // Concurrency is 0 in an adaptive zone
		return algorithms.Limit{EmissionInterval: 1, Burst: max(c.Concurrency, c.Adaptive.Max)}
	}
	return algorithms.NewLimit(c.Events, int64(c.Window), c.Burst)
}

// Plan is the zone's literal limit as a Plan.
func (c Config) Plan() (Plan, error) {
	if c.IsQuota() {
		return QuotaPlan(c.Quota), nil
	}
	return NewPlan(c.Events, c.Window, c.Burst)
}

// Key turns the expanded key template into the key the zone stores: an IP
// masked to its prefix; a key longer than MaxKeyLength, or that starts with
// HashedKeyPrefix, hashed.
func (c Config) Key(raw string) string {
	if c.IPv4Prefix > 0 || c.IPv6Prefix > 0 {
		if ip, err := netip.ParseAddr(raw); err == nil {
			bits := c.IPv6Prefix
			if ip.Is4() || ip.Is4In6() {
				ip, bits = ip.Unmap(), c.IPv4Prefix
			}
			if bits > 0 {
				if p, err := ip.Prefix(bits); err == nil {
					return p.String()
				}
			}
		}
	}
	// A raw key that starts like a hashed one is hashed too: "sha256:<hex>"
	// cannot share the long key's bucket.
	if len(raw) > MaxKeyLength || strings.HasPrefix(raw, HashedKeyPrefix) {
		sum := sha256.Sum256([]byte(raw))
		return HashedKeyPrefix + hex.EncodeToString(sum[:])
	}
	return raw
}

// HashedKeyPrefix and the hex SHA-256 make every hashed key (see Key).
const HashedKeyPrefix = "sha256:"

// State is a zone's in-process state, shared by the handlers that define the
// zone the same way; it outlives config reloads.
type State struct {
	Local    *Table         // local mode: TAT (quota zones: count) per key
	Denied   *Table         // with a Store: keys the store denied, until when
	Fallback *Table         // fail_policy local: the same as Local, at this instance's part
	Bans     *Table         // zones with ban: each key's ban and escalation (ban.go); else nil
	wouldBan *Table         // zones with ban in dry run: when each key's would-be ban ends
	forgets  atomic.Uint64  // keys forgotten (reset) so far: see LearnBans
	anyBan   atomic.Bool    // Bans may hold an entry (false: none since the last sweep)
	banMu    sync.Mutex     // orders ban starts with the sweep that clears anyBan
	banCfg   Config         // the zone's ban settings (Ban, BanMax), for Restore
	plans    *plans         // PerRequest zones: the plan each key was last decided under
	charger  charger        // strict mode, post-charged zones: charges in flight
	owed     owed           // fail_policy local: what the fallback admitted, owed to the store
	chargers sync.WaitGroup // the charger's goroutines, once started
	stop     chan struct{}
	done     chan struct{}

	Offenders *topk.Recent // this instance's denials per key, in fixed memory (not max_keys)

	waiting  atomic.Int64 // zones with delay: requests admitted for later, waiting here
	inFlight atomic.Int64 // concurrency zones: requests in flight in this process

	conc     *concurrencyState // concurrency zones only: requests in flight
	adaptive *adaptiveState    // adaptive zones only: each key's limit and requests in flight
	quota    *periodClock      // quota zones only: the period Local and Fallback count
	kind     interface {       // conc or adaptive, whichever is not nil
		sweep(now int64)
		len() int // keys held
	}

	final atomic.Pointer[func(*State)] // SetFinalSnapshot's
}

// SetFinalSnapshot makes Destruct call f (nil: nothing) before the state is
// dropped: a persisted zone's last snapshot. Only the last f set is called.
func (s *State) SetFinalSnapshot(f func(*State)) { s.final.Store(&f) }

// NewState returns an empty state swept every sweepInterval.
func NewState(c Config, sweepInterval time.Duration) *State {
	maxKeys := c.maxKeys()
	s := &State{
		Local:    NewTable(maxKeys),
		Denied:   NewTable(maxKeys),
		Fallback: NewTable(maxKeys),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	s.owed.max = maxKeys
	s.Offenders = topk.NewRecent(topk.DefaultCapacity, int64(OffendersPeriod))
	if c.PerRequest {
		s.plans = newPlans(maxKeys)
	}
	if c.Ban > 0 {
		s.Bans, s.wouldBan = NewTable(maxKeys), NewTable(maxKeys)
		s.banCfg = Config{Ban: c.Ban, BanMax: c.BanMax}
	}
	switch {
	case c.IsAdaptive():
		s.adaptive = newAdaptiveState()
		s.kind = s.adaptive
	case c.IsConcurrency():
		s.conc = newConcurrencyState(maxKeys)
		s.kind = s.conc
	case c.IsQuota():
		s.quota = newPeriodClock(c, func() { s.Local.Clear(); s.Fallback.Clear() })
	}
	go s.sweep(sweepInterval)
	return s
}

func (s *State) sweep(interval time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			now := monotime.Now()
			live := now // a TAT <= now carries nothing; a count of an earlier period neither
			if s.quota != nil {
				live = staleBelow(s.quota.at(now).gen)
			}
			s.Local.Sweep(live)
			s.Denied.Sweep(now)
			s.Fallback.Sweep(live)
			if s.Bans != nil {
				s.sweepBans(now)
				s.wouldBan.Sweep(now)
			}
			if s.plans != nil {
				s.plans.keys.Sweep(now)
			}
			if s.kind != nil {
				s.kind.sweep(now)
			}
		}
	}
}

// Len is the number of keys whose rate state is held; the ban table (bounded
// by max_keys too; see BannedKeys) is not counted.
func (s *State) Len() int {
	n := s.Local.Len() + s.Denied.Len() + s.Fallback.Len() + s.owed.len()
	if s.kind != nil {
		n += s.kind.len()
	}
	return n
}

// Destruct stops the sweeper (caddy.Destructor, for caddy.UsagePool).
func (s *State) Destruct() error {
	close(s.stop)
	<-s.done
	s.chargers.Wait()
	s.charger.fail()
	if f := s.final.Load(); f != nil && *f != nil {
		(*f)(s)
	}
	return nil
}

// Source says who decided.
type Source uint8

const (
	SourceLocal      Source = iota // the in-process table (local mode)
	SourceStore                    // the shared store
	SourceDenyCache                // a denial the store gave earlier, still in force
	SourceFailOpen                 // store unavailable, fail_policy open
	SourceFailClosed               // store unavailable, fail_policy closed
	SourceFailLocal                // store unavailable, fail_policy local
	SourceRecord                   // the store's record of the key in this process (async mode's lease): a peek only
	SourceOverride                 // an operator's override: exempt or deny, nothing consumed
)

// Decision is a zone's verdict on one request. Durations are nanoseconds.
type Decision struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration // > 0 when denied
	ResetAfter time.Duration // until the key is back to its full burst (quota zones: until the period ends)
	Period     time.Duration // quota zones: the length of the period decided in
	Source     Source
	Err        error         // the store's error, when a fail policy decided
	Banned     bool          // denied by a ban, RetryAfter lasting at least to its end
	BanLevel   int           // the ban's level, 0 when unknown
	BanStarted time.Duration // the length of the ban this decision started (dry run: would have)
	Delay      time.Duration // > 0: admitted for later, waiting this long in the zone's queue (Zone.EndWait)
	QueueFull  bool          // denied for a full queue, the turn being within the delay
	Gone       bool          // the client left while waiting for an adaptive zone's place; nothing is held
}

// Zone decides requests for one zone definition, with its state and Store.
type Zone struct {
	Config
	plan    Plan // the literal one
	state   *State
	store   Store
	offers  Offers  // the store's, read once by New
	records Records // offers.Records for a rate zone (its deny cache and fallback live there)
	// banRule is what the zone's rate steps carry: its ban when the store
	// keeps bans and the zone is not in dry run, else zero.
	banRule   BanRule
	overrides *Overrides // nil: the zone takes none

	OnChargeFailed func(error) // when set, hears of each charge the store did not take (strict, after retries)
	// OnBanDropped, when set, hears of the running bans this instance did not
	// keep: not started or learnt for a ban table (max_keys) full of running
	// bans; fromList, pushed off the fleet-wide list (MaxListedBans) by bans
	// that end later (in async mode the other instances do not learn them).
	OnBanDropped func(fromList bool, n int64)
	// Hold and Done, when set, are called for each strict-mode charge queued
	// (Hold) and once it is over (Done, when Hold returned true): the zone's
	// owner keeps its state and store until then.
	Hold func() bool
	Done func()
}

// New returns a zone deciding with state and store (nil: local); c should be
// valid. The store's Offers are read once, here: a store that lacks what the
// zone's kind needs is an error.
func New(c Config, state *State, store Store) (*Zone, error) {
	l := c.Limit()
	plan := Plan{Events: c.Events, Window: c.Window, Burst: l.Burst, limit: l}
	if c.IsQuota() {
		plan = QuotaPlan(c.Quota)
	}
	if c.IsAdaptive() {
		store = nil // per instance by nature (adaptive.go)
	}
	z := &Zone{Config: c, plan: plan, state: state, store: store, offers: Offers{Mode: "local"}}
	if store != nil {
		z.offers = store.Offers()
		switch {
		case c.IsQuota() && !z.offers.Quotas:
			return nil, fmt.Errorf("zone %s: its %s store cannot keep calendar quotas: decide the zone locally or in a region's store", c.Name, z.offers.Mode)
		case c.IsConcurrency() && z.offers.Slots == nil:
			return nil, fmt.Errorf("zone %s: its %s store cannot hold concurrency slots: decide the zone locally or in a region's store", c.Name, z.offers.Mode)
		}
		if z.offers.Records != nil {
			z.offers.Records.SetMaxKeys(c.Name, c.maxKeys())
			if !c.IsQuota() && !c.IsConcurrency() {
				z.records = z.offers.Records
			}
		}
		if z.offers.BanSteps && c.Ban > 0 && !c.DryRun {
			z.banRule = BanRule{First: c.Ban, Max: c.BanMax}
		}
	}
	if state != nil && state.conc != nil {
		state.conc.useMaxKeys(c.maxKeys())
	}
	return z, nil
}

// Plan is the zone's literal limit.
func (z *Zone) Plan() Plan { return z.plan }

func (c Config) maxKeys() int { return int(min(cmp.Or(c.MaxKeys, DefaultMaxKeys), math.MaxInt)) }

// Keys is the number of keys this instance holds for the zone in memory,
// the store's records (async mode) included.
func (z *Zone) Keys() int {
	n := z.state.Len()
	if r := z.offers.Records; r != nil {
		n += r.Keys(z.Name)
	}
	return n
}

func (z *Zone) State() *State { return z.state }

// Store is nil in local mode.
func (z *Zone) Store() Store { return z.store }

// Decide decides a unit-cost request for key at now (monotime) under the
// zone's literal limit.
func (z *Zone) Decide(ctx context.Context, key string, now int64) Decision {
	return z.DecideWith(ctx, key, now, &z.plan, 1)
}

// DecideWith decides a request of cost for key at now under plan p. A denial
// the store gave is answered locally until it ends: a blocked key's flood
// costs the store nothing.
func (z *Zone) DecideWith(ctx context.Context, key string, now int64, p *Plan, cost int64) Decision {
	return z.step(ctx, OpDecide, key, now, p, cost)
}

// step is a rate or quota zone's decide or check: a ban first, then the
// deny cache, then the key's state, here or in the store.
func (z *Zone) step(ctx context.Context, op Op, key string, now int64, p *Plan, cost int64) Decision {
	if z.state.Bans != nil { // the hot path of a zone without ban makes no call
		if d, banned := z.banned(key, now, p); banned {
			return d
		}
	}
	var ahead int64
	if op == OpDecide && z.Delay > 0 {
		ahead = z.ahead()
	}
	var d Decision
	if z.store == nil && z.state.quota == nil && op == OpDecide { // the local hot path, inlined
		d = fromResult(z.state.Local.Decide(key, now, p.limit, cost, ahead), SourceLocal)
	} else if z.store == nil {
		d = z.localStep(false, key, now, p, op, cost, ahead)
	} else if cached, ok := z.cachedStoreDenial(key, now, p); ok {
		z.recordPlan(key, p, now, cached) // decided under p, as a store's answer is
		return cached
	} else {
		if op == OpCheck {
			z.state.charger.wait(ctx, key)
		}
		d = z.storeStep(ctx, op, key, now, p, cost, ahead)
	}
	if z.store == nil && !d.Allowed && z.state.Bans != nil {
		z.banOnDenial(key, now, &d)
	}
	if op == OpDecide && z.Delay > 0 {
		d = z.delayed(ctx, key, now, p, cost, ahead, d)
	}
	z.recordPlan(key, p, now, d)
	return d
}

// storeStep runs a decide or check of key in the store under plan p, with
// the zone's ban rule; an error goes to the fail policy.
func (z *Zone) storeStep(ctx context.Context, op Op, key string, now int64, p *Plan, cost, ahead int64) Decision {
	if z.state.quota != nil {
		return z.storeQuota(ctx, op, key, now, p, cost)
	}
	rep, err := z.store.Rate(ctx, z.Name, key, RateStep{Op: op, Limit: p.limit, Cost: cost, Ahead: ahead, Ban: z.banRule})
	if err != nil {
		return z.failPolicy(err, Decision{Remaining: p.Burst}, func() Decision {
			d := z.fallback(key, now, p, op, cost, ahead)
			if op == OpDecide && d.Allowed {
				z.owe(key, p, cost) // what local admits is owed to the store
			}
			return d
		})
	}
	return z.storeDecision(key, now, rep)
}

// heard notes what the store said of key at now, on every path that asks
// it: a denial is cached until its retry time; under fail_policy local the
// fallback starts from the key's state should the store go away, back to
// full at the same moment on this instance's part (B/N tokens of N·T span
// the same B·T), not with a fresh part.
func (z *Zone) heard(key string, now int64, r algorithms.Result) {
	if z.records != nil {
		return // the store's record of the key holds both
	}
	z.reconcile()
	if !r.Allowed {
		until := now + r.RetryAfter
		if z.Delay > 0 && !z.DryRun {
			until -= int64(z.Delay) // until the key could be admitted for later again
		}
		z.state.Denied.Set(key, until, now)
	}
	if z.FailPolicy != FailLocal {
		return
	}
	if r.ResetAfter > 0 {
		z.state.Fallback.Set(key, now+r.ResetAfter, now)
	} else {
		z.state.Fallback.Delete(key)
	}
}

// CachedDenial answers, without the store, for a key whose store denial
// (or ban) is still in force, under plan p; a zone without a store never does.
func (z *Zone) CachedDenial(key string, now int64, p *Plan) (Decision, bool) {
	if z.store == nil {
		return Decision{}, false
	}
	if d, banned := z.banned(key, now, p); banned {
		return d, true
	}
	d, ok := z.cachedStoreDenial(key, now, p)
	if ok {
		z.recordPlan(key, p, now, d) // as step does: the request was decided under p
	}
	return d, ok
}

// cachedStoreDenial is CachedDenial's deny cache alone, without bans.
func (z *Zone) cachedStoreDenial(key string, now int64, p *Plan) (Decision, bool) {
	if q := z.state.quota; q != nil {
		return z.cachedQuotaDenial(key, now, q.at(now))
	}
	until, ok := z.deniedUntil(key, now)
	if !ok {
		return Decision{}, false
	}
	if z.offers.Denied != nil {
		z.offers.Denied(z.Name, key, p.limit)
	}
	return z.cachedDenial(until, now, p), true
}

// cachedDenial is the denial a rate key's deny cache, held until until,
// gives a request and a read alike.
func (z *Zone) cachedDenial(until, now int64, p *Plan) Decision {
	retry := until - now
	if z.Delay > 0 && !z.DryRun {
		retry += int64(z.Delay) // the cache ends when a request could be admitted for later
	}
	return Decision{
		RetryAfter: time.Duration(retry),
		ResetAfter: time.Duration(retry + (p.limit.Burst-1)*p.limit.EmissionInterval),
		Source:     SourceDenyCache,
	}
}

// failPolicy is the one place the fail policy answers a step of any kind the
// store could not make (err): open allows as open says (the kind's full
// limit); closed denies with a short Retry-After; local runs the kind's own
// step at this instance's part. A charge passes zero and ignores the result.
func (z *Zone) failPolicy(err error, open Decision, local func() Decision) Decision {
	var d Decision
	switch z.FailPolicy {
	case FailOpen:
		d = open
		d.Allowed, d.Source = true, SourceFailOpen
	case FailClosed:
		d = Decision{RetryAfter: FailClosedRetryAfter, ResetAfter: FailClosedRetryAfter, Period: open.Period, Source: SourceFailClosed}
	default:
		d = local()
		d.Source = SourceFailLocal
	}
	d.Err = err
	return d
}

// deniedUntil is when the store's last denial of key ends, if in force.
func (z *Zone) deniedUntil(key string, now int64) (int64, bool) {
	if z.records != nil {
		return z.records.DeniedUntil(z.Name, key, now)
	}
	return z.state.Denied.Get(key, now)
}

// fallback runs one step of fail_policy local at this instance's part: in the
// Fallback table, or in key's record (async mode), which owes what it admits.
func (z *Zone) fallback(key string, now int64, p *Plan, op Op, cost, ahead int64) Decision {
	if z.records != nil {
		return fromResult(z.records.Fallback(z.Name, key, now, p.limit, z.localLimit(p, true), op, cost, ahead), SourceFailLocal)
	}
	return z.localStep(true, key, now, p, op, cost, ahead)
}

// localStep runs op for key under p in Local at the plan's limit, or in
// Fallback at this instance's part; a quota zone counts in now's period.
func (z *Zone) localStep(fallback bool, key string, now int64, p *Plan, op Op, cost, ahead int64) Decision {
	t, src := z.state.Local, SourceLocal
	if fallback {
		t, src = z.state.Fallback, SourceFailLocal
	}
	l := z.localLimit(p, fallback)
	if c := z.state.quota; c != nil {
		pn := c.at(now)
		return pn.decision(t.quotaStep(key, pn.gen, op, algorithms.Quota{Limit: l.Burst}, cost), now, src)
	}
	var r algorithms.Result
	switch op {
	case OpCheck, OpPeek:
		r = t.Peek(key, now, l)
	case OpCharge:
		r = t.Charge(key, now, l, cost)
	case OpRefund:
		t.Refund(key, now, l, cost)
	default:
		r = t.Decide(key, now, l, cost, ahead)
	}
	return fromResult(r, src)
}

// localLimit is what localStep counts against: p's limit or (fallback) this
// instance's part, events/N and burst/N, at least 1 (N = live instances last
// seen); a quota zone's quota as a burst, no interval (a quota of 0 stays 0).
func (z *Zone) localLimit(p *Plan, fallback bool) algorithms.Limit {
	n := int64(1)
	if fallback {
		n = int64(max(1, z.store.Instances()))
	}
	switch {
	case z.state.quota != nil:
		return algorithms.Limit{Burst: min(p.Events, max(1, p.Events/n))}
	case !fallback:
		return p.limit
	}
	return algorithms.NewLimit(max(1, p.Events/n), int64(p.Window), max(1, p.Burst/n))
}

// RefundWith gives back cost of a request allowed under p, to whoever decided
// it, and returns the decision as it stands after, for the headers.
func (z *Zone) RefundWith(ctx context.Context, key string, now int64, d Decision, p *Plan, cost int64) (Decision, error) {
	l := z.localLimit(p, d.Source == SourceFailLocal)
	switch d.Source {
	case SourceLocal:
		z.localStep(false, key, now, p, OpRefund, cost, 0)
	case SourceFailLocal:
		z.fallback(key, now, p, OpRefund, cost, 0)
		z.owe(key, p, -cost)
	case SourceStore:
		var err error
		if q := z.state.quota; q != nil {
			_, err = z.store.Quota(ctx, z.Name, key, QuotaStep{Op: OpRefund, Limit: QuotaLimit{Limit: p.Events, Periods: &q.at(now).periods}, Cost: cost})
		} else {
			_, err = z.store.Rate(ctx, z.Name, key, RateStep{Op: OpRefund, Limit: l, Cost: cost})
		}
		if err != nil {
			return d, err
		}
	default:
		return d, nil
	}
	d.Remaining = min(d.Remaining+cost, l.Burst)
	d.ResetAfter = max(0, d.ResetAfter-time.Duration(cost*l.EmissionInterval))
	return d, nil
}

// LastPlan is the plan key was last decided under: an override's, a
// PerRequest zone's memory, else the zone's literal one.
func (z *Zone) LastPlan(key string, now int64) Plan {
	if o := z.Override(key); o != nil && !o.Exempt && !o.Deny {
		return o.Plan
	}
	if z.state.plans != nil {
		if p, ok := z.state.plans.last(key, now); ok {
			return p
		}
	}
	return z.plan
}

// PeekStore reports key's state as the store holds it, consuming nothing, or
// ErrUnknownKey: in async mode the fleet's view, every instance's leases
// spent, what was admitted since the last sync not (Read gives the record).
func (z *Zone) PeekStore(ctx context.Context, key string, now int64) (Decision, error) {
	d, err := z.peekStore(ctx, key, z.LastPlan(key, now).limit)
	if err != nil {
		return Decision{}, err
	}
	return z.peeked(key, now, d)
}

func (z *Zone) peekStore(ctx context.Context, key string, l algorithms.Limit) (Decision, error) {
	rep, err := z.store.Rate(ctx, z.Name, key, RateStep{Op: OpPeek, Limit: l, Cost: 1, Ban: z.banRule})
	if err != nil {
		return Decision{}, err
	}
	d := fromResult(rep.Result, SourceStore)
	if rep.Ban.Banned {
		z.withBan(&d, time.Duration(rep.RetryAfter), rep.Ban.Level)
	}
	return d, nil
}

// peeked adds the zone's own ban of key to a peek's d, or says it has no state.
func (z *Zone) peeked(key string, now int64, d Decision) (Decision, error) {
	if z.state.Bans != nil && z.banRule == (BanRule{}) {
		if b, ok := z.BanOf(key, now); ok {
			z.withBan(&d, b.Left, b.Level)
		}
	}
	if d.ResetAfter <= 0 {
		return Decision{}, ErrUnknownKey
	}
	return d, nil
}

// Mode is "local" without a store, else the store's mode.
func (z *Zone) Mode() string { return z.offers.Mode }

// Reset forgets key here and in the store, which tells the other instances
// (see Forget).
func (z *Zone) Reset(ctx context.Context, key string) error {
	z.Forget(key)
	if z.store == nil {
		return nil
	}
	if z.state.quota != nil {
		_, err := z.store.Quota(ctx, z.Name, key, QuotaStep{Op: OpReset})
		return err
	}
	if l := z.offers.BanList; l != nil && z.state.Bans != nil {
		// Off the list first: an instance that reads it (async mode)
		// after hearing of the reset must not find the ban there.
		if err := l.LiftBan(ctx, z.Name, key); err != nil {
			return err
		}
	}
	_, err := z.store.Rate(ctx, z.Name, key, RateStep{Op: OpReset})
	return err
}

// Forget drops what this instance holds about key, also when another
// instance resets it.
func (z *Zone) Forget(key string) {
	z.state.forgets.Add(1)
	if z.state.Bans != nil {
		z.state.Bans.Delete(key)
		z.state.wouldBan.Delete(key)
	}
	z.state.Local.Delete(key)
	z.state.Denied.Delete(key)
	z.state.Fallback.Delete(key)
	if z.state.plans != nil {
		z.state.plans.keys.Delete(key)
	}
}

// ForgetDenials drops every cached denial, for a store that may have missed
// resets: the cache is only a shortcut. Known bans stay (a store that comes
// back empty lost them, and a ban holds through an outage); a lift missed
// meanwhile keeps the key banned here until its ban ends or is lifted again.
func (z *Zone) ForgetDenials() {
	z.state.Denied.Clear()
}

// Denies reports whether a unit-cost request of key would be denied at now
// (monotime) under its last plan, with no store call: by an override, a ban
// known here, a local zone's table, else the deny cache (a distributed
// zone's denial is seen once a request of the key was denied here). It
// consumes nothing and costs one lookup: deny_while asks it for every new
// connection. A concurrency zone never denies here: its slots free as
// requests end, not with time.
func (z *Zone) Denies(key string, now int64) bool {
	if o := z.Override(key); o != nil && (o.Exempt || o.Deny) {
		return o.Deny
	}
	if z.IsConcurrency() {
		return false
	}
	if _, _, banned := z.banIn(key, now); banned {
		return true
	}
	if z.store == nil {
		p := z.LastPlan(key, now)
		d := z.localStep(false, key, now, &p, OpPeek, 1, 0)
		// A zone with delay admits for later what is at most its delay away.
		return !d.Allowed && (z.Delay == 0 || z.DryRun || d.RetryAfter > z.Delay)
	}
	_, denied := z.deniedUntil(key, now)
	return denied
}

// ErrUnknownKey is PeekStore's for a key with no state.
var ErrUnknownKey = errors.New("no state for this key")

func fromResult(r algorithms.Result, src Source) Decision {
	return Decision{
		Allowed:    r.Allowed,
		Remaining:  r.Remaining,
		RetryAfter: time.Duration(r.RetryAfter),
		ResetAfter: time.Duration(r.ResetAfter),
		Source:     src,
		Delay:      time.Duration(r.Delay),
	}
}
