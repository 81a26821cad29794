package distributed

import (
	"context"
	_ "embed"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/zones"
)

// A zone's overrides, fleet-wide: one hash <key_prefix><zone>.overrides
// (overrides.lua has its layout); the records are the caller's JSON.

var (
	//go:embed overrides.lua
	overridesScript string
	//go:embed overrides_read.lua
	overridesReadScript string

	overridesLua     = redis.NewScript(overridesScript)
	overridesReadLua = redis.NewScript(overridesReadScript)
)

// OverridesTTL is the TTL of a zone's overrides when one never expires,
// renewed by every change.
const OverridesTTL = 366 * 24 * time.Hour

func (c *link) overridesKey(zone string) string { return c.opts.KeyPrefix + zone + ".overrides" }

// overrides is the link's zones.OverrideStore. No call counts toward or
// probes its key's breaker (outages are the requests' and heartbeat's to
// see); each fails at once while it is open and is bounded by
// overridesTimeout. A change, and a read that finds one, drops the mode's
// deny caches: a denial cached under the old limit must not outlive it.
func (c *link) overrides() *zones.OverrideStore {
	return &zones.OverrideStore{
		Put: func(ctx context.Context, zone string, o zones.StoredOverride) (int64, error) {
			v, err := c.overridesStep(ctx, zone, "put", o)
			if err == nil && v < 0 {
				return 0, zones.ErrTooManyOverrides
			}
			return v, err
		},
		Delete: func(ctx context.Context, zone, id string) (bool, error) {
			v, err := c.overridesStep(ctx, zone, "del", zones.StoredOverride{ID: id})
			return v > 0, err
		},
		Read: c.readOverrides,
		Restore: func(ctx context.Context, zone string, list []zones.StoredOverride) (int, error) {
			v, err := c.overridesStep(ctx, zone, "restore", list...)
			return int(v), err
		},
		Moved: func(zone string, moved chan<- struct{}) (remove func()) {
			return listen(&c.resets.mu, c.resets.moved, zone, moved)
		},
	}
}

// overridesStep runs overrides.lua's op and tells every instance of a change.
func (c *link) overridesStep(ctx context.Context, zone, op string, list ...zones.StoredOverride) (int64, error) {
	rkey := c.overridesKey(zone)
	args := []any{op, zones.MaxOverrides, OverridesTTL.Milliseconds()}
	for _, o := range list {
		if op == "del" {
			args = append(args, o.ID)
			continue
		}
		var ms int64
		if !o.Expires.IsZero() {
			ms = max(1, o.Expires.UnixMilli())
		}
		args = append(args, o.ID, ms, o.Record)
	}
	var v int64
	err := c.background(ctx, rkey, func(ctx context.Context) error {
		var err error
		v, err = overridesLua.Run(ctx, c.client, []string{rkey}, args...).Int64()
		if err == nil && v > 0 {
			c.mode.forgetDenials()
			// One that does not hear it reads it at its next poll.
			_ = c.client.Publish(ctx, c.resetsChannel(), overridesMovedMsg+zone).Err()
		}
		return err
	})
	return v, err
}

// overridesMovedMsg starts the resets channel's message "\x01<zone>": zone's
// overrides changed (a reset's starts with a zone name).
const overridesMovedMsg = "\x01"

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

// overridesTimeout bounds a call about overrides: none is a decision, and a
// reload that runs past it is read again at the next poll.
const overridesTimeout = 2 * time.Second

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

// readOverrides leaves lapsed overrides out of a whole read.
func (c *link) readOverrides(ctx context.Context, zone string, at zones.OverridesAt) (zones.OverridesRead, error) {
	rkey := c.overridesKey(zone)
	var out zones.OverridesRead
	err := c.background(ctx, rkey, func(ctx context.Context) error {
		reply, err := overridesReadLua.Run(ctx, c.client, []string{rkey}, at.Epoch, at.Version).StringSlice()
		if err != nil {
			return err
		}
		if len(reply) < 2 {
			return errors.New("overrides_read.lua: a short reply")
		}
		out = zones.OverridesRead{At: zones.OverridesAt{Epoch: reply[0]}, All: reply[0] == ""} // "": the store holds none
		out.At.Version, _ = strconv.ParseInt(reply[1], 10, 64)
		if len(reply) == 3 && reply[2] == "all" {
			out.All = true
			all, err := c.client.HGetAll(ctx, rkey).Result()
			if err != nil {
				return err
			}
			// at the hash's version now, maybe past the script's
			out.At.Epoch = all["e"]
			out.At.Version, _ = strconv.ParseInt(all["v"], 10, 64)
			now := time.Now()
			for f, val := range all {
				if id, ok := strings.CutPrefix(f, "o:"); ok {
					if o, ok := parseStoredOverride(id, val); ok && (o.Expires.IsZero() || o.Expires.After(now)) {
						out.Changes = append(out.Changes, o)
					}
				}
			}
		}
		for i := 2; i+1 < len(reply); i += 2 { // none after "all"
			if o, ok := parseStoredOverride(reply[i], reply[i+1]); ok {
				out.Changes = append(out.Changes, o)
			}
		}
		if len(out.Changes) > 0 {
			c.mode.forgetDenials()
		}
		return nil
	})
	return out, err
}

// parseStoredOverride reads "<expires ms>|<version>|<record>" ("": removed).
func parseStoredOverride(id, val string) (zones.StoredOverride, bool) {
	if val == "" {
		return zones.StoredOverride{ID: id}, true
	}
	exp, rest, ok1 := strings.Cut(val, "|")
	ver, rec, ok2 := strings.Cut(rest, "|")
	ms, err1 := strconv.ParseInt(exp, 10, 64)
	v, err2 := strconv.ParseInt(ver, 10, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil {
		return zones.StoredOverride{}, false
	}
	o := zones.StoredOverride{ID: id, Version: v, Record: []byte(rec)}
	if ms > 0 {
		o.Expires = time.UnixMilli(ms)
	}
	return o, true
}
