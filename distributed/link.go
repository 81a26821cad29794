package distributed

import (
	"cmp"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/zones"
)

// link is one Redis setting as a store of either mode uses it; only what
// start is handed depends on the mode.
type link struct {
	opts    Options
	client  redis.UniversalClient
	gcra    *redis.Script // gcra.lua: the batcher's GCRA steps
	quota   *redis.Script // quota.lua: its quota steps
	cluster bool          // a batch's GCRA steps go in one call per hash slot
	logger  *zap.Logger
	breaker breaker      // the whole setting's; on a Cluster, for calls about no key
	nodes   nodeBreakers // on a Cluster, one breaker per master (breaker.go)

	queue chan *request
	idle  chan struct{} // slots for calls that skip the idle queue

	instanceID string // this store's: async reports, concurrency slots
	member     string // this process's, in the instances set
	instances  atomic.Int64
	lastBeat   atomic.Int64 // monotime of the last successful heartbeat; 0 before
	beats      beats

	problems problems
	resets   resets
	mode     modeState // what the store's mode keeps of its own (resets.go)
	pubsub   *redis.PubSub

	slots slots // concurrency slots this instance holds (concurrency.go)

	ctx       context.Context // cancelled by Close: calls return ErrClosed, loops end
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// newLink sets up the link for opts, contacting nothing and starting
// nothing (see Open).
func newLink(opts Options, logger *zap.Logger) (*link, error) {
	opts = opts.withDefaults()
	uopts, err := opts.universalOptions()
	if err != nil {
		return nil, err
	}
	logger = cmp.Or(logger, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	c := &link{
		opts:       opts,
		client:     redis.NewUniversalClient(uopts),
		gcra:       redis.NewScript(gcraScript),
		quota:      redis.NewScript(quotaScript),
		logger:     logger,
		queue:      make(chan *request, queueDepth),
		idle:       make(chan struct{}, idleCallers),
		instanceID: randomID(),
		member:     cmp.Or(opts.Instance, processMember),
		breaker:    breaker{logger: logger, redis: opts.Redacted(), hint: opts.hint},
		problems:   problems{logger: logger},
		slots:      slots{held: make(map[heldSlot]heldLease), wake: make(chan struct{}, 1)},
		resets:     resets{listeners: make(map[string][]*ResetListener), moved: make(map[string][]chan<- struct{})},
		ctx:        ctx,
		cancel:     cancel,
	}
	_, c.cluster = c.client.(*redis.ClusterClient)
	if opts.SentinelMaster != "" {
		dials := &masterDials{}
		c.client.AddHook(dials)
		c.breaker.master = dials.last
	}
	c.nodes.init(c.client, &c.breaker)
	c.instances.Store(1)
	return c, nil
}

func (c *link) start(mode modeState) {
	c.mode = mode
	c.openStores(1)
	c.wg.Add(workers + 3)
	for range workers {
		go c.worker()
	}
	go c.heartbeatLoop()
	go c.slotLoop()
	c.pubsub = c.client.Subscribe(c.ctx) // no channel yet: no connection
	go c.subscribeLoop(c.pubsub)
}

// Close stops the workers and loops, removes this instance from the
// instances set (best effort, bounded) and closes the client.
func (c *link) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.cancel()
		_ = c.pubsub.Close()
		c.wg.Wait()
		last := c.openStores(-1) <= 0
		if c.breakerFor(c.instancesKey()).closed() && last {
			ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
			c.client.ZRem(ctx, c.instancesKey(), c.member)
			cancel()
		}
		err = c.client.Close()
	})
	return err
}

func (c *link) isClosed() bool { return c.ctx.Err() != nil }

// Health reports whether Redis is reachable and, if not, since when the
// earliest outage began; on a Cluster false while any master serving
// slots is unreachable (Outages says which).
func (c *link) Health() (ok bool, openSince time.Time) {
	ok = true
	for _, o := range c.Outages() {
		if ok || o.Since.Before(openSince) {
			ok, openSince = false, o.Since
		}
	}
	return ok, openSince
}

// Outages lists what the store cannot reach: on a Cluster each master still
// serving slots whose calls fail, otherwise the setting (on Sentinel, naming
// the master).
func (c *link) Outages() []NodeOutage {
	down := c.nodes.retire(c.ctx)
	if o, failing := c.breaker.outage(); failing {
		down = append(down, o)
	}
	return down
}

// LastProblem is the last per-key error Redis reported and when ("": none).
func (c *link) LastProblem() (string, time.Time) { return c.problems.last() }

// Instances is the number of live instances the last successful heartbeat
// saw (1 before the first), kept through an outage.
func (c *link) Instances() int { return int(c.instances.Load()) }

func (c *link) breakerFor(rkey string) *breaker {
	return c.nodes.breakerFor(c.ctx, rkey)
}

func (c *link) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.opts.Timeout)
}

// unbatched runs f, a call about rkey that skips the batcher, through
// rkey's breaker and bounded by the timeout.
func (c *link) unbatched(ctx context.Context, rkey string, f func(ctx context.Context) error) error {
	if c.isClosed() {
		return ErrClosed
	}
	b := c.breakerFor(rkey)
	ok, probe := b.allow()
	if !ok {
		return ErrUnavailable
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	err := f(ctx)
	b.record(probe, err)
	return err
}

// ints runs script (not gcra.lua or quota.lua; at most 5 args) for rkey
// unbatched or in ctx's Gather and reads its two integers; a nil script
// reads rkey's PTTL into v[0] (ms; -2: no key, -1: no expiry).
func (c *link) ints(ctx context.Context, script *redis.Script, rkey string, args ...any) (v [2]int64, err error) {
	err = c.unbatched(ctx, rkey, func(ctx context.Context) error {
		var a [5]any
		copy(a[:], args)
		if rep, ok := c.gathered(ctx, script, rkey, a); ok {
			v = rep.ints
			return rep.err
		}
		if script == nil {
			var err error
			v[0], err = c.client.Do(ctx, "PTTL", rkey).Int64()
			return err
		}
		got, err := script.Run(ctx, c.client, []string{rkey}, args...).Int64Slice()
		if err == nil && len(got) != 2 {
			return errBadReply
		}
		copy(v[:], got)
		return err
	})
	return v, err
}

// reset deletes rkey, the state of key in zone, and tells every instance.
func (c *link) reset(ctx context.Context, rkey, zone, key string) error {
	msg := zone + "\x00" + key
	return c.unbatched(ctx, rkey, func(ctx context.Context) error {
		pipe := c.client.Pipeline()
		pipe.Del(ctx, rkey)
		// Noted even if the reply is lost: Redis may have published it.
		c.resets.published(msg)
		pipe.Publish(ctx, c.resetsChannel(), msg)
		_, err := pipe.Exec(ctx)
		return err
	})
}

// slotsKey is the Redis key of key's concurrency slots in zone, in either
// mode (a concurrency zone has no GCRA state to collide with).
func (c *link) slotsKey(zone, key string) string {
	return c.opts.KeyPrefix + zone + ":" + key
}

// A zone's current bans, fleet-wide, for the admin list and async mode: a
// sorted set <key_prefix><zone>.bans, best effort (a failed write leaves a
// ban out, never lifts one). Running bans pushed off the list, and a ban
// whose write failed, go to RecordBan's dropped: in async mode they reach
// no other instance. A ban's score is its end in Unix ms × 64 + its level
// (< 64), exact in a double for any end before the year 30,000.
func banScore(endMs int64, level int) float64 {
	return float64(endMs*64 + int64(min(max(level, 0), 63)))
}

// bansKey is the sorted set of zone's bans (zone names have no '.').
func (c *link) bansKey(zone string) string { return c.opts.KeyPrefix + zone + ".bans" }

// RecordBan adds key's ban to zone's list in the background (bounded).
func (c *link) RecordBan(zone, key string, left, longest time.Duration, level int, dropped func(n int64)) {
	if c.isClosed() {
		return
	}
	end := time.Now().Add(left).UnixMilli()
	go func() {
		rkey := c.bansKey(zone)
		err := c.unbatched(context.Background(), rkey, func(ctx context.Context) error {
			pipe := c.client.Pipeline()
			pipe.ZAdd(ctx, rkey, redis.Z{Score: banScore(end, level), Member: key})
			pipe.ZRemRangeByScore(ctx, rkey, "-inf", strconv.FormatInt(time.Now().UnixMilli()*64+63, 10))
			over := pipe.ZRemRangeByRank(ctx, rkey, 0, -zones.MaxListedBans-1)
			pipe.PExpire(ctx, rkey, longest+time.Second)
			_, err := pipe.Exec(ctx)
			if n := over.Val(); err == nil && n > 0 && dropped != nil {
				dropped(n) // running bans: the ended ones went first
			}
			return err
		})
		if err != nil && dropped != nil {
			dropped(1) // this ban, most likely not listed
		}
	}()
}

// LiftBan removes key from zone's list of bans.
func (c *link) LiftBan(ctx context.Context, zone, key string) error {
	rkey := c.bansKey(zone)
	return c.unbatched(ctx, rkey, func(ctx context.Context) error {
		return c.client.ZRem(ctx, rkey, key).Err()
	})
}

// ListBans reads zone's current bans, longest left first.
func (c *link) ListBans(ctx context.Context, zone string) ([]zones.Ban, error) {
	rkey := c.bansKey(zone)
	var got []redis.Z
	now := time.Now().UnixMilli()
	err := c.unbatched(ctx, rkey, func(ctx context.Context) error {
		var err error
		got, err = c.client.ZRevRangeByScoreWithScores(ctx, rkey, &redis.ZRangeBy{
			Min: "(" + strconv.FormatInt(now*64+63, 10), Max: "+inf", Count: zones.MaxListedBans}).Result()
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]zones.Ban, 0, len(got))
	for _, z := range got {
		k, _ := z.Member.(string)
		v := int64(z.Score)
		out = append(out, zones.Ban{Key: k, Left: time.Duration(v/64-now) * time.Millisecond, Level: int(v % 64)})
	}
	return out, nil
}

// SyncInterval is how often the async store syncs and reads its bans.
func (a *Async) SyncInterval() time.Duration { return a.opts.SyncInterval }
