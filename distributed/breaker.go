package distributed

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Breaker tuning: warnAfter consecutive failures are an outage (one slow
// call is not); after tripAfter the store stops calling Redis for coolDown,
// then lets one probe through.
const (
	warnAfter = 2
	tripAfter = 5
	coolDown  = time.Second
)

const (
	stateClosed  int32 = iota // calls go to Redis
	stateOpen                 // calls fail with ErrUnavailable until retryAt
	stateProbing              // one probe is in flight; other calls fail
)

// breaker stops an outage from costing every request its full timeout. An
// outage starts at the warnAfter-th consecutive failed call (the breaker
// opens at the tripAfter-th) and ends at the next success: one WARN and one
// INFO line, never one per request. Closed (the hot path), it costs one
// atomic load per call.
type breaker struct {
	state    atomic.Int32
	failures atomic.Int32 // consecutive, while closed
	refused  atomic.Bool  // the last failure was refusedToUser (see recordBeat)

	mu        sync.Mutex
	retryAt   time.Time // when open: the earliest probe
	openSince time.Time // start of the current outage
	warned    bool      // an outage is logged and not yet over

	logger *zap.Logger
	redis  string // redacted address, for the log lines

	// On a Cluster: the master this breaker is for, a key it served (to
	// tell when its slots have moved), and onFailure (reload the slot map).
	node, sample string
	onFailure    func()
	hint         func(error) string // a likely cause for the WARN line
	// master (Sentinel): the master the client last connected to; the WARN
	// line names the one that went away (downMaster, for Outages), the INFO
	// line the one that answered again.
	master     func() string
	downMaster string
}

// allow reports whether a call may go to Redis, and whether it is the probe
// whose result decides between closing and re-opening.
func (b *breaker) allow() (ok, probe bool) {
	if b.state.Load() == stateClosed {
		return true, false
	}
	b.mu.Lock()
	if b.state.Load() == stateOpen && !time.Now().Before(b.retryAt) {
		b.state.Store(stateProbing)
		b.mu.Unlock()
		return true, true
	}
	ok = b.state.Load() == stateClosed
	b.mu.Unlock()
	if !ok && b.onFailure != nil {
		b.onFailure()
	}
	return ok, false
}

// record feeds the outcome of a call that allow let through. Errors that
// prove Redis answered (a script error, a wrong type) count as successes.
func (b *breaker) record(probe bool, err error) {
	failed := err != nil && unreachable(err)
	if failed {
		b.refused.Store(refusedToUser(err))
		if b.onFailure != nil {
			b.onFailure()
		}
	}
	if probe && errors.Is(err, context.Canceled) {
		b.probeAgain() // the probe's caller gave up (or the store is closing): no verdict
		return
	}
	if !probe {
		if b.state.Load() != stateClosed {
			return // a late result from before the outage was detected
		}
		if !failed {
			if b.failures.Load() == 0 {
				return
			}
			b.failures.Store(0)
		} else if n := b.failures.Add(1); n < tripAfter && n != warnAfter {
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	switch {
	case !failed && (probe || b.state.Load() == stateClosed):
		b.failures.Store(0)
		b.state.Store(stateClosed)
		if !b.warned {
			return
		}
		b.warned = false
		fields := []zap.Field{zap.String("redis", b.redis), zap.Duration("outage", now.Sub(b.openSince))}
		if b.master != nil {
			if m := b.master(); m != "" {
				fields = append(fields, zap.String("master", m))
				if b.downMaster != "" && b.downMaster != m {
					fields = append(fields, zap.String("previous_master", b.downMaster))
				}
			}
		}
		b.logger.Info("redis reachable again", fields...)
	case probe:
		b.retryAt = now.Add(coolDown)
		b.state.Store(stateOpen)
	case b.state.Load() == stateClosed && b.failures.Load() >= warnAfter:
		if b.failures.Load() >= tripAfter {
			b.retryAt = now.Add(coolDown)
			b.state.Store(stateOpen)
		}
		if b.warned {
			return // the outage's WARN is logged: the breaker opening adds none
		}
		b.warned, b.openSince = true, now
		fields := []zap.Field{zap.String("redis", b.redis), zap.Error(err)}
		if b.master != nil {
			b.downMaster = b.master()
			if b.downMaster != "" {
				fields = append(fields, zap.String("master", b.downMaster))
			}
		}
		if b.hint != nil {
			if h := b.hint(err); h != "" {
				fields = append(fields, zap.String("hint", h))
			}
		}
		b.logger.Warn("redis unreachable; zones apply their fail_policy", fields...)
	}
}

// recordBeat feeds the outcome of a heartbeat that allow let through. A beat
// that succeeds ends an outage of no answer (Health recovers without
// traffic), but not one of calls refused to tally's ACL user (the beat uses
// other commands): else each beat would end the outage and the next calls
// start another (a WARN and an INFO line a second).
func (b *breaker) recordBeat(probe bool, err error) {
	if err == nil && b.refused.Load() && (probe || b.failures.Load() != 0) {
		if probe {
			b.probeAgain()
		}
		return
	}
	b.record(probe, err)
}

// probeAgain ends a probe that gave no verdict: the breaker stays open and
// the next call probes.
func (b *breaker) probeAgain() {
	b.mu.Lock()
	b.retryAt = time.Now()
	b.state.Store(stateOpen)
	b.mu.Unlock()
}

// outage reports whether calls are failing (an outage is logged) and the
// outage for the admin API: its node is b's Cluster master, or the master
// a Sentinel setting was connected to when it began.
func (b *breaker) outage() (NodeOutage, bool) {
	if b.state.Load() == stateClosed && b.failures.Load() < warnAfter {
		return NodeOutage{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return NodeOutage{Node: cmp.Or(b.node, b.downMaster), Since: b.openSince, Open: b.state.Load() != stateClosed}, b.warned
}

// closed reports whether calls go to Redis.
func (b *breaker) closed() bool { return b.state.Load() == stateClosed }

// gates lets a background pipeline over many keys through their breakers:
// one allow and one record per breaker and round, as if each master's share
// were one call.
type gates []*gate

type gate struct {
	b         *breaker
	ok, probe bool
	err       error // the first error among b's calls
	answered  int   // keys Redis answered (an async sync's)
}

// get is b's gate, asking b once.
func (gs *gates) get(b *breaker) *gate {
	for _, g := range *gs {
		if g.b == b {
			return g
		}
	}
	g := &gate{b: b}
	g.ok, g.probe = b.allow()
	*gs = append(*gs, g)
	return g
}

func (g *gate) note(err error) {
	if g.err == nil {
		g.err = err
	}
}

// busy reports whether g's error is a busy Redis, not a down one: a timeout
// after Redis answered part of the sync through g.
func (g *gate) busy() bool {
	return g.answered > 0 && (errors.Is(g.err, context.DeadlineExceeded) || isTimeout(g.err))
}

// record tells each breaker that let calls through how they went; a busy
// Redis answered.
func (gs gates) record() {
	for _, g := range gs {
		if !g.ok {
			continue
		}
		err := g.err
		if g.busy() {
			err = nil
		}
		g.b.record(g.probe, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// unreachable tells failures of Redis (no answer, or an answer saying it
// cannot serve) from errors about the request itself.
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up; says nothing about Redis
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		// OOM (maxmemory with noeviction) and NOPERM (an ACL user
		// missing a command or key pattern) refuse every write until an
		// operator acts: an outage, logged once, not an error per request.
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "NOAUTH", "WRONGPASS", "OOM", "NOPERM"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return refusedToUser(err)
	}
	return true
}

// refusedToUser reports whether err is Redis refusing a command or key to
// tally's ACL user: other commands (the heartbeat's) may still succeed.
func refusedToUser(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	// A command a script calls that the ACL user may not run is reported
	// as ERR, not NOPERM.
	msg := rerr.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.HasPrefix(msg, "ERR The user executing the script can't run")
}

// On Redis Cluster a dead master costs only the keys whose slots it
// serves: one breaker per master, found through the client's slot map. A
// failure, or a call refused by an open breaker, reloads the slot map (at
// most every reloadEvery): once a replica is promoted, its slots map to the
// new master, whose breaker is closed, without waiting for a probe of the
// dead node, whose breaker is retired (logged once).
const reloadEvery = 100 * time.Millisecond

type nodeBreakers struct {
	cluster *redis.ClusterClient // nil unless the store is on a Cluster
	// unmapped covers calls made before the client has a slot map, so that
	// a cluster unreachable from the start is not asked for one per call.
	unmapped breaker
	// nodes maps master addresses to breakers, copied on write: the
	// lookup per call takes no lock and allocates nothing.
	nodes      atomic.Pointer[map[string]*breaker]
	nodesMu    sync.Mutex   // serialises writers of nodes
	lastReload atomic.Int64 // unix ns
	store      *breaker     // whose logger, address and hint every node's shares
}

// init sets the breakers up for client, logging like store.
func (n *nodeBreakers) init(client redis.UniversalClient, store *breaker) {
	n.cluster, _ = client.(*redis.ClusterClient)
	n.store = store
	n.unmapped.logger, n.unmapped.redis, n.unmapped.hint = store.logger, store.redis, store.hint
	n.unmapped.onFailure = n.reload
	n.nodes.Store(&map[string]*breaker{})
}

// breakerFor returns the breaker of the Cluster master serving key, or
// store off a Cluster.
func (n *nodeBreakers) breakerFor(ctx context.Context, key string) *breaker {
	if n.cluster == nil {
		return n.store
	}
	if n.unmapped.state.Load() != stateClosed {
		return &n.unmapped
	}
	c, err := n.cluster.MasterForKey(ctx, key)
	if err != nil {
		return &n.unmapped
	}
	addr := c.Options().Addr
	if b := (*n.nodes.Load())[addr]; b != nil {
		return b
	}
	n.nodesMu.Lock()
	defer n.nodesMu.Unlock()
	m := maps.Clone(*n.nodes.Load())
	if m[addr] == nil {
		m[addr] = &breaker{logger: n.store.logger, redis: n.store.redis + " node " + addr, hint: n.store.hint, node: addr, sample: key, onFailure: n.reload}
		n.nodes.Store(&m)
	}
	return m[addr]
}

// reload reloads the Cluster's slot map in the background, at most every
// reloadEvery.
func (n *nodeBreakers) reload() {
	if n.cluster == nil {
		return
	}
	now := time.Now().UnixNano()
	last := n.lastReload.Load()
	if now-last < int64(reloadEvery) || !n.lastReload.CompareAndSwap(last, now) {
		return
	}
	n.cluster.ReloadState(context.Background())
}

// retire forgets, logging it once, the breakers of nodes that no longer
// serve their slots, and returns the outages of the masters still in use.
func (n *nodeBreakers) retire(ctx context.Context) (down []NodeOutage) {
	if n.cluster == nil {
		return nil
	}
	if o, failing := n.unmapped.outage(); failing {
		down = append(down, o)
	}
	for addr, b := range *n.nodes.Load() {
		o, failing := b.outage()
		if !failing {
			continue
		}
		c, err := n.cluster.MasterForKey(ctx, b.sample)
		if err == nil && c.Options().Addr != addr {
			n.nodesMu.Lock()
			if m := maps.Clone(*n.nodes.Load()); m[addr] == b { // else a concurrent retire dropped it
				delete(m, addr)
				n.nodes.Store(&m)
				n.store.logger.Info("redis node replaced: its slots are served by another master now",
					zap.String("redis", n.store.redis), zap.String("node", addr),
					zap.String("new_master", c.Options().Addr), zap.Duration("outage", time.Since(o.Since)))
			}
			n.nodesMu.Unlock()
			continue
		}
		n.reload()
		down = append(down, o)
	}
	return down
}

// NodeOutage is a Redis node the store cannot reach: a Cluster master
// (Node is its address; "" before the slot map is known), or the whole
// setting for a standalone server (Node is "") or Sentinel (Node is the
// master it was connected to when the outage began, "" if none yet).
// Open is false while calls fail but the breaker still lets them through.
type NodeOutage struct {
	Node  string
	Since time.Time
	Open  bool
}

// masterDials records the master each new connection of a Sentinel
// setting's client reached (a hook on the client sees none of the
// Sentinels'), for the breaker's lines.
type masterDials struct{ addr atomic.Pointer[string] }

func (m *masterDials) last() string {
	if p := m.addr.Load(); p != nil {
		return *p
	}
	return ""
}

func (m *masterDials) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			if a := c.RemoteAddr().String(); a != m.last() {
				m.addr.Store(&a)
			}
		}
		return c, err
	}
}

func (*masterDials) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (*masterDials) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
