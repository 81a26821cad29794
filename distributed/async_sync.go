package distributed

// Async mode's sync loop: what each sync sends to Redis and how the replies
// are adopted (the scheme is in async.go).

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// loop syncs every interval until Close. The first sync comes after a
// random part of an interval, so a fleet started together does not sync in
// step.
func (a *Async) loop() {
	defer close(a.loopDone)
	first := time.NewTimer(time.Duration(rand.Int64N(int64(a.interval)) + 1))
	select {
	case <-first.C:
	case <-a.stop:
		first.Stop()
		return
	}
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		a.nextSync.Store(monotime.Now() + int64(a.interval))
		_ = a.sync(a.ctx, true)
		select {
		case <-t.C:
		case <-a.stop:
			return
		}
	}
}

// item is one record in a sync.
type item struct {
	z    *asyncZone
	s    *asyncShard
	key  string
	r    *record
	sent sent
	keys []string
	args []any
	cmd  *redis.Cmd
}

// sync reports every record to Redis and adopts the replies; take is false
// for the last sync at Close, which hands leases back and takes none. With
// nothing to report, a PING keeps LastSync meaningful: Redis answered.
// Each pipeline Redis must answer within the background timeout (see send).
func (a *Async) sync(ctx context.Context, take bool) error {
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	start := monotime.Now()
	items := a.snapshot(start)
	slices.SortStableFunc(items, func(x, y item) int { return cmp.Compare(b2i(x.sent.idle), b2i(y.sent.idle)) })
	ok, probe := a.breaker.allow()
	if !ok {
		a.restore(items)
		a.syncFailed.Store(true)
		return ErrUnavailable
	}
	var err error
	if len(items) == 0 {
		ctx, cancel := context.WithTimeout(ctx, backgroundTimeout(a.opts))
		err = a.client.Ping(ctx).Err()
		cancel()
	} else {
		err = a.send(ctx, items, take)
	}
	a.breaker.record(probe, err)
	a.syncFailed.Store(err != nil)
	if err != nil {
		return err
	}
	a.lastSync.Store(start)
	return nil
}

// snapshot lists the records that need a sync, with what to report.
func (a *Async) snapshot(now int64) []item {
	var items []item
	for _, z := range *a.zones.Load() {
		for i := range z.shards {
			s := &z.shards[i]
			s.mu.Lock()
			for k, r := range s.m {
				if st, need := r.snapshot(now, int64(a.interval), &a.seq); need {
					items = append(items, item{z: z, s: s, key: k, r: r, sent: st})
				}
			}
			s.mu.Unlock()
		}
	}
	return items
}

// restore marks records of a sync that did not happen as used again, so the
// next sync does not take them for idle.
func (a *Async) restore(items []item) {
	for _, it := range items {
		it.s.mu.Lock()
		if !it.sent.idle {
			it.r.used = true
		}
		it.s.mu.Unlock()
	}
}

// send runs the script for every item, syncChunk per pipeline, and adopts
// each reply. It returns the first error that says Redis cannot serve (for
// the breaker); items whose call failed keep their state for the next sync,
// and an error about one key alone goes to that key's next decision.
//
// Redis must answer each pipeline within the background timeout; a sync
// starts no new pipeline once it has taken that long in all, nor after one
// failed, so the items not done wait for the next sync (their reports are
// sent again, unchanged), items with traffic first (sync sorts them). A
// pipeline that times out after Redis answered the sync's first (small)
// one, or part of itself, means Redis is busy, not down: the sync stops
// there without an error.
// A flood of keys thus slows syncs down and is never taken for an outage.
func (a *Async) send(ctx context.Context, items []item, take bool) error {
	n := int64(a.Instances())
	timeout := backgroundTimeout(a.opts)
	budget := time.Now().Add(timeout)
	for lo, size := 0, firstSyncChunk; lo < len(items); lo, size = lo+size, syncChunk {
		if lo > 0 && time.Now().After(budget) {
			a.restore(items[lo:])
			break
		}
		chunk := items[lo:min(lo+size, len(items))]
		answered, err := a.sendChunk(ctx, timeout, chunk, n, take)
		if err != nil {
			a.restore(items[lo+len(chunk):])
			if (lo > 0 || answered > 0) && (errors.Is(err, context.DeadlineExceeded) || isTimeout(err)) {
				// Redis answered this sync's first pipeline, or part of
				// this one, before the timeout: it is busy, not down.
				return nil
			}
			return err
		}
	}
	return nil
}

// isTimeout reports whether err is a network timeout (a pipeline Redis did
// not answer in time).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sendChunk runs one pipeline of items, bounded by timeout, and adopts the
// replies; it returns how many Redis answered and the first error that says
// Redis cannot serve.
func (a *Async) sendChunk(ctx context.Context, timeout time.Duration, chunk []item, n int64, take bool) (answered int, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var firstErr error
	pipe := a.client.Pipeline()
	for i := range chunk {
		it := &chunk[i]
		it.keys = []string{a.RedisKey(it.z.name, it.key)}
		it.args = a.syncArgs(it.sent, n, take)
		it.cmd = pipe.EvalSha(ctx, a.script.Hash(), it.keys, it.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var retry redis.Pipeliner
	for i := range chunk {
		it := &chunk[i]
		if redis.HasErrorPrefix(it.cmd.Err(), "NOSCRIPT") {
			if retry == nil {
				retry = a.client.Pipeline()
			}
			it.cmd = retry.Eval(ctx, asyncScript, it.keys, it.args...)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	now := monotime.Now()
	for i := range chunk {
		it := &chunk[i]
		rep := parseReply(it.cmd)
		if rep.err != nil {
			if unreachable(rep.err) {
				if firstErr == nil {
					firstErr = rep.err
				}
			} else {
				a.problems.note(it.z.name, rep.err)
				it.s.mu.Lock()
				it.r.syncErr = rep.err
				it.s.mu.Unlock()
			}
			a.restore(chunk[i : i+1])
			continue
		}
		answered++
		a.adopt(it, rep.vals, now)
	}
	return answered, firstErr
}

// syncArgs is async.lua's ARGV for one report (take is false at Close; a
// final report takes nothing either).
func (a *Async) syncArgs(st sent, n int64, take bool) []any {
	l := micro(st.limit)
	return []any{l.EmissionInterval, l.Burst, n, st.delta(), b2i(st.idle),
		a.hold, freshShare(l.Burst, int(n)), b2i(take && !st.final), a.instanceID, st.seq}
}

// adopt applies one reply to its record, if the record is still the one
// that was sent (Reset or eviction may have replaced it).
func (a *Async) adopt(it *item, v [4]int64, now int64) {
	rep := syncReply{lease: v[0], avail: v[1], retry: v[2] * 1000, reset: v[3] * 1000}
	it.s.mu.Lock()
	fresh := freshShare(it.sent.limit.Burst, a.Instances())
	// A wake (or this sync) may have adopted the same report already.
	r := it.r
	if it.s.m[it.key] == r && r.hasUnacked && r.unacked.seq == it.sent.seq && r.apply(it.sent, rep, now, it.sent.limit.Burst, fresh) {
		delete(it.s.m, it.key)
	}
	it.s.mu.Unlock()
}
