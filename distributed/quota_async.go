package distributed

// Async mode's calendar quotas (zones.Store.Quota): leases taken from the
// period's count in Redis, spent in-process, never past the period's end
// (docs/async.md, quota_async.lua).

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

//go:embed quota_async.lua
var quotaAsyncLua string

var quotaAsyncScript = redis.NewScript(quotaAsyncLua)

// quotaLeaseDivisor bounds a lease to ⌈limit/(16·N)⌉ units beyond what the
// request needs, and the instance's fair share of what is left: an instance
// that dies with its lease loses the fleet at most 1/16 of the period's
// quota, and a busy key costs one call per instance per 1/(16N) of it.
const quotaLeaseDivisor = 16

// quotaRecord is one instance's lease for one key, guarded by its shard.
type quotaRecord struct {
	end     int64 // µs: the end of the period the record counts
	endMono int64 // monotime by which its lease is spent: the period's end, early by a round trip at most
	// used: what this instance admitted in the period; held: what Redis
	// counts for it (used and lease) at the last reply; room: what the
	// fleet had left besides. used > held is a debt the next sync reports.
	used, held, room int64
	known            bool             // used is Redis's view too (else the first report takes Redis's)
	resend           bool             // a report went unanswered: Redis may count more than held
	active           bool             // decided since the last sync; an idle record hands its lease back
	blockedUntil     int64            // monotime: the fleet had nothing left; denied locally until then
	taking           chan struct{}    // closed when a call in flight for the record ends
	q                zones.QuotaLimit // the last step's, for the syncs
}

// quotaReport is what one quota_async.lua call says for a record.
type quotaReport struct {
	q                            zones.QuotaLimit // the record's as the report was taken
	end, used, extra, keep, want int64            // quota_async.lua's ARGV[5..9]
	usedAt                       int64            // the record's used when the report was taken
}

type quotaAsyncReply struct {
	held, used, counted int64
	toEnd               time.Duration
	period              int
}

// Quota runs one step of a quota zone's key (zones.Store) on this
// instance's lease, taking a lease from Redis (one call, on the request
// path) when a decide or check finds too little. A charge counts from at
// most the lease: the debt past it is at most one charge, reported at the
// next sync. A peek reads the fleet's count in Redis.
func (a *Async) Quota(ctx context.Context, zone, key string, st zones.QuotaStep) (zones.QuotaResult, error) {
	q, need, consume := st.Limit, st.Cost, true
	switch st.Op {
	case zones.OpCheck:
		need, consume = 1, false
	case zones.OpPeek:
		return a.peekQuota(ctx, zone, key, q)
	case zones.OpReset:
		a.forgetRecord(zone, key)
		return zones.QuotaResult{}, a.reset(ctx, a.QuotaKey(zone, key), zone, key)
	case zones.OpDecide, zones.OpCharge, zones.OpRefund:
	default:
		return zones.QuotaResult{}, fmt.Errorf("distributed: unknown quota op %d", st.Op)
	}
	if a.isClosed() {
		return zones.QuotaResult{}, ErrClosed
	}
	z := a.zone(zone)
	s := z.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st.Op {
	case zones.OpRefund:
		if r := s.q[key]; r != nil {
			r.used = max(0, r.used-st.Cost)
		}
		return zones.QuotaResult{}, nil
	case zones.OpCharge:
		now := monotime.Now()
		r := a.quotaRecordFor(z, s, key, q, now)
		if r.known {
			r.used = min(r.used, r.held) + st.Cost
		} else {
			r.used += st.Cost // Redis adds it to what it holds for the instance
		}
		r.active = true
		return r.result(now, q, r.held-r.used >= 1), nil
	}
	took := false // a decide or check takes a lease at most once
	for range 4 { // a take of our own, and waits for calls in flight
		now := monotime.Now()
		r := a.quotaRecordFor(z, s, key, q, now)
		r.active = true
		if r.known && r.held-r.used >= need || need == 0 {
			if consume {
				r.used += need
			}
			return r.result(now, q, true), nil
		}
		if r.taking != nil {
			if err := s.await(ctx, r.taking); err != nil {
				return zones.QuotaResult{}, err
			}
			continue
		}
		if took || r.known && now < r.blockedUntil {
			return r.result(now, q, false), nil
		}
		took = true
		n := int64(a.Instances())
		want := need + (q.Limit+quotaLeaseDivisor*n-1)/(quotaLeaseDivisor*n)
		if err := a.takeQuota(ctx, zone, s, key, r, want); err != nil {
			return zones.QuotaResult{}, err
		}
	}
	r := s.q[key]
	if r == nil {
		return zones.QuotaResult{}, ErrTimeout
	}
	return r.result(monotime.Now(), q, false), nil
}

// quotaRecordFor returns key's record, started afresh when there is none or
// its period is over.
func (a *Async) quotaRecordFor(z *asyncZone, s *asyncShard, key string, q zones.QuotaLimit, now int64) *quotaRecord {
	r := s.q[key]
	if r != nil && (now < r.endMono || r.taking != nil) {
		r.q = q
		return r
	}
	end := q.Periods.Bounds[2]
	fresh := &quotaRecord{end: end, endMono: now + (end-time.Now().UnixMicro())*1000, q: q}
	if r == nil {
		insert(z, s.q, key, fresh)
	} else {
		s.q[key] = fresh
	}
	return fresh
}

// takeQuota reports r and takes a lease of up to want units, s unlocked for
// the call: requests for the key meanwhile wait, or spend what r keeps.
func (a *Async) takeQuota(ctx context.Context, zone string, s *asyncShard, key string, r *quotaRecord, want int64) error {
	st := r.report(want, max(0, r.held-r.used))
	rkey := a.QuotaKey(zone, key)
	sent := monotime.Now()
	var rep quotaAsyncReply
	var err error
	s.unlocked(&r.taking, func() {
		err = a.unbatched(ctx, rkey, func(ctx context.Context) (err error) {
			rep, err = parseQuotaAsync(quotaAsyncScript.Run(ctx, a.client, []string{rkey}, a.quotaArgs(st)...))
			return err
		})
	})
	if err != nil {
		a.problems.note(zone, err)
		if s.q[key] == r {
			r.resend = r.known
		}
		return err
	}
	if s.q[key] == r {
		r.adopt(st, rep, sent, monotime.Now(), a.opts.SyncInterval)
	}
	return nil
}

func (r *quotaRecord) report(want, keep int64) quotaReport {
	st := quotaReport{q: r.q, end: r.end, used: r.used, keep: keep, want: want, usedAt: r.used}
	if !r.known {
		st.used, st.extra = -1, r.used
	}
	return st
}

// adopt takes a reply. What the instance admitted during the call stays
// counted when the call was about the same period.
func (r *quotaRecord) adopt(st quotaReport, rep quotaAsyncReply, sent, now int64, interval time.Duration) {
	end := st.q.Periods.Bounds[rep.period+1]
	if end == st.end {
		r.used = rep.used + (r.used - st.usedAt)
	} else {
		r.used = rep.used // a new period; what was admitted during the call was the old one's
	}
	r.end, r.known, r.resend = end, true, false
	r.held, r.room = rep.held, max(0, st.q.Limit-rep.counted)
	r.endMono = sent + int64(rep.toEnd)
	r.blockedUntil = 0
	if r.held-r.used < 1 && r.room == 0 {
		r.blockedUntil = min(now+int64(interval), r.endMono)
	}
}

// result describes r: Used is the complement of what the instance can
// still admit (its lease and the fleet's room at the last take).
func (r *quotaRecord) result(now int64, q zones.QuotaLimit, allowed bool) zones.QuotaResult {
	left := max(0, r.held-r.used) + r.room
	if !r.known {
		left = q.Limit
	}
	period := 1
	for i := range 3 {
		if q.Periods.Bounds[i+1] == r.end {
			period = i
		}
	}
	return zones.QuotaResult{Allowed: allowed, Used: max(0, q.Limit-left), ToEnd: time.Duration(max(1, r.endMono-now)), Period: period}
}

func (a *Async) quotaArgs(st quotaReport) []any {
	return []any{"", st.q.Periods.Arg, st.q.Limit, a.instanceID, st.end, st.used, st.extra, st.keep, st.want, int64(a.Instances())}
}

func parseQuotaAsync(cmd *redis.Cmd) (quotaAsyncReply, error) {
	v, err := cmd.Int64Slice()
	if errors.Is(err, context.DeadlineExceeded) {
		err = ErrTimeout
	}
	if err != nil {
		return quotaAsyncReply{}, err
	}
	if len(v) != 5 {
		return quotaAsyncReply{}, errBadReply
	}
	if err := quotaErr(v[4], v[3]); err != nil {
		return quotaAsyncReply{}, err
	}
	return quotaAsyncReply{held: v[0], used: v[1], counted: v[2], toEnd: time.Duration(v[3]) * time.Microsecond, period: int(v[4])}, nil
}

// syncQuotas reports, once a sync interval, the records that need it: an
// idle one hands its lease back and is dropped, one in debt reports it, one
// whose period is over is dropped; final (Close) hands every lease back. A
// report that failed is sent again by the next sync.
func (a *Async) syncQuotas(ctx context.Context, final bool) {
	var items []item
	now := monotime.Now()
	a.eachShard(func(z *asyncZone, s *asyncShard) {
		for key, r := range s.q {
			if r.taking != nil {
				continue
			}
			if now >= r.endMono {
				delete(s.q, key) // its period is over: nothing it says would count
				continue
			}
			idle := !r.active || final
			r.active = false
			handBack := idle && (r.held > r.used || r.resend)
			unreported := r.used > r.held // a debt, or charges of a record that never took
			if !handBack && !unreported {
				if idle {
					delete(s.q, key) // nothing held, nothing to say
				}
				continue
			}
			rkey := a.QuotaKey(z.name, key)
			items = append(items, item{z: z, s: s, key: key, quota: r, qsent: r.report(0, 0), rkey: rkey, slot: a.slotOf(rkey)})
			r.held = min(r.held, r.used) // it spends nothing more until the reply
			r.taking = make(chan struct{})
		}
	})
	if len(items) > 0 {
		_ = a.send(ctx, items, false, now)
	}
}

// release ends a sync's call for a quota item, adopting rep if the call was
// answered (sent at sentAt). A record whose report went unanswered sends
// it again (resend): Redis may count a lease for it that it no longer
// spends. Only a known record can hand a lease back.
func (a *Async) release(it *item, rep *quotaAsyncReply, sentAt int64) {
	r, s := it.quota, it.s
	s.mu.Lock()
	defer s.mu.Unlock()
	close(r.taking) // still the sync's: a call for the record waits for it
	r.taking = nil
	switch {
	case s.q[it.key] != r:
	case rep == nil:
		r.resend = r.known
	default:
		r.adopt(it.qsent, *rep, sentAt, monotime.Now(), a.opts.SyncInterval)
		if !r.active && r.held == r.used {
			delete(s.q, it.key) // idle, nothing held: its next request takes again
		}
	}
}

// lossCost: a record holding no lease costs nothing to evict. One evicted
// with a lease leaves it counted in Redis (undershoot); its next take counts
// it as used.
func (r *quotaRecord) lossCost() int64 { return b2i(r.held > r.used || r.resend || r.taking != nil) }
