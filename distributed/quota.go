package distributed

// Strict mode's calendar quotas: each step is a quota.lua step, batched
// with the GCRA steps.

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

//go:embed quota.lua
var quotaScript string

// QuotaKey is the Redis key of key's count in quota zone zone, in both
// modes: <key_prefix><zone>.quota:<key> (zone names have no '.').
func (c *link) QuotaKey(zone, key string) string {
	return c.opts.KeyPrefix + zone + ".quota:" + key
}

// Quota runs one step of a quota zone's key (zones.Store) in the period of
// Redis TIME, through the batcher but for a peek. A charge counts from at
// most the limit (the debt is at most one charge).
func (s *Strict) Quota(ctx context.Context, zone, key string, st zones.QuotaStep) (zones.QuotaResult, error) {
	var op any // a constant: converting a variable would allocate
	switch st.Op {
	case zones.OpDecide:
		op = string(OpDecide)
	case zones.OpRefund:
		op = string(OpRefund)
	case zones.OpCheck, zones.OpPeek:
		op, st.Cost = string(OpPeek), 0
	case zones.OpCharge:
		op = string(OpCharge)
	case zones.OpReset:
		return zones.QuotaResult{}, s.reset(ctx, s.QuotaKey(zone, key), zone, key)
	default:
		return zones.QuotaResult{}, fmt.Errorf("distributed: unknown quota op %d", st.Op)
	}
	rep, err := s.run(ctx, s.quota, zone, s.QuotaKey(zone, key), st.Op == zones.OpPeek, [5]any{"", st.Limit.Periods.Arg, st.Limit.Limit, st.Cost, op})
	return rep.quota, err
}

// peekQuota reads key's count in zone, in either mode (leases count as used).
func (c *link) peekQuota(ctx context.Context, zone, key string, q zones.QuotaLimit) (zones.QuotaResult, error) {
	rep, err := c.run(ctx, c.quota, zone, c.QuotaKey(zone, key), true, [5]any{"", q.Periods.Arg, q.Limit, int64(0), string(OpPeek)})
	return rep.quota, err
}

// parseQuotaStep reads one key's {u, to_end, period} of quota.lua.
func parseQuotaStep(a []any) reply {
	u, ok := a[0].(int64)
	toEnd, ok2 := a[1].(int64)
	period, ok3 := a[2].(int64)
	if !ok || !ok2 || !ok3 {
		return reply{err: errBadReply}
	}
	if err := quotaErr(period, toEnd); err != nil {
		return reply{err: err}
	}
	r := zones.QuotaResult{Allowed: u >= 0, Used: u, ToEnd: time.Duration(toEnd) * time.Microsecond, Period: int(period)}
	if u < 0 {
		r.Used = -u - 1
	}
	return reply{quota: r}
}

// quotaErr is the error in a quota script's period (both modes' codes): -1
// Redis's clock (now, µs) outside the periods, -2 and -3 a foreign value.
func quotaErr(period, now int64) error {
	switch period {
	case -1:
		return clockError{&zones.QuotaClockError{Now: time.UnixMicro(now)}}
	case -2:
		return errForeignType
	case -3:
		return errForeignQuota
	case 0, 1, 2:
		return nil
	}
	return errBadReply
}

// clockError is a zones.QuotaClockError as a redis.Error: not an outage.
type clockError struct{ err *zones.QuotaClockError }

func (e clockError) Error() string { return e.err.Error() }
func (e clockError) Unwrap() error { return e.err }
func (clockError) RedisError()     {}

// errForeignQuota: a quota key held a hash tally did not write.
const errForeignQuota = scriptError("TALLYFOREIGN a hash that is not a quota count was at a tally quota key; deleted")
