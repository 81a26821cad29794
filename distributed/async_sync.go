package distributed

// Async mode's sync loop: what each sync sends and how the replies are
// adopted, the wake of a dormant record, and the epoch (docs/async.md).

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// loop syncs every interval until Close, first after a random part of one,
// so that a fleet started together does not sync in step.
func (a *Async) loop() {
	defer close(a.loopDone)
	first := time.NewTimer(time.Duration(rand.Int64N(int64(a.opts.SyncInterval)) + 1))
	select {
	case <-first.C:
	case <-a.stop:
		first.Stop()
		return
	}
	t := time.NewTicker(a.opts.SyncInterval)
	defer t.Stop()
	for {
		a.nextSync.Store(monotime.Now() + int64(a.opts.SyncInterval))
		_ = a.sync(a.ctx, true)
		a.syncQuotas(a.ctx, false)
		select {
		case <-t.C:
		case <-a.stop:
			return
		}
	}
}

// item is one record in a sync: a rate record (r, sent) or a quota record
// (quota, qsent; quota_async.go).
type item struct {
	z     *asyncZone
	s     *asyncShard
	key   string
	r     *record
	sent  sent
	quota *quotaRecord
	qsent quotaReport
	rkey  string // its Redis key
	slot  int    // its hash slot, on a Cluster
}

// asyncCall is one script call of a sync, behind its master's breaker:
// async.lua for up to asyncCallKeys rate items of one hash slot on a
// Cluster, or quota_async.lua for one quota item.
type asyncCall struct {
	scriptCall
	script *redis.Script
	items  []item
	slot   int // the hash slot of its keys, on a Cluster
	gate   *gate
}

// sync reports the records that need it and adopts the replies; take is
// false for the last sync at Close, which hands every lease back. With
// nothing to report, a GET of the epoch keeps LastSync meaningful (not on a
// Cluster, where no node stands for the whole).
func (a *Async) sync(ctx context.Context, take bool) error {
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	start := monotime.Now()
	items := a.snapshot(start, !take)
	// Items with traffic first (a sync out of time leaves the idle ones);
	// on a Cluster by slot, so that one call carries a slot's keys.
	slices.SortStableFunc(items, func(x, y item) int {
		return cmp.Or(cmp.Compare(b2i(x.sent.idle), b2i(y.sent.idle)), cmp.Compare(x.slot, y.slot))
	})
	var err error
	switch {
	case len(items) > 0:
		err = a.send(ctx, items, take, start)
	case !a.cluster:
		ok, probe := a.breaker.allow()
		if !ok {
			err = ErrUnavailable
			break
		}
		// The epoch, not a PING: an instance whose keys are all blocked or
		// dormant learns too that Redis lost its data (sawEpoch).
		ctx, cancel := context.WithTimeout(ctx, backgroundTimeout(a.opts))
		var epoch int64
		epoch, err = a.client.Get(ctx, a.epochKey(0)).Int64()
		cancel()
		if errors.Is(err, redis.Nil) {
			err = nil // gone (epoch 0): the data went, or was never marked
		}
		if err == nil {
			a.sawEpoch(0, epoch)
		}
		a.breaker.record(probe, err)
	}
	// On a Cluster no master answered, but the sync may have sent only one
	// master's keys: each failed record goes stale on its own.
	if !a.cluster || err == nil {
		a.syncFailed.Store(err != nil)
	}
	if err == nil {
		a.lastSync.Store(start)
	}
	return err
}

// snapshot lists the records that need a sync, with what to report.
func (a *Async) snapshot(now int64, all bool) []item {
	var items []item
	a.eachShard(func(z *asyncZone, s *asyncShard) {
		for k, r := range s.m {
			if st, need := r.snapshot(now, int64(a.opts.SyncInterval), all, &a.seq); need {
				rkey := a.RedisKey(z.name, k)
				items = append(items, item{z: z, s: s, key: k, r: r, sent: st, rkey: rkey, slot: a.slotOf(rkey)})
			}
		}
	})
	return items
}

// slotOf is rkey's hash slot on a Cluster, 0 elsewhere.
func (a *Async) slotOf(rkey string) int {
	if !a.cluster {
		return 0
	}
	return hashSlot(rkey)
}

// restore marks records of a sync that did not happen as used again, so the
// next sync does not take them for idle, and frees quota records (release);
// failed (monotime) is when a sync first failed to reach their master, 0
// for none, -1 for a master that answered.
func (a *Async) restore(items []item, failed int64) {
	for _, it := range items {
		if it.quota != nil {
			a.release(&it, nil, 0)
			continue
		}
		it.s.mu.Lock()
		if !it.sent.idle {
			it.r.used, it.r.active = true, true
		}
		if failed < 0 {
			it.r.failedSince = 0
		} else if failed != 0 && it.r.failedSince == 0 {
			it.r.failedSince = failed
		}
		it.s.mu.Unlock()
	}
}

// send runs the script for every item in calls (see calls), syncChunk items
// per pipeline, and adopts each reply. It returns an error when no call was
// answered and one failed saying Redis cannot serve; failed items keep their
// state for the next sync, and an error about one key alone goes to that
// key's next decision. Each breaker is asked once per sync: a failing
// master's items go stale on their own, the others sync on.
//
// No new pipeline starts past the background timeout, nor after one failed:
// the rest waits for the next sync. A pipeline that times out after Redis
// answered part of the sync means Redis is busy, not down: a flood of keys
// slows syncs down and is never taken for an outage.
func (a *Async) send(ctx context.Context, items []item, take bool, start int64) error {
	n := int64(a.Instances())
	timeout := backgroundTimeout(a.opts)
	budget := time.Now().Add(timeout)
	var gs gates
	defer func() { gs.record() }()
	known := a.knownEpochs()
	for lo, size := 0, firstSyncChunk; lo < len(items); lo, size = lo+size, syncChunk {
		if lo > 0 && time.Now().After(budget) {
			a.restore(items[lo:], 0)
			break
		}
		chunk := items[lo:min(lo+size, len(items))]
		a.sendChunk(ctx, timeout, chunk, &gs, n, take, start, known)
		if !a.cluster && (!gs[0].ok || gs[0].err != nil) {
			a.restore(items[lo+len(chunk):], 0)
			break
		}
	}
	var firstErr error
	for _, g := range gs {
		switch {
		case g.answered > 0:
			return nil // Redis (one of its masters) answered: not down
		case firstErr != nil:
		case !g.ok:
			firstErr = ErrUnavailable
		default:
			firstErr = g.err
		}
	}
	return firstErr
}

// asyncCallKeys is the most keys of one async.lua call: the script's fixed
// cost is small per key, and a call keeps Redis well under a millisecond.
const asyncCallKeys = 100

// calls groups chunk into script calls (see asyncCall), consecutive items.
func (a *Async) calls(chunk []item, gs *gates, n int64, take bool, known map[int]int64) []asyncCall {
	var calls []asyncCall
	for lo := 0; lo < len(chunk); {
		hi := lo + 1
		c := asyncCall{script: asyncScript, gate: gs.get(a.breakerFor(chunk[lo].rkey)), slot: chunk[lo].slot}
		if chunk[lo].quota != nil {
			c.items, c.script = chunk[lo:hi], quotaAsyncScript
			c.keys, c.args = []string{chunk[lo].rkey}, a.quotaArgs(chunk[lo].qsent)
			calls = append(calls, c)
			lo = hi
			continue
		}
		for hi < len(chunk) && hi-lo < asyncCallKeys && chunk[hi].quota == nil && (!a.cluster || chunk[hi].slot == chunk[lo].slot) {
			hi++
		}
		c.items = chunk[lo:hi]
		c.keys, c.args = a.rateCall(c.items, c.slot, n, take, known[c.slot])
		calls = append(calls, c)
		lo = hi
	}
	return calls
}

// rateCall is async.lua's KEYS and ARGV for items, of slot, whose epoch this
// instance last saw is epoch: 4 arguments, then 9 per report.
func (a *Async) rateCall(items []item, slot int, n int64, take bool, epoch int64) ([]string, []any) {
	keys := make([]string, 0, len(items)+1)
	args := make([]any, 0, 4+9*len(items))
	args = append(args, n, a.hold, a.instanceID, epoch)
	for _, it := range items {
		st, l := it.sent, micro(it.sent.limit)
		keys = append(keys, it.rkey)
		args = append(args, l.EmissionInterval, l.Burst, st.delta(), b2i(st.idle),
			freshShare(l.Burst, int(n)), b2i(take && !st.final), st.seq, st.floor, b2i(st.restore))
	}
	return append(keys, a.epochKey(slot)), args
}

// sendChunk runs the calls for chunk, bounded by timeout, and adopts the
// replies, telling each call's gate how it went. Each master's calls go in
// a pipeline of their own (one per script), at once: a master that hangs
// fails only its own keys.
func (a *Async) sendChunk(ctx context.Context, timeout time.Duration, chunk []item, gs *gates, n int64, take bool, start int64, known map[int]int64) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	calls := a.calls(chunk, gs, n, take, known)
	type pipeline struct {
		g      *gate
		script *redis.Script
	}
	pipelines := map[pipeline][]*scriptCall{}
	for i := range calls {
		c := &calls[i]
		if !c.gate.ok || c.gate.err != nil {
			a.restore(c.items, start)
			continue
		}
		p := pipeline{c.gate, c.script}
		pipelines[p] = append(pipelines[p], &c.scriptCall)
	}
	sentAt := monotime.Now()
	var wg sync.WaitGroup
	for p, cs := range pipelines {
		wg.Go(func() { a.evalAll(ctx, p.script, cs) })
	}
	wg.Wait()
	now := monotime.Now()
	for i := range calls {
		if c := &calls[i]; c.cmd != nil {
			a.adoptCall(c, now, start, sentAt)
		}
	}
}

// adoptCall adopts the replies of one call, sent at sentAt. An error saying
// Redis cannot serve goes to the gate; any other, or a per-key one, to each
// key's next decision.
func (a *Async) adoptCall(c *asyncCall, now, start, sentAt int64) {
	var vals []any
	var epoch int64
	var qrep quotaAsyncReply
	var err error
	if c.items[0].quota != nil {
		qrep, err = parseQuotaAsync(c.cmd)
	} else if vals, epoch, err = syncValues(c.cmd, len(c.items)); err == nil {
		defer a.sawEpoch(c.slot, epoch)
	}
	if err != nil && unreachable(err) {
		c.gate.note(err)
		if c.gate.busy() {
			a.restore(c.items, -1) // its master answered part of this sync: alive, only busy
		} else {
			a.restore(c.items, start)
		}
		return
	}
	for i := range c.items {
		it := &c.items[i]
		rep, keyErr := syncReply{}, err
		if keyErr == nil && it.quota == nil {
			rep, keyErr = parseSyncReply(vals[4*i : 4*i+4])
		}
		if keyErr != nil {
			a.problems.note(it.z.name, keyErr)
			if it.r != nil {
				it.s.mu.Lock()
				it.r.syncErr = keyErr
				it.s.mu.Unlock()
			}
			a.restore(c.items[i:i+1], 0)
			continue
		}
		c.gate.answered++
		if it.quota != nil {
			a.release(it, &qrep, sentAt)
		} else {
			a.adopt(it, rep, now)
		}
	}
}

// syncValues reads async.lua's reply for n keys: 4 values each, the epoch.
func syncValues(cmd *redis.Cmd, n int) ([]any, int64, error) {
	vals, err := values(cmd, 4*n+1)
	if err != nil {
		return nil, 0, err
	}
	epoch, ok := vals[4*n].(int64)
	if !ok {
		return nil, 0, errBadReply
	}
	return vals, epoch, nil
}

// parseSyncReply reads one key's reply of async.lua, times in ns.
func parseSyncReply(a []any) (syncReply, error) {
	var rep syncReply
	for i, f := range [...]*int64{&rep.lease, &rep.avail, &rep.retry, &rep.reset} {
		n, ok := a[i].(int64)
		if !ok {
			return syncReply{}, errBadReply
		}
		*f = n
	}
	if rep.lease < 0 {
		return syncReply{}, errForeignType
	}
	rep.retry *= 1000
	rep.reset *= 1000
	return rep, nil
}

// adopt applies one reply to its record, if it is still the one sent.
func (a *Async) adopt(it *item, rep syncReply, now int64) {
	it.s.mu.Lock()
	// A wake (or this sync) may have adopted the same report already.
	if r := it.r; it.s.m[it.key] == r && r.hasUnacked && r.unacked.seq == it.sent.seq && a.applyReply(r, it.sent, rep, now) {
		delete(it.s.m, it.key)
	}
	it.s.mu.Unlock()
}

// applyReply adopts rep for r (record.apply) and sets when its new lease
// is renewed: before its lifetime ends, jittered, so that keys leased in
// one sync do not all come due in one later sync.
func (a *Async) applyReply(r *record, st sent, rep syncReply, now int64) (drop bool) {
	n := a.Instances()
	drop = r.apply(st, rep, now, st.limit.Burst, freshShare(st.limit.Burst, n))
	r.renewAt = now + a.life - rand.Int64N(a.life/4+1)
	r.roomy = n == 1 || rep.avail >= rep.lease
	return drop
}

// wake syncs a dormant record alone, on the request path, so that a quiet
// key gets a lease instead of a denial: one script call, bounded and
// through the breaker; concurrent requests wait for it. A record blocked at
// its last sync is not woken before the fleet's next token. Called and
// returns with s locked; the record returned is key's now.
func (a *Async) wake(ctx context.Context, z *asyncZone, s *asyncShard, key string, r *record, limit algorithms.Limit) (*record, error) {
	ctx, cancel := a.bound(ctx)
	defer cancel()
	for round := 0; ; round++ { // 3 at most: a final report in flight is sent again first
		if r == nil {
			r = &record{allow: freshShare(limit.Burst, a.Instances())}
			insert(z, s.m, key, r)
		}
		if round == 3 || !r.dormant || r.retryAt > monotime.Now() {
			return r, nil
		}
		if r.waking != nil {
			if err := s.await(ctx, r.waking); err != nil {
				return nil, err
			}
			r = s.m[key]
			continue
		}
		if !r.hasUnacked {
			r.limit = limit
			r.unacked, r.hasUnacked = r.report(monotime.Now()), true
			r.unacked.seq = a.seq.Add(1)
		}
		st := r.unacked
		var rep syncReply
		var err error
		s.unlocked(&r.waking, func() { rep, err = a.syncOne(ctx, z.name, key, st) })
		if err != nil {
			return nil, err
		}
		if s.m[key] == r && r.hasUnacked && r.unacked.seq == st.seq {
			a.applyReply(r, st, rep, monotime.Now())
		}
		r = s.m[key]
	}
}

// syncOne sends one report alone, through the key's breaker.
func (a *Async) syncOne(ctx context.Context, zone, key string, st sent) (syncReply, error) {
	rkey := a.RedisKey(zone, key)
	slot := a.slotOf(rkey)
	var rep syncReply
	err := a.unbatched(ctx, rkey, func(ctx context.Context) error {
		keys, args := a.rateCall([]item{{rkey: rkey, sent: st}}, slot, int64(a.Instances()), true, a.knownEpoch(slot))
		vals, epoch, err := syncValues(asyncScript.Run(ctx, a.client, keys, args...), 1)
		if err == nil {
			rep, err = parseSyncReply(vals[:4])
		}
		if err == nil {
			a.sawEpoch(slot, epoch)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = ErrTimeout
		}
		return err
	})
	a.problems.note(zone, err)
	return rep, err
}

// The epoch tells that Redis lost its data, instead of trusting a blank
// Redis to be a full one: every async.lua call reads <key_prefix>epoch (per
// hash slot on a Cluster), written when missing; an instance that saw
// another restores its keys to what it last heard (docs/async.md).

// epochTags holds, by slot, a short string in that slot: the epoch keys'
// hash tags on a Cluster.
var epochTags = sync.OnceValue(func() *[16384]string {
	var tags [16384]string
	for i, left := 0, len(tags); left > 0; i++ {
		s := strconv.Itoa(i)
		if sl := hashSlot(s); tags[sl] == "" {
			tags[sl] = s
			left--
		}
	}
	return &tags
})

func (a *Async) epochKey(slot int) string {
	if !a.cluster {
		return a.opts.KeyPrefix + "epoch"
	}
	return a.opts.KeyPrefix + "epoch{" + epochTags()[slot] + "}"
}

// knownEpoch is the epoch this instance last saw for slot (0: none).
func (a *Async) knownEpoch(slot int) int64 {
	a.epochMu.Lock()
	defer a.epochMu.Unlock()
	return a.epochs[slot]
}

// knownEpochs copies the epochs this instance last saw, by slot.
func (a *Async) knownEpochs() map[int]int64 {
	a.epochMu.Lock()
	defer a.epochMu.Unlock()
	return maps.Clone(a.epochs)
}

// sawEpoch notes the epoch a call reported for slot. A change means Redis
// lost the slot's data: every record of the slot restores its key in its
// next report (the call's own keys it restored already).
func (a *Async) sawEpoch(slot int, epoch int64) {
	a.epochMu.Lock()
	old := a.epochs[slot]
	if epoch == 0 { // missing: the next call writes another, and records restore
		delete(a.epochs, slot)
	} else {
		a.epochs[slot] = epoch
	}
	a.epochMu.Unlock()
	if old == 0 || old == epoch {
		return
	}
	a.logger.Warn("redis lost its data (its epoch changed): async keys are restored from what this instance last heard")
	a.eachShard(func(z *asyncZone, s *asyncShard) {
		for k, r := range s.m {
			if r.reserved && a.slotOf(a.RedisKey(z.name, k)) == slot {
				r.restore = true
			}
		}
	})
}
