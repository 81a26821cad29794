package distributed

// Async mode's record: one instance's allowance for one key, its decisions,
// and the arithmetic of a sync's report and reply (docs/async.md).

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

// record is one instance's view of one key, guarded by its shard's lock;
// times are monotime.
type record struct {
	limit    algorithms.Limit // ns, as the last decision gave it
	allow    int64            // what this instance may still admit before its next sync
	pending  int64            // cost admitted and not yet counted in Redis
	reserved bool             // allow is a lease Redis counts as spent, not a fresh share
	// used: decided or refunded since the last snapshot, spending spent;
	// active: used since the last report. A report is idle only after no
	// traffic since the report before: a key used every few syncs keeps
	// its lease.
	used, active bool
	spent        int64
	// renewAt: the lease is renewed by then, to be spent within its
	// lifetime; roomy: the fleet had this lease left besides it at the
	// last sync, so holding it unused costs no other instance anything.
	renewAt int64
	roomy   bool
	// As of the last sync: when the fleet has a token back, and is full.
	retryAt, resetAt int64
	// unacked: the last report whose reply was not adopted, sent again
	// with its sequence number by every sync: Redis applies it once.
	unacked    sent
	hasUnacked bool
	// syncErr, about this key alone in the last sync, is its next
	// decision's: the fail policy applies once per failed sync.
	syncErr     error
	failedSince int64 // syncs have not reached the key's master since then (0: they have)
	// After dormantAfter idle syncs the next hands the lease back and the
	// record is dormant: no sync until a request wakes it.
	idleSyncs   int
	dormant     bool
	waking      chan struct{} // closed when a wake in flight ends
	deniedUntil int64         // the zone's deny cache for the key
	fallback    int64         // fail_policy local's TAT at this instance's share (fallbackStep)
	inFallback  bool
	restore     bool // Redis lost its data (sawEpoch): the next report restores the key
}

// dormantAfter: a key seen once costs Redis dormantAfter+2 scripts.
const dormantAfter = 1

// decide admits cost from the allowance, or denies until the next sync or
// the fleet's next token, whichever is later.
func (r *record) decide(now, nextSync int64, l algorithms.Limit, cost int64) algorithms.Result {
	r.limit, r.used, r.active = l, true, true
	allowed := r.allow >= cost
	if allowed {
		r.charge(cost)
	}
	return r.result(now, nextSync, l, allowed)
}

// decideAhead is decide in a zone with delay: a request the allowance
// cannot cover is admitted for later, as pending, when its turn (the TAT
// at the last sync moved on by pending) is at most ahead away; a denial's
// retry is that turn. Instances reserving for one key within a sync
// interval do not see each other's reservations: the fleet may serve up
// to N−1 more per turn meanwhile (docs/distributed.md).
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
	r.charge(cost) // spends the whole allowance: Remaining is 0
	res := r.result(now, nextSync, l, true)
	res.Delay = turn - now
	return res
}

// check reports whether the allowance has a unit left, consuming nothing.
func (r *record) check(now, nextSync int64, l algorithms.Limit) algorithms.Result {
	r.limit, r.used, r.active = l, true, true
	return r.result(now, nextSync, l, r.allow >= 1)
}

// result describes the record: what is left when allowed; when denied, a
// wait until the later of the next sync and the fleet's next token.
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

// charge takes cost from the allowance after the fact; pending gets all of
// it on a fresh share, what the lease does not cover on a lease.
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

func (r *record) refund(cost int64) {
	r.used, r.active = true, true
	r.allow += cost
	if !r.reserved {
		r.pending = max(0, r.pending-cost)
	}
}

// sent is what a sync reported for a record.
type sent struct {
	limit          algorithms.Limit
	allow, pending int64
	reserved, idle bool
	final          bool   // hand the whole lease back, take none: the record goes dormant
	seq            uint64 // unique per report, store-wide
	floor          int64  // µs: the key's time to full as last heard (0: never synced)
	restore        bool
}

// snapshot takes what the next sync reports for r, and whether r needs a
// sync at all (see due); all is for the last sync at Close.
func (r *record) snapshot(now, interval int64, all bool, seq *atomic.Uint64) (sent, bool) {
	if r.hasUnacked {
		return r.unacked, true
	}
	idle := !r.used && r.pending == 0 // since the last sync
	s := r.report(now)
	s.idle = !r.active && r.pending == 0
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

// report is what a sync reports of r at now.
func (r *record) report(now int64) sent {
	s := sent{limit: r.limit, allow: r.allow, pending: r.pending, reserved: r.reserved, restore: r.restore}
	if r.reserved {
		s.floor = max(0, r.resetAt-now) / 1000
	}
	return s
}

// due reports whether a record holding a lease, with nothing to report but
// its use of it, needs this sync; Redis work follows admissions, not keys.
// A lease is renewed before its lifetime ends, every sync while the fleet
// is short (not roomy: leases move to the instance with traffic), and when
// below twice what the key used since the last sync. A dormant record
// waits for a request, a blocked key for its token or lifetime, however
// hard it is hit.
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
		return false
	case !r.roomy:
		return true
	default:
		return r.allow < max(1, 2*spent)
	}
}

// delta is the cost the sync reports: admitted and not counted, minus the
// unused lease handed back. The unused part of a fresh share is reserved,
// so that what is admitted from it during the sync counts before any other
// instance's lease.
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

// apply adopts a sync's reply; decisions made during the sync stay counted.
// drop: the key is full in Redis and the instance had no traffic for it.
// When Redis forgot the key but requests arrived during the sync, the
// record carries on as a fresh one: kept reserved with no lease, it would
// deny the key until the next sync although the fleet had its whole burst.
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
// this instance's share of l, starting from what the record last heard.
// What it admits is pending, counted in Redis by the sync after the
// outage: an outage costs the fleet the fallback's bound once, instead of
// the key getting its Redis quota again.
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
