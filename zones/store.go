package zones

import (
	"context"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// Store is a shared GCRA state that several Caddy instances decide against
// (Redis, in package distributed). A zone with a Store asks it for every
// decision it cannot answer from its local deny cache, and applies its fail
// policy when the Store returns an error.
//
// Limits and results are in nanoseconds; a Store converts to its own unit.
type Store interface {
	// Decide runs one GCRA step for key in zone atomically in the store.
	// Only RetryAfter, ResetAfter, Remaining and Allowed of the result are
	// meaningful (the TAT lives in the store, on the store's clock).
	Decide(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error)
	// Refund gives back cost for key (see algorithms.Limit.Refund).
	Refund(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) error
	// Peek reports the key's state without consuming anything (the admin
	// API).
	Peek(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error)
	// Check is Peek on the request path: a post-charged zone's check
	// before the request, allowed unless the key has no quota left.
	Check(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error)
	// Charge adds cost to the key after the response, past the burst if
	// need be (see algorithms.Limit.Charge), and reports the key as it
	// stands afterwards.
	Charge(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error)
	// Reset deletes the key's state in the store.
	Reset(ctx context.Context, zone, key string) error
	// Instances is the number of live instances sharing the store that this
	// instance last saw (at least 1), used to split a zone's limit among
	// them under fail_policy local.
	Instances() int
}

// What a Store may offer besides Store. A zone asks its store for each
// when it needs it; each implementation in package distributed asserts the
// ones it offers at compile time, so that a renamed method breaks the
// build instead of quietly reading as absent.

// RecordStore is a Store that keeps records of keys in this process (async
// mode's leases, package distributed's Async): the zone caps them at its
// max_keys and counts them among its keys. A rate zone keeps its deny cache
// and its fail_policy local state in the same record, so that max_keys
// bounds one structure and a key counts once.
type RecordStore interface {
	// SetMaxKeys caps the records kept for zone at n.
	SetMaxKeys(zone string, n int)
	// Keys is the number of records kept for zone.
	Keys(zone string) int
	// DeniedUntil is the deny cache kept in key's record: when the
	// store's last denial of key ends (monotime), if it is in force at now.
	DeniedUntil(zone, key string, now int64) (until int64, ok bool)
	// Fallback runs one step of fail_policy local for key at now: op of
	// cost at share, this instance's share of limit, in key's record,
	// starting from what the record last heard from Redis (a fresh share
	// for a key it has no record of). What it admits or charges is owed
	// to Redis: the next sync that succeeds counts it there.
	// FallbackDecide admits for later up to ahead (ns; 0: not at all).
	Fallback(zone, key string, now int64, limit, share algorithms.Limit, op FallbackOp, cost, ahead int64) algorithms.Result
}

// FallbackOp is what a fail_policy local step does to the key's state.
type FallbackOp uint8

// The fallback's steps, mirroring algorithms.Limit's methods.
const (
	FallbackDecide FallbackOp = iota
	FallbackPeek
	FallbackCharge
	FallbackRefund
)

// ModeStore is a Store that names its mode (the admin API's and the
// metrics' "strict" or "async"); a Store that does not is "strict".
type ModeStore interface {
	Mode() string
}

// BanStore is a Store that keeps a zone's bans with its decisions (strict
// mode): a denial starts the ban in the same atomic step, and a banned key
// is denied by every instance from its next decision on.
type BanStore interface {
	// DecideBan is Decide in a zone with ban rule.
	DecideBan(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64, rule BanRule) (algorithms.Result, StoreBan, error)
	// CheckBan is Check in a zone with ban rule.
	CheckBan(ctx context.Context, zone, key string, limit algorithms.Limit, rule BanRule) (algorithms.Result, StoreBan, error)
	// PeekBan is Peek with the key's ban (the admin API).
	PeekBan(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, StoreBan, error)
}

// BanRule is a zone's ban: its first length and, when longer, the longest
// an escalated ban lasts.
type BanRule struct {
	First, Max time.Duration
}

// StoreBan is what a BanStore says of a denial: whether the key is banned
// (the result's RetryAfter then lasts at least to the ban's end), the ban's
// level, and whether this step started it.
type StoreBan struct {
	Banned, Started bool
	Level           int
}

// BanLister is a Store that lists a zone's bans fleet-wide, in a bounded
// structure updated when a ban starts or is lifted.
type BanLister interface {
	// RecordBan adds key's ban, left to run, to zone's list without
	// waiting; longest bounds every ban of the zone.
	RecordBan(zone, key string, left, longest time.Duration, level int)
	// LiftBan takes key off zone's list.
	LiftBan(ctx context.Context, zone, key string) error
	// ListBans lists zone's current bans, longest left first.
	ListBans(ctx context.Context, zone string) ([]Ban, error)
}
