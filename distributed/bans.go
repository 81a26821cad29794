package distributed

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/zones"
)

// A zone's current bans, fleet-wide, for the admin list and async mode: a
// sorted set <key_prefix><zone>.bans written when a ban starts or is lifted
// (docs/distributed.md, Bans). It is best effort: a failed write leaves a
// ban out, never lifts one. Running bans pushed off the list, and a ban
// whose write failed, go to RecordBan's dropped: in async mode they reach
// no other instance.

// banScore is a ban's score: its end in Unix ms × 64 + its level (< 64),
// exact in a double for any end before the year 30,000.
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
