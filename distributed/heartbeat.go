package distributed

import (
	"context"
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

// heartbeatScript registers ARGV[1] until now+ARGV[2] ms, drops expired ids
// and the ids in ARGV[3...] (stores of this process that closed while Redis
// was unreachable), gives the set itself a TTL (the store writes no key
// without one), and returns the number of live ids.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 3, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
end
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
	orphans := s.orphans.take()
	args := append([]any{s.instanceID, instanceTTL.Milliseconds()}, orphans...)
	n, err := heartbeatScript.Run(ctx, s.client, []string{s.instancesKey()}, args...).Int64()
	b.record(probe, err)
	if err != nil {
		s.orphans.add(orphans...)
		return 0, err
	}
	return s.beats.apply(seq, n, &s.instances), nil
}

// A reload that changes the Redis settings (timeout, mode...) replaces a
// process's store by another on the same instances set. The old one takes
// its id out of the set when it closes, unless Redis is unreachable then: it
// hands the id to a live store of the process on the same set, whose next
// successful beat removes it, so that the process is not counted twice
// (which would halve every fail_policy local share) for instanceTTL.
var live = struct {
	sync.Mutex
	bySet map[string]map[*Store]struct{}
}{bySet: make(map[string]map[*Store]struct{})}

// setID identifies the instances set a store beats into.
func (s *Store) setID() string {
	return strings.Join(s.opts.Addresses, ",") + "\x00" + strconv.Itoa(s.opts.DB) + "\x00" + s.instancesKey()
}

func (s *Store) register() {
	live.Lock()
	defer live.Unlock()
	id := s.setID()
	if live.bySet[id] == nil {
		live.bySet[id] = make(map[*Store]struct{})
	}
	live.bySet[id][s] = struct{}{}
}

// unregister removes s from the live stores and, when removed is false
// (its id is still in the set), hands its id to another live store.
func (s *Store) unregister(removed bool) {
	live.Lock()
	defer live.Unlock()
	id := s.setID()
	delete(live.bySet[id], s)
	if len(live.bySet[id]) == 0 {
		delete(live.bySet, id)
		return
	}
	if removed {
		return
	}
	for heir := range live.bySet[id] {
		heir.orphans.add(append([]any{s.instanceID}, s.orphans.take()...)...)
		return
	}
}

// orphans are ids of closed stores that the next beat removes.
type orphans struct {
	mu  sync.Mutex
	ids []any
}

func (o *orphans) add(ids ...any) {
	o.mu.Lock()
	o.ids = append(o.ids, ids...)
	o.mu.Unlock()
}

func (o *orphans) take() []any {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := o.ids
	o.ids = nil
	return ids
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
		select {
		case <-t.C:
		case <-s.done:
			return
		}
	}
}
