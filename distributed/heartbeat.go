package distributed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every instance beats every heartbeatEvery into a sorted set of instance ids
// scored by expiry (Redis TIME + instanceTTL). The set's size is the number
// of live instances, which fail_policy local divides a zone's limit by.
const (
	heartbeatEvery = time.Second
	// instanceTTL outlives several missed beats: an instance whose beats
	// are late on a loaded machine must not drop out of N (a smaller N
	// hands out larger shares); a dead one is counted a little longer,
	// which only makes shares smaller.
	instanceTTL = 10 * time.Second
)

// heartbeatScript registers ARGV[1] until now+ARGV[2] ms, drops expired ids,
// gives the set itself a TTL (the store writes no key without one), and
// returns the number of live ids.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
`)

// backgroundTimeout bounds the calls no request waits for: heartbeats and
// async syncs. They get a sync interval (or the decision timeout, if
// longer) rather than the decision timeout: on a loaded machine a 20ms bound
// failed healthy heartbeats, and the failures opened the breaker for
// requests. A slow call that succeeds beats a lost one, which for a sync
// only the next sync recovers.
func backgroundTimeout(o Options) time.Duration {
	return max(o.Timeout, o.SyncInterval)
}

func (s *Store) instancesKey() string { return s.opts.KeyPrefix + "instances" }

// Heartbeat registers this instance now and returns the number of live
// instances, which Instances reports from then on. The background loop calls
// it every second; tests call it to avoid waiting.
func (s *Store) Heartbeat(ctx context.Context) (int, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	b := s.breakerFor(s.instancesKey())
	ok, probe := b.allow()
	if !ok {
		return 0, ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, backgroundTimeout(s.opts))
	defer cancel()
	seq := s.beats.sent.Add(1)
	n, err := heartbeatScript.Run(ctx, s.client, []string{s.instancesKey()},
		s.member, instanceTTL.Milliseconds()).Int64()
	b.record(probe, err)
	if err != nil {
		return 0, err
	}
	return s.beats.apply(seq, n, &s.instances), nil
}

// A process is one instance, however many stores it has on one instances
// set: handlers with different settings (strict and async, another
// timeout), or a reload that replaces a store. They all beat as the same
// member (processMember, unless Options.Instance names another), and only
// the last of them to close takes the member out of the set. Counting a
// process twice would halve every fail_policy local share.
var processMember = func() string {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return hex.EncodeToString(id[:])
}()

var live = struct {
	sync.Mutex
	members map[string]int // setID + member -> open stores
}{members: make(map[string]int)}

// memberKey identifies the member a store beats as, in its set.
func (s *Store) memberKey() string {
	return strings.Join(s.opts.Addresses, ",") + "\x00" + strconv.Itoa(s.opts.DB) + "\x00" + s.instancesKey() + "\x00" + s.member
}

func (s *Store) register() {
	live.Lock()
	live.members[s.memberKey()]++
	live.Unlock()
}

// unregister reports whether s was the last open store beating as its
// member, which must then leave the set.
func (s *Store) unregister() (last bool) {
	live.Lock()
	defer live.Unlock()
	k := s.memberKey()
	live.members[k]--
	if live.members[k] > 0 {
		return false
	}
	delete(live.members, k)
	return true
}

// beats orders heartbeat replies. Beats run concurrently (the loop's, and a
// caller's such as a test's) and a reply can arrive late: one sent while two
// of three instances were registered may come back after one that saw all
// three. Only a reply to a beat sent after the last one applied may set the
// count, so the count never goes back to an older view.
type beats struct {
	sent    atomic.Uint64
	mu      sync.Mutex
	applied uint64
	last    int64
}

// apply records the reply n to beat seq in instances, unless a later beat's
// reply was applied already, and returns the count in force.
func (b *beats) apply(seq uint64, n int64, instances *atomic.Int64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if seq > b.applied {
		b.applied, b.last = seq, max(n, 1)
		instances.Store(b.last)
	}
	return int(b.last)
}

// heartbeatLoop beats at once, then every heartbeatEvery until Close. While
// the breaker is open the beats double as its probes, so Health recovers
// without traffic.
func (s *Store) heartbeatLoop() {
	defer s.wg.Done()
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		_, _ = s.Heartbeat(s.ctx)
		_ = s.Outages() // retires (and logs) Cluster masters replaced by a replica
		s.forgetMissed()
		select {
		case <-t.C:
		case <-s.done:
			return
		}
	}
}
