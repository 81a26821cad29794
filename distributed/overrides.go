package distributed

import (
	"context"
	_ "embed"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/zones"
)

// A zone's overrides, fleet-wide: one hash <key_prefix><zone>.overrides of
// at most zones.MaxOverrides entries, "o:<id>" → "<expires ms>|<record>",
// and "v", its version, which every instance polls (OverrideVersion) to
// reload the hash when it moves. The records are the caller's (JSON);
// this file only stores them. The hash's TTL reaches the latest expiry
// (a minute past it), or OverridesTTL for overrides that never expire,
// renewed by every change.

//go:embed overrides.lua
var overridesScript string

var overridesLua = redis.NewScript(overridesScript)

// OverridesTTL is the TTL of a zone's overrides when one never expires,
// renewed by every change of the zone's overrides.
const OverridesTTL = 366 * 24 * time.Hour

// ErrTooManyOverrides is PutOverride's error for a zone that holds
// zones.MaxOverrides already.
var ErrTooManyOverrides = errors.New("the zone holds the most overrides it can")

// overridesKey is zone's hash of overrides; zone names have no '.', so it
// is no key's state.
func (c *link) overridesKey(zone string) string { return c.opts.KeyPrefix + zone + ".overrides" }

// PutOverride stores record as zone's override id, expiring at expires
// (zero: never), dropping expired ones, and returns the zone's new version.
func (c *link) PutOverride(ctx context.Context, zone, id string, record []byte, expires time.Time) (int64, error) {
	var ms int64
	if !expires.IsZero() {
		ms = max(1, expires.UnixMilli())
	}
	v, err := c.overridesStep(ctx, zone, id, string(record), ms)
	if err == nil && v < 0 {
		return 0, ErrTooManyOverrides
	}
	return v, err
}

// DeleteOverride removes zone's override id; found is false when there
// was none.
func (c *link) DeleteOverride(ctx context.Context, zone, id string) (found bool, err error) {
	v, err := c.overridesStep(ctx, zone, id, "", 0)
	return v > 0, err
}

func (c *link) overridesStep(ctx context.Context, zone, id, record string, expiresMs int64) (int64, error) {
	rkey := c.overridesKey(zone)
	var v int64
	err := c.background(ctx, rkey, func(ctx context.Context) error {
		var err error
		v, err = overridesLua.Run(ctx, c.client, []string{rkey}, id, record, expiresMs, zones.MaxOverrides, OverridesTTL.Milliseconds()).Int64()
		if err == nil && v > 0 {
			// Every instance hears of it at once; one that does not
			// (its subscription down) sees the version at its next poll.
			_ = c.client.Publish(ctx, c.resetsChannel(), overridesMovedMsg+zone).Err()
		}
		return err
	})
	return v, err
}

// overridesMovedMsg starts the message that tells every instance on the
// resets channel that a zone's overrides changed: "\x01<zone>" (a reset's
// message starts with its zone's name, which has no control character).
const overridesMovedMsg = "\x01"

// OnOverridesMoved makes moved hear, without blocking (give it a buffer of
// 1), of every change of zone's overrides made by any instance, until the
// returned function is called.
func (c *link) OnOverridesMoved(zone string, moved chan<- struct{}) (remove func()) {
	c.resets.mu.Lock()
	if c.resets.moved == nil {
		c.resets.moved = make(map[string][]chan<- struct{})
	}
	c.resets.moved[zone] = append(c.resets.moved[zone], moved)
	c.resets.mu.Unlock()
	return func() {
		c.resets.mu.Lock()
		defer c.resets.mu.Unlock()
		c.resets.moved[zone] = slices.DeleteFunc(c.resets.moved[zone], func(ch chan<- struct{}) bool { return ch == moved })
		if len(c.resets.moved[zone]) == 0 {
			delete(c.resets.moved, zone)
		}
	}
}

// overridesMoved tells zone's listeners that its overrides changed.
func (c *link) overridesMoved(zone string) {
	c.resets.mu.Lock()
	defer c.resets.mu.Unlock()
	for _, ch := range c.resets.moved[zone] {
		select {
		case ch <- struct{}{}:
		default: // already told
		}
	}
}

// overridesTimeout bounds a call about a zone's overrides as a whole. None
// is a decision and no request waits for one; each read on the connection
// is still bounded by its socket timeout (the background timeout), and a
// reload that runs past it is read again at the next poll.
const overridesTimeout = 2 * time.Second

// background runs f, a call about a zone's overrides (the admin API's
// changes, an instance's poll and reload), bounded by overridesTimeout. It
// neither counts toward rkey's breaker nor probes it (an outage is the
// requests' and the heartbeat's to see, as without overrides), and it
// fails at once while the breaker is open.
func (c *link) background(ctx context.Context, rkey string, f func(ctx context.Context) error) error {
	if c.isClosed() {
		return ErrClosed
	}
	if c.breakerFor(rkey).state.Load() != stateClosed {
		return ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, max(c.opts.Timeout, overridesTimeout))
	defer cancel()
	return f(ctx)
}

// OverrideVersion is zone's overrides version, 0 when it has none, read
// in the background (see background).
func (c *link) OverrideVersion(ctx context.Context, zone string) (int64, error) {
	var v int64
	err := c.background(ctx, c.overridesKey(zone), func(ctx context.Context) error {
		var err error
		v, err = c.client.HGet(ctx, c.overridesKey(zone), "v").Int64()
		if errors.Is(err, redis.Nil) {
			v, err = 0, nil
		}
		return err
	})
	return v, err
}

// OverridesChanged drops the deny caches the store's mode keeps of its
// own (async mode's records): a zone's overrides changed, and a denial
// cached under the old limit must not outlive it.
func (c *link) OverridesChanged() { c.mode.forgetDenials() }

// StoredOverride is one override as the store holds it.
type StoredOverride struct {
	ID      string
	Expires time.Time // zero: never
	Record  []byte
}

// LoadOverrides reads zone's overrides that have not expired, and their
// version.
func (c *link) LoadOverrides(ctx context.Context, zone string) (int64, []StoredOverride, error) {
	rkey := c.overridesKey(zone)
	var all map[string]string
	err := c.background(ctx, rkey, func(ctx context.Context) error {
		var err error
		all, err = c.client.HGetAll(ctx, rkey).Result()
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	v, _ := strconv.ParseInt(all["v"], 10, 64)
	now := time.Now()
	out := make([]StoredOverride, 0, len(all))
	for f, val := range all {
		id, ok := strings.CutPrefix(f, "o:")
		if !ok {
			continue
		}
		exp, rec, ok := strings.Cut(val, "|")
		ms, err := strconv.ParseInt(exp, 10, 64)
		if !ok || err != nil {
			continue
		}
		var expires time.Time
		if ms > 0 {
			if expires = time.UnixMilli(ms); !expires.After(now) {
				continue
			}
		}
		out = append(out, StoredOverride{ID: id, Expires: expires, Record: []byte(rec)})
	}
	return v, out, nil
}
