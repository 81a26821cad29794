package zones

import (
	"context"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Store is a zone's shared state, which several Caddy instances decide
// against (Redis, in package distributed): one step per zone kind, as data
// (concurrency zones take Slots); what else it offers it says once, in Offers.
// What a zone may assume of every Store, and tests/' conformance suite checks:
//   - each step is atomic for its key: concurrent steps of one key, from any
//     instance, are serialised;
//   - the store's clock decides (Redis TIME): limits and results are in
//     nanoseconds and a store converts to its own unit, rounding the
//     emission interval down to it;
//   - a step that returns an error changed nothing the zone must undo; the
//     zone's fail policy answers it;
//   - every key the store writes expires once it carries no information.
type Store interface {
	Rate(ctx context.Context, zone, key string, s RateStep) (RateReply, error)
	// Quota runs a step in the period of s.Limit.Periods that holds the
	// store's now.
	Quota(ctx context.Context, zone, key string, s QuotaStep) (QuotaResult, error)
	// Instances is the number of live instances sharing the store that this
	// instance last saw (at least 1), among which fail_policy local splits
	// a zone's limit.
	Instances() int
	Offers() Offers
}

// Op is what a store step does to a key's state: algorithms.Limit's (and
// Quota's) methods.
type Op uint8

const (
	// OpDecide admits cost if the key has it, for later up to the step's
	// Ahead, and starts the step's ban on a denial.
	OpDecide Op = iota
	OpCheck     // a post-charged zone's check: consumes nothing (may start the ban)
	OpCharge    // adds cost after the response, past the burst if need be; reports the key after
	OpRefund    // its reply means nothing
	// OpPeek reports the key's state, with its ban, for the admin API: it
	// consumes and starts nothing, and may bypass batching.
	OpPeek
	OpReset // deletes the key's state and tells the other instances; its reply means nothing
)

// RateStep is one step of a rate zone's key.
type RateStep struct {
	Op    Op
	Limit algorithms.Limit
	Cost  int64
	// Ahead > 0 (OpDecide): a request whose allow time is at most Ahead ns
	// away is admitted for later, its turn reserved in the same step (the
	// reply's Delay): across instances the key is served at its rate.
	Ahead int64
	// Ban, when set (on a store whose Offers say BanSteps): a banned key
	// is denied until the ban's end, and a denial starts the ban in the
	// same atomic step.
	Ban BanRule
}

// RateReply is a store's answer to a rate step; the result's TAT means
// nothing (it lives in the store, on the store's clock).
type RateReply struct {
	algorithms.Result
	Ban StoreBan // a step with a ban rule: the key's ban
}

// QuotaStep is one step of a quota zone's key (Cost: OpDecide, OpCharge, OpRefund).
type QuotaStep struct {
	Op    Op
	Limit QuotaLimit
	Cost  int64
}

// Offers is what a store offers besides its steps, fixed for its life.
type Offers struct {
	Mode string // "strict" or "async"
	// BanSteps: rate steps keep a zone's bans in the store (strict mode).
	// Without, a zone's bans are its own, listed through BanList.
	BanSteps bool
	Quotas   bool // Quota steps are offered
	// The rest, when not nil: Records are kept per rate zone key (async
	// mode); the store lists bans, holds concurrency slots, keeps
	// overrides fleet-wide; Denied hears of each denial the deny cache
	// answered without the store (a scope global zone counts it as demand).
	Records   Records
	BanList   BanList
	Slots     Slots
	Overrides *OverrideStore
	Denied    func(zone, key string, limit algorithms.Limit)
}

// Records are the per-key records a store keeps in this process (async
// mode's leases), holding a rate zone's deny cache and fail_policy local
// state too: max_keys bounds one structure and a key counts once.
type Records interface {
	SetMaxKeys(zone string, n int)
	Keys(zone string) int
	// DeniedUntil is the deny cache kept in key's record (monotime).
	DeniedUntil(zone, key string, now int64) (until int64, ok bool)
	// Fallback runs one step of fail_policy local: op of cost at part, this
	// instance's part of limit, in key's record, from what it last heard
	// from the store (a fresh part without). What it admits or charges is
	// owed, counted by the next sync that succeeds. OpDecide admits for
	// later up to ahead (ns).
	Fallback(zone, key string, now int64, limit, part algorithms.Limit, op Op, cost, ahead int64) algorithms.Result
	// Peek is what key's record would decide for a unit-cost request,
	// consuming nothing; false when the record alone would not decide (none,
	// or a dormant one that must first hear from the store).
	Peek(zone, key string, now int64, limit algorithms.Limit) (r algorithms.Result, ok bool)
}

// BanList lists a zone's bans fleet-wide, bounded, updated as bans start or lift.
type BanList interface {
	// RecordBan adds key's ban, left to run, without waiting; longest bounds
	// the zone's bans. The list keeps the MaxListedBans longest-lasting:
	// dropped hears of running bans the write pushed off, when any.
	RecordBan(zone, key string, left, longest time.Duration, level int, dropped func(n int64))
	LiftBan(ctx context.Context, zone, key string) error
	// ListBans lists zone's current bans, longest left first.
	ListBans(ctx context.Context, zone string) ([]Ban, error)
}

// Slots are concurrency slots in a store (see concurrency.go).
type Slots interface {
	// Acquire takes a slot of key when fewer than limit live slots are held,
	// returning its id ("" when denied) and the live slots held after. The
	// store renews it until Release; else it expires after lease.
	Acquire(ctx context.Context, zone, key string, limit int64, lease time.Duration) (slot string, inUse int64, err error)
	// Release frees the slot without waiting for the store.
	Release(zone, key, slot string)
	Slots(ctx context.Context, zone, key string) (int64, error)
}

// BanRule is a zone's ban: its first length and, when longer, an escalated
// ban's longest.
type BanRule struct {
	First, Max time.Duration
}

// StoreBan is a step's word on key's ban: banned (the result's RetryAfter
// lasting at least to its end), its level, and whether this step started it.
type StoreBan struct {
	Banned, Started bool
	Level           int
}
