package zones

import (
	"context"

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
