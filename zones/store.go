package zones

import (
	"context"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Store is a zone's shared state, which several Caddy instances decide
// against (Redis, in package distributed). It offers one operation per zone
// kind, the step as data: Rate for rate zones, Quota for quota zones
// (concurrency zones take slots, see Slots). What else it offers it says
// once, in Offers, which New reads: a zone never asks its store what it is
// afterwards, and a zone whose store lacks what it needs is refused.
//
// What a zone may assume of every Store, and the conformance suite in
// tests/ checks:
//   - each step is atomic for its key: concurrent steps of one key, from any
//     instance, are serialised;
//   - the store's clock decides (Redis TIME): limits and results are in
//     nanoseconds and a store converts to its own unit, rounding the
//     emission interval down to it;
//   - a step that returns an error changed nothing the zone must undo; the
//     zone's fail policy answers it;
//   - every key the store writes expires once it carries no information.
type Store interface {
	// Rate runs one step of a rate zone's GCRA for key (see RateStep).
	Rate(ctx context.Context, zone, key string, s RateStep) (RateReply, error)
	// Quota runs one step of a quota zone's counter for key in the period
	// of s.Limit.Periods that holds the store's now (see QuotaStep).
	Quota(ctx context.Context, zone, key string, s QuotaStep) (QuotaResult, error)
	// Instances is the number of live instances sharing the store that this
	// instance last saw (at least 1), used to split a zone's limit among
	// them under fail_policy local.
	Instances() int
	// Offers says what the store offers besides Rate and Quota.
	Offers() Offers
}

// Op is what a store step does to a key's state.
type Op uint8

// The steps, mirroring algorithms.Limit's methods (and algorithms.Quota's).
const (
	// OpDecide admits cost if the key has it, admitting for later up to
	// the step's Ahead, and starting the step's ban on a denial.
	OpDecide Op = iota
	// OpCheck is a post-charged zone's check before the request: allowed
	// unless the key has nothing left; it consumes nothing (but may start
	// the step's ban).
	OpCheck
	// OpCharge adds cost after the response, past the burst if need be
	// (algorithms.Limit.Charge), and reports the key as it stands.
	OpCharge
	// OpRefund gives cost back (algorithms.Limit.Refund); its reply means
	// nothing.
	OpRefund
	// OpPeek reports the key's state, with its ban, for the admin API:
	// it consumes and starts nothing, and may bypass batching.
	OpPeek
	// OpReset deletes the key's state and tells the other instances,
	// which forget what they hold of it; its reply means nothing.
	OpReset
)

// RateStep is one step of a rate zone's key.
type RateStep struct {
	Op    Op
	Limit algorithms.Limit
	Cost  int64
	// Ahead > 0 (OpDecide): a request whose allow time is at most Ahead
	// (ns) away is admitted for later, its turn reserved in the same step
	// (the reply's Delay), so that across instances the key is served at
	// its rate, each reservation spaced by the emission interval.
	Ahead int64
	// Ban, when set (OpDecide, OpCheck, OpPeek, on a store whose Offers
	// say BanSteps): a banned key is denied until the ban's end, and a
	// denial starts the ban in the same atomic step. Zero: a plain step.
	Ban BanRule
}

// RateReply is a store's answer to a rate step. Only RetryAfter,
// ResetAfter, Remaining, Allowed and Delay of the result are meaningful
// (the TAT lives in the store, on the store's clock).
type RateReply struct {
	algorithms.Result
	Ban StoreBan // a step with a ban rule: the key's ban
}

// QuotaStep is one step of a quota zone's key. Cost is ignored by OpCheck,
// OpPeek and OpReset.
type QuotaStep struct {
	Op    Op
	Limit QuotaLimit
	Cost  int64
}

// Offers is what a store offers besides its steps, fixed for its life.
type Offers struct {
	// Mode is "strict" or "async", for the admin API and the metrics.
	Mode string
	// BanSteps: rate steps keep a zone's bans in the store with its
	// decisions (strict mode). Without, a zone's bans are its own,
	// listed for the other instances through BanList.
	BanSteps bool
	// Quotas: Quota steps are offered (a store that does not offer them
	// is refused for quota zones).
	Quotas bool
	// Records, when not nil: the store keeps a record of each key of a
	// rate zone in this process (async mode), which holds the key's deny
	// cache and its fail_policy local state.
	Records Records
	// BanList, when not nil: the store lists a zone's bans fleet-wide.
	BanList BanList
	// Slots, when not nil: the store holds concurrency slots.
	Slots Slots
	// Overrides, when not nil: the store keeps zones' overrides
	// fleet-wide (see OverrideStore); a zone without keeps them in the
	// instance.
	Overrides *OverrideStore
	// Denied, when not nil, hears of each denial of a rate zone's key at
	// limit that the deny cache answered without the store (a scope
	// global zone's region counts it as demand).
	Denied func(zone, key string, limit algorithms.Limit)
}

// Records are the per-key records a store keeps in this process (async
// mode's leases): the zone caps them at its max_keys and counts them among
// its keys. A rate zone keeps its deny cache and its fail_policy local
// state in the same record, so that max_keys bounds one structure and a key
// counts once.
type Records interface {
	// SetMaxKeys caps the records kept for zone at n.
	SetMaxKeys(zone string, n int)
	// Keys is the number of records kept for zone.
	Keys(zone string) int
	// DeniedUntil is the deny cache kept in key's record: when the
	// store's last denial of key ends (monotime), if it is in force at now.
	DeniedUntil(zone, key string, now int64) (until int64, ok bool)
	// Fallback runs one step of fail_policy local for key at now: op
	// (OpDecide, OpCheck, OpCharge or OpRefund) of cost at part, this
	// instance's part of limit, in key's record, starting from what the
	// record last heard from the store (a fresh part for a key it has no
	// record of). What it admits or charges is owed to the store: the
	// next sync that succeeds counts it there. OpDecide admits for later
	// up to ahead (ns; 0: not at all).
	Fallback(zone, key string, now int64, limit, part algorithms.Limit, op Op, cost, ahead int64) algorithms.Result
	// Peek is what key's record would decide for a unit-cost request at
	// now under limit, consuming nothing (the admin API's read: what the
	// next request on this instance gets). ok is false when the next
	// request would not be decided from the record alone: there is none
	// (it gets a fresh share), or it must first hear from the store (a
	// dormant record the request wakes).
	Peek(zone, key string, now int64, limit algorithms.Limit) (r algorithms.Result, ok bool)
}

// BanList lists a zone's bans fleet-wide, in a bounded structure updated
// when a ban starts or is lifted.
type BanList interface {
	// RecordBan adds key's ban, left to run, to zone's list without
	// waiting; longest bounds every ban of the zone. The list is bounded
	// (MaxListedBans, the longest-lasting kept): dropped is called with
	// the number of running bans the write pushed off it, when any.
	RecordBan(zone, key string, left, longest time.Duration, level int, dropped func(n int64))
	// LiftBan takes key off zone's list.
	LiftBan(ctx context.Context, zone, key string) error
	// ListBans lists zone's current bans, longest left first.
	ListBans(ctx context.Context, zone string) ([]Ban, error)
}

// Slots are concurrency slots in a store (see concurrency.go).
type Slots interface {
	// Acquire takes a slot of key in zone when fewer than limit live slots
	// are held, and returns its id ("" when denied) and the live slots held
	// after the call. The slot expires after lease unless the store renews
	// it, which it does until Release.
	Acquire(ctx context.Context, zone, key string, limit int64, lease time.Duration) (slot string, inUse int64, err error)
	// Release frees the slot. It must not wait for the store: the response
	// path calls it.
	Release(zone, key, slot string)
	// Slots returns the live slots held for key in zone.
	Slots(ctx context.Context, zone, key string) (int64, error)
}

// BanRule is a zone's ban: its first length and, when longer, the longest
// an escalated ban lasts.
type BanRule struct {
	First, Max time.Duration
}

// StoreBan is what a store says of a key in a step with a ban rule: whether
// the key is banned (the result's RetryAfter then lasts at least to the
// ban's end), the ban's level, and whether this step started it.
type StoreBan struct {
	Banned, Started bool
	Level           int
}
