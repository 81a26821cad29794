package distributed

import (
	"context"
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
	ok, probe := s.breaker.allow()
	if !ok {
		return 0, ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, backgroundTimeout(s.opts))
	defer cancel()
	n, err := heartbeatScript.Run(ctx, s.client, []string{s.instancesKey()},
		s.instanceID, instanceTTL.Milliseconds()).Int64()
	s.breaker.record(probe, err)
	if err != nil {
		return 0, err
	}
	n = max(n, 1)
	s.instances.Store(n)
	return int(n), nil
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
		select {
		case <-t.C:
		case <-s.done:
			return
		}
	}
}
