package distributed

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// Every instance beats every heartbeatEvery into a sorted set of ids scored
// by expiry (Redis TIME + instanceTTL): its size is the number of live
// instances, which fail_policy local divides a zone's limit by.
const (
	heartbeatEvery = time.Second
	// instanceTTL outlives several missed beats: a late instance must not
	// drop out of N (a smaller N hands out larger shares); a dead one
	// counted a little longer only makes shares smaller.
	instanceTTL = 10 * time.Second
)

//go:embed heartbeat.lua
var heartbeatLua string

var heartbeatScript = redis.NewScript(heartbeatLua)

// backgroundTimeout bounds the calls no request waits for (heartbeats,
// async syncs): a sync interval, or the decision timeout if longer: a tight
// bound fails healthy heartbeats on a loaded machine and opens the breaker.
func backgroundTimeout(o Options) time.Duration {
	return max(o.Timeout, o.SyncInterval)
}

func (c *link) instancesKey() string { return c.opts.KeyPrefix + "instances" }

// recoveryKey marks a recovery of the slots after Redis lost its data
// (concurrency.lua builds the same name): under the key prefix, as an ACL
// of ~<prefix>* allows, in the instances set's slot.
func (c *link) recoveryKey() string {
	return c.opts.KeyPrefix + "{" + c.instancesKey() + "}slots-recovery"
}

// slotsRecovery is how long, after Redis lost its data, no instance takes a
// new slot while each takes back its running requests' slots: every next
// heartbeat (within heartbeatEvery, or two seconds late on a loaded
// machine) sees the recovery and renews at once.
const slotsRecovery = 3 * time.Second

// Heartbeat registers this instance and returns the number of live
// instances (Instances from then on); a beat that finds a recovery of the
// slots on renews them at once.
func (c *link) Heartbeat(ctx context.Context) (int, error) {
	recovering := false
	n, err := c.beats.run(&c.instances, func() (int64, error) {
		if c.isClosed() {
			return 0, ErrClosed
		}
		b := c.breakerFor(c.instancesKey())
		ok, probe := b.allow()
		if !ok {
			return 0, ErrUnavailable
		}
		ctx, cancel := context.WithTimeout(ctx, backgroundTimeout(c.opts))
		defer cancel()
		v, err := heartbeatScript.Run(ctx, c.client, []string{c.instancesKey(), c.recoveryKey()},
			c.member, instanceTTL.Milliseconds(), b2i(c.beatRecently()), slotsRecovery.Milliseconds()).Int64Slice()
		if err == nil && len(v) != 2 {
			err = errBadReply
		}
		b.recordBeat(probe, err)
		if err != nil {
			return 0, err
		}
		c.lastBeat.Store(max(1, monotime.Now()))
		recovering = v[1] == 1
		return v[0], nil
	})
	if recovering {
		c.slots.renewNow()
	}
	return n, err
}

// beatRecently: the instances set must exist unless Redis lost its data.
func (c *link) beatRecently() bool {
	last := c.lastBeat.Load()
	return last != 0 && monotime.Since(last) < instanceTTL/2
}

// A process is one instance however many stores it has on one set
// (handlers with other settings, a reload): they beat as one member
// (unless Options.Instance names another), and the last to close takes it
// out. Counting a process twice would halve every fail_policy local share.
var processMember = randomID()

// randomID is 8 random bytes in hex.
func randomID() string {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

var live = struct {
	sync.Mutex
	members map[string]int // memberKey -> open stores
}{members: make(map[string]int)}

// memberKey identifies the member a store beats as, in its set (live).
func (c *link) memberKey() string {
	return strings.Join(c.opts.Addresses, ",") + "\x00" + strconv.Itoa(c.opts.DB) + "\x00" + c.instancesKey() + "\x00" + c.member
}

// openStores adds delta (1: a store opens, -1: it closes) to the stores
// open as c's member and returns how many are: the last to close (0) must
// take the member out of the set.
func (c *link) openStores(delta int) int {
	live.Lock()
	defer live.Unlock()
	k := c.memberKey()
	live.members[k] += delta
	n := live.members[k]
	if n <= 0 {
		delete(live.members, k)
	}
	return n
}

// beats runs one heartbeat at a time, so that the last reply applied is
// the last beat Redis ran: an older count applied last would make shares too large.
type beats struct {
	mu sync.Mutex
}

// run runs beat alone and stores the live instances it counts, at least 1.
func (b *beats) run(instances *atomic.Int64, beat func() (int64, error)) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := beat()
	if err != nil {
		return 0, err
	}
	n = max(n, 1)
	instances.Store(n)
	return int(n), nil
}

// heartbeatLoop beats now and every heartbeatEvery until Close; beats probe
// an open breaker, so Health recovers without traffic.
func (c *link) heartbeatLoop() {
	defer c.wg.Done()
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		_, _ = c.Heartbeat(c.ctx)
		_ = c.Outages() // retires (and logs) Cluster masters replaced by a replica
		c.forgetMissed()
		select {
		case <-t.C:
		case <-c.ctx.Done():
			return
		}
	}
}
