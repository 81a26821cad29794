package tests

// Golden decision traces: the ordering rules of a zone's decision that a
// re-cut of the stores could break without any single store's answer
// changing (zones/zone.go, ban.go, delay.go, charge.go). Each test is one
// rule, run through zones.Zone over the stores it concerns.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// A banned key is answered by its ban before the deny cache: the store's
// denial that started the ban is cached too, and a lookup in the wrong
// order would answer "denied" without saying "banned" (no ban metric, no
// ban Retry-After once the rate's retry is the shorter).
func TestGoldenBanIsCheckedBeforeTheDenyCache(t *testing.T) {
	t.Parallel()
	for _, kind := range []confStoreKind{confStores[1], confStores[2], confStores[3]} {
		t.Run(kind.name, func(t *testing.T) {
			cfg := with(rateZone(), func(c *zones.Config) { c.Ban = time.Hour })
			e := openConfZone(t, kind, cfg)
			ctx := context.Background()
			for range 5 {
				if d := e.zone.Decide(ctx, "k", monotime.Now()); !d.Allowed {
					t.Fatalf("within the burst: %+v", d)
				}
			}
			now := monotime.Now()
			d := e.zone.Decide(ctx, "k", now)
			if d.Allowed || !d.Banned || d.BanStarted == 0 {
				t.Fatalf("the denial: %+v, want a ban started", d)
			}
			if _, cached := e.zone.CachedDenial("k", now, &e.plan); !cached {
				t.Fatal("the denial is not cached")
			}
			d = e.zone.Decide(ctx, "k", monotime.Now())
			if d.Allowed || !d.Banned || d.BanLevel != 1 || d.Source != zones.SourceDenyCache || !near(d.RetryAfter, time.Hour) {
				t.Fatalf("the next request: %+v, want denied by its ban (level 1, about 1h), without the store", d)
			}
		})
	}
}

// In a zone with delay the deny cache ends `delay` before the denial's
// retry (when a request could be admitted for later again), and while it
// holds its Retry-After is still when a request would pass at once.
func TestGoldenDelayShortensTheDenyCache(t *testing.T) {
	t.Parallel()
	for _, kind := range confStores[:4] {
		t.Run(kind.name, func(t *testing.T) {
			e := openConfZone(t, kind, delayZone())
			ctx := context.Background()
			for i := range 3 {
				d := e.zone.Decide(ctx, "k", monotime.Now())
				if !d.Allowed || (i == 2) != (d.Delay > 0) {
					t.Fatalf("request %d: %+v, want two at once and one for later", i+1, d)
				}
				if d.Delay > 0 {
					e.zone.EndWait()
				}
			}
			now := monotime.Now()
			d := e.zone.Decide(ctx, "k", now)
			if d.Allowed || !near(d.RetryAfter, 2*delayT) {
				t.Fatalf("the fourth request: %+v, want denied until two turns from now", d)
			}
			// The cache's end, from the denial's own clock, to within a
			// second (async's record takes its own now).
			end := now + int64(d.RetryAfter) - int64(time.Minute)
			if !e.zone.Denies("k", end-int64(time.Second)) {
				t.Errorf("a second before retry − delay the key is not denied")
			}
			if e.zone.Denies("k", end+int64(time.Second)) {
				t.Errorf("a second after retry − delay the key is still denied: the deny cache ignores the delay")
			}
			if e.zone.Store() == nil {
				return
			}
			c, ok := e.zone.CachedDenial("k", now+int64(time.Second), &e.plan)
			if !ok || !near(c.RetryAfter, d.RetryAfter-time.Second) {
				t.Errorf("the cached denial a second later: %+v (%v), want Retry-After %v", c, ok, d.RetryAfter-time.Second)
			}
		})
	}
}

// A dry-run zone sends plain steps to Redis: no ban op (the key holds a
// bare TAT, not TAT,end,remembered until,level, and its TTL is the rate's),
// no reservation for later (the TAT moved by the admitted requests only),
// and no entry in the fleet's ban list.
func TestGoldenDryRunSendsPlainStepsToRedis(t *testing.T) {
	t.Parallel()
	dry := with(delayZone(), func(c *zones.Config) { c.DryRun, c.Ban = true, time.Hour })
	e := openConfZone(t, confStores[1], dry)
	ctx := context.Background()
	for i := range 4 {
		d := e.zone.Decide(ctx, "dry", monotime.Now())
		if d.Allowed != (i < 2) || d.Delay != 0 || d.Banned {
			t.Fatalf("dry-run request %d: %+v, want two allowed, then denied, never delayed or banned", i+1, d)
		}
	}
	rdb := e.redis.Client()
	v, err := rdb.Get(ctx, "tally:conf:dry").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(v, ",") {
		t.Fatalf("the dry-run key holds %q: a ban op reached Redis", v)
	}
	tat, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("the dry-run key holds %q, not a TAT", v)
	}
	redisNow, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ahead := time.Duration(tat-redisNow.UnixMicro()) * time.Microsecond; !near(ahead, 2*delayT) {
		t.Fatalf("the TAT is %v ahead, want the two admitted requests' %v: a reservation reached Redis", ahead, 2*delayT)
	}
	if ttl := rdb.PTTL(ctx, "tally:conf:dry").Val(); ttl <= 0 || ttl > 2*delayT+time.Second {
		t.Fatalf("the dry-run key's TTL is %v, want the rate's %v at most (no ban memory)", ttl, 2*delayT)
	}

	// The same zone for real, beside it: its ban is listed; the dry run's
	// never is.
	liveState := zones.NewState(dry, time.Minute)
	t.Cleanup(func() { _ = liveState.Destruct() })
	live := mustZone(with(dry, func(c *zones.Config) { c.DryRun = false }), liveState, e.zone.Store())
	for range 4 {
		if d := live.Decide(ctx, "real", monotime.Now()); d.Delay > 0 {
			live.EndWait()
		}
	}
	if v := rdb.Get(ctx, "tally:conf:real").Val(); strings.Count(v, ",") != 3 {
		t.Fatalf("the real zone's banned key holds %q, want TAT,end,remembered until,level", v)
	}
	waitFor(t, 10*time.Second, "the real zone's ban to be listed", func() bool {
		return rdb.ZScore(ctx, "tally:conf.bans", "real").Err() == nil
	})
	if n := rdb.ZCard(ctx, "tally:conf.bans").Val(); n != 1 {
		t.Fatalf("the ban list holds %d keys (%v), want the real zone's only", n, rdb.ZRange(ctx, "tally:conf.bans", 0, -1).Val())
	}
}

// A post-charged zone's check waits for this instance's charges of the key
// that have not landed yet (strict mode queues them off the response
// path): the check right after a charge sees the debt, even with Redis
// 20–40 ms away.
func TestGoldenPostChargedCheckWaitsForItsPendingCharges(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	proxy := startRedisProxy(t, rs.Addr)
	proxy.SetLatency(20*time.Millisecond, 40*time.Millisecond)
	cfg := rateZone()
	state := zones.NewState(cfg, time.Minute)
	t.Cleanup(func() { _ = state.Destruct() })
	store := openStore(t, distributed.Options{Addresses: []string{proxy.Addr}, Timeout: 2 * time.Second}, nil)
	z := mustZone(cfg, state, store)
	p := z.Plan()
	ctx := context.Background()
	for i := range 5 {
		key := "k" + strconv.Itoa(i)
		if d := z.Check(ctx, key, monotime.Now(), &p); !d.Allowed {
			t.Fatalf("%s before its charge: %+v", key, d)
		}
		z.Charge(ctx, key, monotime.Now(), &p, 5)
		if d := z.Check(ctx, key, monotime.Now(), &p); d.Allowed || !near(d.RetryAfter, slowT) {
			t.Fatalf("%s right after its charge of the whole burst: %+v, want denied for an interval: the check did not wait for the charge", key, d)
		}
	}
}

// An async zone's deny cache and fail_policy local state live in the
// store's record of the key (zones.RecordStore), not in the zone's tables:
// the zone's own `heard` is bypassed, so max_keys bounds one structure and
// a key counts once. A strict zone, beside it, keeps them in its tables.
func TestGoldenAsyncRecordsBypassTheZonesDenyCache(t *testing.T) {
	t.Parallel()
	for _, kind := range confStores[1:] {
		t.Run(kind.name, func(t *testing.T) {
			e := openConfZone(t, kind, rateZone())
			ctx := context.Background()
			for range 5 {
				e.zone.Decide(ctx, "k", monotime.Now())
			}
			// Asked at the denial's own time: an async denial made
			// before the first sync is cached only until that sync.
			now := monotime.Now()
			if d := e.zone.Decide(ctx, "k", now); d.Allowed {
				t.Fatalf("past the burst: %+v", d)
			}
			p := e.zone.Plan()
			e.zone.Charge(ctx, "c", monotime.Now(), &p, 6)
			tables := e.zone.State().Denied.Len() + e.zone.State().Fallback.Len()
			if kind.mode == "strict" {
				if e.zone.State().Denied.Len() == 0 {
					t.Fatal("a strict zone's denial is not in its deny cache table")
				}
				return
			}
			if tables != 0 {
				t.Fatalf("an async zone's tables hold %d keys, want none: the record holds the deny cache and the fallback state", tables)
			}
			if !e.zone.Denies("k", now) {
				t.Fatal("the async zone does not deny the key it just denied (the record's deny cache)")
			}
			if _, ok := e.async.DeniedUntil("conf", "k", now); !ok {
				t.Fatal("the async record holds no denial of the key")
			}
		})
	}
}
