package distributed

// Concurrency slots in Redis (zones.Slots); concurrency.lua has their layout.

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

var (
	//go:embed concurrency.lua
	concurrencyLua    string
	concurrencyScript = redis.NewScript(concurrencyLua)
)

// slots is a store's record of the slots this instance holds in Redis.
type slots struct {
	seq      atomic.Uint64 // slot ids: <instance id>:<seq>
	mu       sync.Mutex
	held     map[heldSlot]heldLease
	releases []pendingRelease
	every    time.Duration // the renewal period: the shortest lease held / 3
	wake     chan struct{} // capacity 1: releases are pending or every shrank
	now      atomic.Bool   // renew at once: Redis lost its data (see slotsRecovery)
}

type heldSlot struct{ rkey, id string }

type heldLease struct {
	limit   int64
	lease   time.Duration
	expires time.Time // by this instance's clock, a lower bound of Redis's view
}

type pendingRelease struct {
	heldSlot
	expires time.Time
}

func (sl *slots) renewNow() {
	sl.now.Store(true)
	sl.poke()
}

func (sl *slots) poke() {
	select {
	case sl.wake <- struct{}{}:
	default:
	}
}

// Acquire takes a slot of key in zone when fewer than limit are held
// (zones.Slots), in one batched call. A slot a timed-out call may still have
// taken is released (or, overtaken by the release, ends with its lease).
func (c *link) Acquire(ctx context.Context, zone, key string, limit int64, lease time.Duration) (string, int64, error) {
	if c.isClosed() {
		return "", 0, ErrClosed
	}
	sl := &c.slots
	slot := heldSlot{rkey: c.slotsKey(zone, key), id: c.instanceID + ":" + strconv.FormatUint(sl.seq.Add(1), 36)}

	checkLoss := "" // on the instances set's server: did Redis lose its data since our last beat?
	if !c.cluster && c.beatRecently() {
		checkLoss = c.opts.KeyPrefix
	}
	start := time.Now()
	rep := c.call(ctx, concurrencyScript, slot.rkey, [5]any{"a", limit, lease.Milliseconds(), slot.id, checkLoss})
	if err := rep.err; err != nil {
		if !errors.Is(err, ErrUnavailable) {
			sl.release(slot, start.Add(lease))
		}
		return "", 0, err
	}
	if taken, inUse := rep.ints[0] == 1, rep.ints[1]; !taken {
		return "", inUse, nil
	}
	sl.mu.Lock()
	sl.held[slot] = heldLease{limit: limit, lease: lease, expires: start.Add(lease)}
	shorter := sl.every == 0 || lease/3 < sl.every
	if shorter {
		sl.every = lease / 3
	}
	sl.mu.Unlock()
	if shorter {
		sl.poke()
	}
	return slot.id, rep.ints[1], nil
}

// Release frees a slot (zones.Slots); the background loop removes it.
func (c *link) Release(zone, key, id string) {
	slot := heldSlot{rkey: c.slotsKey(zone, key), id: id}
	c.slots.mu.Lock()
	l, ok := c.slots.held[slot]
	delete(c.slots.held, slot)
	c.slots.mu.Unlock()
	if ok {
		c.slots.release(slot, l.expires)
	}
}

func (sl *slots) release(slot heldSlot, expires time.Time) {
	sl.pend(pendingRelease{slot, expires})
	sl.poke()
}

// Slots returns the live slots held for key in zone (zones.Slots).
func (c *link) Slots(ctx context.Context, zone, key string) (int64, error) {
	v, err := c.ints(ctx, concurrencyScript, c.slotsKey(zone, key), "p")
	if err != nil {
		return 0, err
	}
	return v[1], nil
}

// releaseRetry is how soon releases Redis did not take are sent again.
const releaseRetry = 250 * time.Millisecond

// slotLoop renews and releases slots until Close, then sends the pending
// releases once more.
func (c *link) slotLoop() {
	defer c.wg.Done()
	sl := &c.slots
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var nextRenew time.Time
	for {
		sl.mu.Lock()
		every, pending := sl.every, len(sl.releases)
		sl.mu.Unlock()
		wait := time.Hour
		if every == 0 {
			nextRenew = time.Time{}
		} else {
			if nextRenew.IsZero() || time.Until(nextRenew) > every {
				nextRenew = time.Now().Add(every)
			}
			wait = time.Until(nextRenew)
		}
		if pending > 0 {
			wait = min(wait, releaseRetry)
		}
		timer.Reset(max(wait, 0))
		select {
		case <-sl.wake:
		case <-timer.C:
		case <-c.ctx.Done():
			ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
			c.sendReleases(ctx)
			cancel()
			return
		}
		asked := sl.now.Swap(false)
		if every > 0 && (asked || !time.Now().Before(nextRenew)) {
			c.renew()
			nextRenew = time.Now().Add(every)
		}
		ctx, cancel := context.WithTimeout(c.ctx, backgroundTimeout(c.opts))
		c.sendReleases(ctx)
		cancel()
	}
}

type renewGroup struct { // the slots of one key with one lease: one script call
	rkey  string
	lease time.Duration
	limit int64
}

// renew extends every slot this instance holds, one script call per key,
// one pipeline per master; with none held, the renewal period resets.
func (c *link) renew() {
	sl := &c.slots
	sl.mu.Lock()
	if len(sl.held) == 0 {
		sl.every = 0
		sl.mu.Unlock()
		return
	}
	groups := make(map[renewGroup]*scriptCall)
	var calls []*scriptCall
	for slot, l := range sl.held {
		g := renewGroup{slot.rkey, l.lease, l.limit}
		if groups[g] == nil {
			groups[g] = &scriptCall{keys: []string{slot.rkey}, args: []any{"r", l.lease.Milliseconds(), l.limit}}
			calls = append(calls, groups[g])
		}
		groups[g].args = append(groups[g].args, slot.id)
	}
	sl.mu.Unlock()

	var gs gates
	start := time.Now()
	ctx, cancel := context.WithTimeout(c.ctx, backgroundTimeout(c.opts))
	defer cancel()
	key := func(sc *scriptCall) string { return sc.keys[0] }
	perGate(c, &gs, calls, key, nil, func(gt *gate, calls []*scriptCall) {
		c.evalAll(ctx, concurrencyScript, calls)
		sl.mu.Lock()
		defer sl.mu.Unlock()
		for _, sc := range calls {
			gt.note(sc.cmd.Err())
			if sc.cmd.Err() != nil {
				continue
			}
			for _, id := range sc.args[3:] {
				slot := heldSlot{sc.keys[0], id.(string)}
				if l, ok := sl.held[slot]; ok {
					l.expires = start.Add(l.lease)
					sl.held[slot] = l
				}
			}
		}
	})
	gs.record()
	var err error
	for _, gt := range gs {
		err = cmp.Or(err, gt.err)
	}
	if err != nil {
		c.logger.Debug("renewing concurrency slots failed", zap.Error(err))
	}
}

// sendReleases removes released slots from Redis, retrying failures until
// their lease ends.
func (c *link) sendReleases(ctx context.Context) {
	sl := &c.slots
	sl.mu.Lock()
	batch := sl.releases
	sl.releases = nil
	sl.mu.Unlock()
	now := time.Now()
	live := slices.DeleteFunc(batch, func(r pendingRelease) bool { return !r.expires.After(now) })
	if len(live) == 0 {
		return
	}
	var gs gates
	key := func(r pendingRelease) string { return r.rkey }
	perGate(c, &gs, live, key, sl.pend, func(gt *gate, rs []pendingRelease) {
		pipe := c.client.Pipeline()
		cmds := make([]*redis.IntCmd, len(rs))
		for i, r := range rs {
			cmds[i] = pipe.ZRem(ctx, r.rkey, r.id)
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		for i, cmd := range cmds {
			if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
				gt.note(err)
				sl.pend(rs[i])
			}
		}
	})
	gs.record()
}

// pend queues r for the next sendReleases without waking the loop: a failed
// release waits releaseRetry.
func (sl *slots) pend(r pendingRelease) {
	sl.mu.Lock()
	sl.releases = append(sl.releases, r)
	sl.mu.Unlock()
}

// perGate groups items by the gate of their key's breaker (refused, if not
// nil, takes those it does not let through) and runs send for each gate's
// share at once, in a pipeline of its own: a hung Cluster master fails only
// its own slots (one pipeline across masters fails every command at its
// deadline).
func perGate[T any](c *link, gs *gates, items []T, key func(T) string, refused func(T), send func(*gate, []T),
) {
	byGate := map[*gate][]T{}
	for _, it := range items {
		if gt := gs.get(c.breakerFor(key(it))); gt.ok {
			byGate[gt] = append(byGate[gt], it)
		} else if refused != nil {
			refused(it)
		}
	}
	var wg sync.WaitGroup
	for gt, share := range byGate {
		wg.Go(func() { send(gt, share) })
	}
	wg.Wait()
}
