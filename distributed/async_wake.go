package distributed

// Async mode's wake: a dormant record synced alone on the request path.

import (
	"context"
	"errors"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

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
			z.insert(s, key, r)
		}
		if round == 3 || !r.dormant || r.retryAt > monotime.Now() {
			return r, nil
		}
		if w := r.waking; w != nil {
			s.mu.Unlock()
			select {
			case <-w:
			case <-ctx.Done():
			}
			s.mu.Lock()
			if err := ctx.Err(); err != nil {
				return nil, ErrTimeout
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
		w := make(chan struct{})
		r.waking = w
		s.mu.Unlock()
		rep, err := a.syncOne(ctx, z.name, key, st)
		s.mu.Lock()
		r.waking = nil
		close(w)
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
	b := a.breakerFor(rkey)
	ok, probe := b.allow()
	if !ok {
		return syncReply{}, ErrUnavailable
	}
	n := int64(a.Instances())
	slot := 0
	if a.cluster {
		slot = hashSlot(rkey)
	}
	args := a.appendSyncArgs([]any{n, a.hold, a.instanceID, a.knownEpoch(slot)}, st, n, true)
	vals, epoch, err := syncValues(a.script.Run(ctx, a.client, []string{rkey, a.epochKey(slot)}, args...), 1)
	var rep syncReply
	if err == nil {
		rep, err = parseSyncReply(vals[:4])
	}
	if err == nil {
		defer a.sawEpoch(slot, epoch)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = ErrTimeout
	}
	b.record(probe, err)
	if err != nil {
		a.problems.note(zone, err)
		return syncReply{}, err
	}
	return rep, nil
}
