package distributed

// Async mode's record: one instance's allowance for one key, the decisions
// made from it, and the arithmetic of a sync's report and reply (the scheme
// and its bound are in docs/async.md).

import (
	"sync/atomic"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// freshShare is what an instance may admit for a key it has never synced:
// its share of a full burst among n instances, at least 1.
func freshShare(burst int64, n int) int64 {
	return max(1, burst/int64(max(1, n)))
}

// record is one instance's view of one key. Guarded by its shard's lock.
type record struct {
	limit algorithms.Limit // ns, as the last decision gave it
	// allow is what this instance may still admit before its next sync.
	allow int64
	// pending is cost admitted and not yet counted in Redis.
	pending int64
	// reserved: allow is a lease Redis counts as spent (the key has
	// synced); otherwise it is a fresh share Redis knows nothing about and
	// every admission adds to pending.
	reserved bool
	// used: decided or refunded since the last snapshot; spent: the cost
	// admitted since then (what the lease must cover until the next one);
	// active: used since the last report. A report is idle (the instance
	// parks a small lease, or goes dormant) only if the key had no traffic
	// since the report before, not merely since the last sync: a key used
	// every few syncs keeps its lease when it renews it.
	used, active bool
	spent        int64
	// renewAt (monotime) is when the lease must be renewed at the latest,
	// so that it is spent within its lifetime of being reserved; roomy:
	// at the last sync the fleet had at least this lease left besides it
	// (or this is the only instance), so a lease this instance holds
	// unused costs no other instance anything until then.
	renewAt int64
	roomy   bool
	// retryAt and resetAt (monotime) are when, as of the last
	// sync, the fleet has one token back and the key is full again.
	retryAt, resetAt int64
	// unacked is the last report taken for a sync whose reply has not been
	// adopted; while set, every sync sends it again, unchanged, with its
	// sequence number, and Redis applies it at most once.
	unacked    sent
	hasUnacked bool
	// syncErr is an error Redis gave about this key alone in the last
	// sync; the key's next decision returns it, so the zone applies its
	// fail policy (and counts it) once per failed sync.
	syncErr error
	// failedSince (monotime, 0 when the last attempt succeeded) is when
	// syncs first failed to reach the key's master since its last
	// successful one: the record is stale from then on (on a Cluster, a
	// dead master's keys alone).
	failedSince int64
	// idleSyncs counts the consecutive syncs that found the record idle;
	// at dormantAfter the next one hands its whole lease back and takes
	// none, and the record is dormant: no sync until a request needs it
	// (see wake).
	idleSyncs int
	dormant   bool
	waking    chan struct{} // closed when a wake in flight ends
	// deniedUntil (monotime) is the zone's deny cache for the key: its
	// last denial with no unit left ends then (zones.Records).
	deniedUntil int64
	// fallback (monotime) is fail_policy local's TAT for the key at this
	// instance's share, from fallbackAt on, while the store cannot decide:
	// it starts from what the record last heard from Redis, and what it
	// admits is pending, which the next successful sync counts in Redis
	// (see fallbackStep).
	fallback   int64
	inFallback bool
	// restore: Redis lost its data since the last sync (async_epoch.go);
	// the next report restores the key to what this record last heard.
	restore bool
}

// dormantAfter is the number of idle syncs (each parking a small lease) a
// record has before its next sync hands everything back and it goes
// dormant. A key seen once costs Redis dormantAfter+2 scripts, not one per
// interval until it refills.
const dormantAfter = 1

// decide admits cost from the allowance, or denies until the next sync or
// the fleet's next token, whichever is later.
func (r *record) decide(now, nextSync int64, l algorithms.Limit, cost int64) algorithms.Result {
	r.limit, r.used, r.active = l, true, true
	if r.allow < cost {
		return r.result(now, nextSync, l, false)
	}
	r.allow -= cost
	r.spent += cost
	if !r.reserved {
		r.pending += cost
	}
	return r.result(now, nextSync, l, true)
}

// decideAhead is decide in a zone with delay: a request the allowance
// cannot cover is admitted for later when its turn is at most ahead away.
// Its turn is when the key, as this instance knows it, has the request's
// cost back: the key's TAT at the last sync (which counts the leases,
// this instance's included), moved on by what this instance admitted since
// that Redis has not counted (pending, its earlier reservations included),
// less the burst. What the allowance does not cover is pending, counted in
// Redis at the next sync, past the burst if need be (as a charge), so that
// the leases and turns that follow make room for it. Instances that
// reserve for the same key within one sync interval do not see each
// other's reservations until that sync: the fleet may serve up to N−1 more
// per turn meanwhile (docs/distributed.md), and serves the debt off after.
//
// A denial's retry is the turn it would have had: when a request would
// pass at once.
func (r *record) decideAhead(now, nextSync int64, l algorithms.Limit, cost, ahead int64) algorithms.Result {
	if r.allow >= cost || ahead <= 0 || cost > l.Burst {
		return r.decide(now, nextSync, l, cost)
	}
	tat := max(r.resetAt, now) + r.pending*l.EmissionInterval
	turn := max(now, tat+(cost-l.Burst)*l.EmissionInterval)
	if turn-now > ahead {
		res := r.decide(now, nextSync, l, cost)
		res.RetryAfter = max(res.RetryAfter, turn-now)
		res.ResetAfter = max(res.ResetAfter, res.RetryAfter)
		return res
	}
	r.limit = l
	r.charge(cost)
	return algorithms.Result{
		Allowed:    true,
		ResetAfter: max(r.resetAt-now, 0) + r.pending*l.EmissionInterval,
		Delay:      turn - now,
	}
}

// check reports whether the allowance has a unit left, consuming nothing.
func (r *record) check(now, nextSync int64, l algorithms.Limit) algorithms.Result {
	r.limit, r.used, r.active = l, true, true
	return r.result(now, nextSync, l, r.allow >= 1)
}

// result describes the record as it stands: what is left when allowed;
// when denied, a wait until the next sync or the fleet's next token,
// whichever is later.
func (r *record) result(now, nextSync int64, l algorithms.Limit, allowed bool) algorithms.Result {
	if allowed {
		return algorithms.Result{
			Allowed:    true,
			Remaining:  r.allow,
			ResetAfter: max(r.resetAt-now, 0) + r.pending*l.EmissionInterval,
		}
	}
	retry := max(r.retryAt-now, nextSync-now, 1)
	return algorithms.Result{
		RetryAfter: retry,
		ResetAfter: max(r.resetAt-now+r.pending*l.EmissionInterval, retry),
	}
}

// charge takes cost from the allowance after the fact, whatever is left:
// on a fresh share all of it is pending (Redis knows nothing yet); on a
// lease, what the lease does not cover is, and the next sync counts it in
// Redis past the burst.
func (r *record) charge(cost int64) {
	r.used, r.active = true, true
	r.spent += cost
	spent := min(cost, r.allow)
	r.allow -= spent
	if r.reserved {
		r.pending += cost - spent
	} else {
		r.pending += cost
	}
}

// refund gives cost back to the allowance.
func (r *record) refund(cost int64) {
	r.used, r.active = true, true
	r.allow += cost
	if !r.reserved {
		r.pending = max(0, r.pending-cost)
	}
}

// sent is what a sync reported for a record, taken under its shard's lock.
type sent struct {
	limit          algorithms.Limit
	allow, pending int64
	reserved, idle bool
	final          bool   // hand the whole lease back, take none: the record goes dormant
	seq            uint64 // unique per report, store-wide
	floor          int64  // µs: the key's time to full as last heard (restored from, see async_epoch.go)
	restore        bool
}

// snapshot takes what the next sync reports for r, and whether r needs a
// sync at all (see due). all is set for the last sync at Close, which hands
// every lease back.
//
// A report whose reply was lost (a sync that failed or timed out, perhaps
// after Redis applied it) is sent again unchanged: Redis recognises its
// sequence number and replays the reply instead of counting it twice.
// Decisions made meanwhile are reported by the sync after it is adopted.
func (r *record) snapshot(now, interval int64, all bool, seq *atomic.Uint64) (sent, bool) {
	if r.hasUnacked {
		return r.unacked, true
	}
	idle := !r.used && r.pending == 0 // since the last sync
	s := sent{limit: r.limit, allow: r.allow, pending: r.pending, reserved: r.reserved, idle: !r.active && r.pending == 0,
		floor: r.floor(now), restore: r.restore}
	spent := r.spent
	r.used, r.spent = false, 0
	if r.reserved && r.pending == 0 && !r.restore && !r.due(now, interval, spent, idle, all) {
		if idle {
			r.idleSyncs++
		} else {
			r.idleSyncs = 0
		}
		return s, false
	}
	s.final = s.idle && s.reserved && r.idleSyncs >= dormantAfter
	r.active = false
	s.seq = seq.Add(1)
	r.unacked, r.hasUnacked = s, true
	return s, true
}

// floor is the key's time to full in µs as this record last heard it (0
// for a key it never synced): what a report restores the key to when Redis
// lost its data.
func (r *record) floor(now int64) int64 {
	if !r.reserved {
		return 0
	}
	return max(0, r.resetAt-now) / 1000
}

// due reports whether a record holding a lease, with nothing to report but
// its use of it, needs this sync: Redis work follows admissions, not keys.
// It does when
//   - its lease reaches its lifetime before the next sync (renewAt): the
//     lease is renewed, or handed back if the key went quiet;
//   - the fleet is short of tokens (not roomy): every sync, as leases must
//     move between instances to the one with traffic, and an idle
//     instance's lease goes back at once;
//   - the lease runs low: less than twice what the key used since the
//     last sync, so it may run out before the next one (or is empty and
//     the fleet has tokens).
//
// A dormant record (no lease) waits for a request to wake it, and one whose
// key is blocked until after the next sync waits for its token (or, if its
// requests keep coming, for its lifetime): a key seen once and a blocked
// key cost Redis nothing in between, however hard the blocked key is hit.
func (r *record) due(now, interval, spent int64, idle, all bool) bool {
	blocked := r.allow == 0 && r.retryAt > now+interval
	switch {
	case all:
		return r.allow > 0
	case idle && (r.dormant || blocked):
		return false
	case now+interval >= r.renewAt:
		return true
	case blocked:
		// Its requests are denied: as of its last report the fleet has
		// no token before retryAt. It looks again then, or at its
		// lifetime for tokens other instances hand back.
		return false
	case !r.roomy:
		return true
	default:
		return r.allow < max(1, 2*spent)
	}
}

// delta is the cost the sync reports: admitted and not counted, minus the
// unused lease it hands back. The unused part of a fresh share is reserved
// instead (it is added), so that what the instance admits from it while the
// sync is in flight is counted before any other instance's lease.
func (s sent) delta() int64 {
	if s.reserved {
		return s.pending - s.allow
	}
	return s.pending + s.allow
}

// syncReply is the script's answer for one key, times in ns.
type syncReply struct {
	lease, avail, retry, reset int64
}

// apply adopts a sync's reply. Decisions made while the sync was in flight
// stay counted: on a lease they came out of the lease the sync handed back,
// so they come out of the new one (or stay pending); on a fresh share they
// came out of the part the sync reserved, which the record keeps. It reports
// whether the record carries no information any more and should be dropped:
// the key is full in Redis and the instance had no traffic for it, before or
// during the sync.
//
// When Redis forgot the key (it was full and this instance idle, so no lease
// came back) but requests arrived while the sync was in flight, the record
// carries on as a fresh one, which counts them: keeping it reserved with no
// lease denied the key's next requests until the following sync although
// the fleet had its whole burst (0.5-4% spurious 429s at 2% of the limit).
func (r *record) apply(s sent, rep syncReply, now, burst, fresh int64) (drop bool) {
	var allow, pending int64
	if s.reserved {
		allow = rep.lease + r.allow - s.allow
		pending = r.pending - s.pending
	} else {
		allow = rep.lease + r.allow
		pending = r.pending - s.pending - (s.allow - r.allow)
	}
	if allow < 0 {
		pending -= allow
		allow = 0
	}
	r.allow, r.pending, r.reserved = allow, max(0, pending), true
	r.retryAt, r.resetAt = now+rep.retry, now+rep.reset
	r.hasUnacked, r.failedSince, r.inFallback = false, 0, false
	if s.restore {
		r.restore = false
	}
	if s.idle {
		r.idleSyncs++
	} else {
		r.idleSyncs = 0
	}
	r.dormant = s.final && !r.used && r.pending == 0 && r.allow == 0
	forgotten := s.reserved && s.idle && rep.lease == 0 && rep.avail >= burst
	if forgotten && r.used {
		r.reserved = false
		r.allow = max(0, fresh-r.pending)
		return false
	}
	return forgotten && r.pending == 0
}

// fallbackStep runs one step of fail_policy local on the record at share,
// this instance's share of its limit l. The first step of an outage starts
// from what the record last heard: the key is full again when Redis said at
// the last sync, less the unused lease this instance will hand back, plus
// what it admitted that Redis has not counted; a record with nothing heard
// starts full. What the
// fallback admits or charges is added to pending: the sync after the
// outage counts it in Redis, once (the report's sequence number), so the
// outage costs the fleet the fallback's own bound once, instead of the key
// getting its Redis quota again.
func (r *record) fallbackStep(now int64, l, share algorithms.Limit, op zones.Op, cost, ahead int64) algorithms.Result {
	if !r.inFallback {
		r.inFallback = true
		full := r.resetAt // as Redis said at the last sync, leases included
		if r.reserved {
			full -= r.allow * r.limit.EmissionInterval // the unused lease goes back
		}
		r.fallback = max(full, now) + r.pending*l.EmissionInterval
	}
	r.limit = l
	var res algorithms.Result
	switch op {
	case zones.OpCheck, zones.OpPeek:
		return share.Peek(r.fallback, now)
	case zones.OpRefund:
		r.fallback = share.Refund(r.fallback, now, cost)
		r.pending = max(0, r.pending-cost)
		return res
	case zones.OpCharge:
		res = share.Charge(r.fallback, now, cost)
	default:
		if res = share.DecideAhead(r.fallback, now, cost, ahead); !res.Allowed {
			return res
		}
	}
	r.fallback = res.TAT
	r.pending += cost
	r.used, r.active = true, true
	return res
}
