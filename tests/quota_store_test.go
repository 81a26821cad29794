package tests

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// The quota script against algorithms.Quota on one table of cases, one key
// per call and all in one call: the same result, the same count stored in
// the period Redis's clock is in, and an expiry at that period's end.
//
// The clock the script is given is the real one (keys written for a past
// period would expire at once), and the periods the zone hands it are the
// day around now, the day after (a zone clock a day ahead: the script
// counts in the previous period it is given) or before (a day behind: the
// next), or a week away (outside all three).
func TestQuotaLuaAgreesWithGoQuota(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.Client()
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 5 * time.Second}, nil)
	ctx := context.Background()

	now := time.Now()
	nowUs := now.UnixMicro()
	periodsFrom := func(offset time.Duration) *zones.Periods {
		p := zones.PeriodsAt(algorithms.Day, now.Add(offset), time.UTC)
		return &p
	}
	today := periodsFrom(0)
	todayEnd := today.Bounds[2]
	yesterdayEnd := today.Bounds[1]

	const (
		absent  = "absent"  // no key
		current = "current" // a count of today
		stale   = "stale"   // a count of yesterday
	)
	type tc struct {
		name    string
		op      distributed.Op
		limit   int64
		cost    int64
		state   string
		used    int64         // the stored count, for current and stale
		offset  time.Duration // of the zone's clock from Redis's
		wantIdx int           // the period of the bounds the script counts in
	}
	cases := []tc{
		{"fresh key is allowed", distributed.OpDecide, 3, 1, absent, 0, 0, 1},
		{"the last unit is allowed", distributed.OpDecide, 3, 1, current, 2, 0, 1},
		{"no unit left is denied", distributed.OpDecide, 3, 1, current, 3, 0, 1},
		{"cost larger than what is left is denied", distributed.OpDecide, 10, 5, current, 6, 0, 1},
		{"cost exactly what is left", distributed.OpDecide, 10, 4, current, 6, 0, 1},
		{"cost 0 passes without writing", distributed.OpDecide, 3, 0, current, 2, 0, 1},
		{"cost 0 in debt is denied", distributed.OpDecide, 3, 0, current, 5, 0, 1},
		{"yesterday's count is forgotten", distributed.OpDecide, 3, 1, stale, 3, 0, 1},
		{"quota 0 admits nothing", distributed.OpDecide, 0, 1, absent, 0, 0, 1},
		{"a big quota", distributed.OpDecide, 1 << 40, 1 << 39, current, 1<<39 - 7, 0, 1},
		{"zone clock a day ahead counts in its previous period", distributed.OpDecide, 3, 1, current, 1, 24 * time.Hour, 0},
		{"zone clock a day behind counts in its next period", distributed.OpDecide, 3, 1, current, 1, -24 * time.Hour, 2},
		{"check with a unit left", distributed.OpPeek, 3, 0, current, 2, 0, 1},
		{"check with none left", distributed.OpPeek, 3, 0, current, 3, 0, 1},
		{"check on a fresh key", distributed.OpPeek, 3, 0, absent, 0, 0, 1},
		{"check on yesterday's count", distributed.OpPeek, 3, 0, stale, 3, 0, 1},
		{"charge within the quota", distributed.OpCharge, 100, 20, current, 10, 0, 1},
		{"charge to exactly the quota", distributed.OpCharge, 100, 90, current, 10, 0, 1},
		{"charge past the quota goes into debt", distributed.OpCharge, 100, 30, current, 99, 0, 1},
		{"charge in debt counts from the quota", distributed.OpCharge, 100, 30, current, 129, 0, 1},
		{"charge on a fresh key", distributed.OpCharge, 100, 150, absent, 0, 0, 1},
		{"charge on yesterday's count", distributed.OpCharge, 100, 5, stale, 80, 0, 1},
		{"refund", distributed.OpRefund, 10, 3, current, 5, 0, 1},
		{"refund never goes below 0", distributed.OpRefund, 10, 3, current, 2, 0, 1},
		{"refund on a fresh key", distributed.OpRefund, 10, 3, absent, 0, 0, 1},
		{"refund on yesterday's count", distributed.OpRefund, 10, 3, stale, 5, 0, 1},
	}
	key := func(prefix string, i int) string { return prefix + strconv.Itoa(i) }
	setup := func(t *testing.T, c tc, k string) (used int64) {
		t.Helper()
		rkey := s.QuotaKey("lua", k)
		switch c.state {
		case current:
			used = c.used
			if err := rdb.HSet(ctx, rkey, "e", todayEnd, "u", c.used).Err(); err != nil {
				t.Fatal(err)
			}
		case stale:
			if err := rdb.HSet(ctx, rkey, "e", yesterdayEnd, "u", c.used, "g:other", 2).Err(); err != nil {
				t.Fatal(err)
			}
		}
		switch c.state {
		case current: // as the script leaves it: expiring at the period's end
			if err := rdb.PExpireAt(ctx, rkey, time.UnixMilli(todayEnd/1000)).Err(); err != nil {
				t.Fatal(err)
			}
		case stale:
			if err := rdb.PExpire(ctx, rkey, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}
		return used
	}
	expect := func(c tc, used int64) (want algorithms.QuotaResult, writes bool) {
		q := algorithms.Quota{Limit: c.limit}
		switch c.op {
		case distributed.OpDecide:
			want = q.Decide(used, c.cost)
			writes = want.Allowed && want.Used != used
		case distributed.OpPeek:
			want = q.Check(used)
		case distributed.OpCharge:
			want = q.Charge(used, c.cost)
			writes = want.Used != used
		case distributed.OpRefund:
			want = q.Refund(used, c.cost)
			writes = want.Used != used
		}
		return want, writes
	}
	verify := func(t *testing.T, c tc, k string, used int64, got zones.QuotaResult) {
		t.Helper()
		want, writes := expect(c, used)
		wantToEnd := time.Duration(todayEnd-nowUs) * time.Microsecond
		if got.Allowed != want.Allowed || got.Used != want.Used || got.Period != c.wantIdx || got.ToEnd != wantToEnd {
			t.Errorf("script {allowed %v, used %d, period %d, to end %v}\n    Go {allowed %v, used %d, period %d, to end %v}",
				got.Allowed, got.Used, got.Period, got.ToEnd, want.Allowed, want.Used, c.wantIdx, wantToEnd)
		}
		rkey := s.QuotaKey("lua", k)
		h, err := rdb.HGetAll(ctx, rkey).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case writes:
			if h["e"] != strconv.FormatInt(todayEnd, 10) || h["u"] != strconv.FormatInt(want.Used, 10) || len(h) != 2 {
				t.Errorf("stored %v, want {e: %d, u: %d} alone", h, todayEnd, want.Used)
			}
			// The key expires at the end of the period it counts.
			ttl, err := rdb.PExpireTime(ctx, rkey).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl != time.Duration(todayEnd/1000)*time.Millisecond {
				t.Errorf("expires at %v, want the period's end %v", ttl, time.Duration(todayEnd/1000)*time.Millisecond)
			}
		case c.state == absent:
			if len(h) != 0 {
				t.Errorf("stored %v for a step that writes nothing", h)
			}
		case c.state == current && h["u"] != strconv.FormatInt(c.used, 10):
			t.Errorf("stored %v changed by a step that writes nothing (was %d)", h, c.used)
		case c.state == stale && h["e"] != strconv.FormatInt(yesterdayEnd, 10):
			t.Errorf("yesterday's count %v changed by a step that writes nothing", h)
		}
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := key("case", i)
			used := setup(t, c, k)
			got, err := s.EvalQuotaAt(ctx, c.op, "lua", k, zones.QuotaLimit{Limit: c.limit, Periods: periodsFrom(c.offset)}, c.cost, nowUs)
			if err != nil {
				t.Fatal(err)
			}
			verify(t, c, k, used, got)
		})
	}

	// Every case again in one call, as the batcher sends them, with a
	// foreign value in the middle that fails its own step only.
	t.Run("all cases in one call", func(t *testing.T) {
		var steps []distributed.QuotaStep
		var used []int64
		for i, c := range cases {
			k := key("batch", i)
			used = append(used, setup(t, c, k))
			steps = append(steps, distributed.QuotaStep{Op: c.op, Zone: "lua", Key: k, Limit: zones.QuotaLimit{Limit: c.limit, Periods: periodsFrom(c.offset)}, Cost: c.cost})
			if i == len(cases)/2 {
				if err := rdb.RPush(ctx, s.QuotaKey("lua", "planted"), "v").Err(); err != nil {
					t.Fatal(err)
				}
				steps = append(steps, distributed.QuotaStep{Op: distributed.OpDecide, Zone: "lua", Key: "planted", Limit: zones.QuotaLimit{Limit: 3, Periods: today}, Cost: 1})
			}
		}
		got, errs, err := s.EvalQuotaManyAt(ctx, steps, nowUs)
		if err != nil {
			t.Fatal(err)
		}
		for i, j := 0, 0; i < len(steps); i++ {
			if steps[i].Key == "planted" {
				if errs[i] == nil || !strings.HasPrefix(errs[i].Error(), "TALLYFOREIGN") {
					t.Errorf("step on a list: error %v, want TALLYFOREIGN", errs[i])
				}
				if n, err := rdb.Exists(ctx, s.QuotaKey("lua", "planted")).Result(); err != nil || n != 0 {
					t.Errorf("the foreign value is still there (%d, %v)", n, err)
				}
				continue
			}
			if errs[i] != nil {
				t.Errorf("%s: %v", cases[j].name, errs[i])
			} else {
				t.Run(cases[j].name, func(t *testing.T) { verify(t, cases[j], steps[i].Key, used[j], got[i]) })
			}
			j++
		}
	})

	t.Run("a zone clock a week off counts nothing and says Redis's time", func(t *testing.T) {
		_, err := s.EvalQuotaAt(ctx, distributed.OpDecide, "lua", "far", zones.QuotaLimit{Limit: 3, Periods: periodsFrom(7 * 24 * time.Hour)}, 1, nowUs)
		var ce *zones.QuotaClockError
		if !errors.As(err, &ce) || ce.Now.UnixMicro() != nowUs {
			t.Fatalf("error %v, want a QuotaClockError at %v", err, now)
		}
		if n, _ := rdb.Exists(ctx, s.QuotaKey("lua", "far")).Result(); n != 0 {
			t.Error("a step outside the periods wrote the key")
		}
	})

	t.Run("a hash tally did not write is deleted", func(t *testing.T) {
		rkey := s.QuotaKey("lua", "hash")
		if err := rdb.HSet(ctx, rkey, "e", "not a time", "u", 1).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := s.EvalQuotaAt(ctx, distributed.OpDecide, "lua", "hash", zones.QuotaLimit{Limit: 3, Periods: today}, 1, nowUs)
		if err == nil || !strings.HasPrefix(err.Error(), "TALLYFOREIGN") {
			t.Fatalf("error %v, want TALLYFOREIGN", err)
		}
		if n, _ := rdb.Exists(ctx, rkey).Result(); n != 0 {
			t.Error("the foreign hash is still there")
		}
	})
}

// Concurrent quota decisions through the batcher, from several stores (as
// several instances) on one key, are exact: no more than the quota is
// admitted, and exactly the quota when more is asked.
func TestStoreQuotaIsExactAcrossInstances(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	const quota, stores, callers, each = 500, 3, 64, 12
	periods := zones.PeriodsAt(algorithms.Day, time.Now(), time.UTC)
	q := zones.QuotaLimit{Limit: quota, Periods: &periods}
	var ss []*distributed.Strict
	for range stores {
		ss = append(ss, openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 2 * time.Second}, nil))
	}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			s := ss[c%stores]
			for range each {
				r, err := stepDecideQuota(s, ctx, "exact", "shared", q, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := allowed.Load(); n != quota {
		t.Fatalf("%d allowed of %d decisions, want exactly the quota %d", n, callers*each, quota)
	}
	r, err := stepPeekQuota(ss[0], ctx, "exact", "shared", q)
	if err != nil || r.Used != quota || r.Allowed {
		t.Fatalf("PeekQuota = %+v, %v; want %d used, nothing left", r, err, quota)
	}
}

// Every key quota steps write expires no later than the end of the period
// it counts: the margin is 0, the period being in the value.
func TestStoreQuotaKeysExpireAtTheirPeriodsEnd(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.Client()
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: time.Second}, nil)
	ctx := context.Background()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, p := range []algorithms.Period{algorithms.Minute, algorithms.Hour, algorithms.Day, algorithms.Week, algorithms.Month} {
		for _, loc := range []*time.Location{time.UTC, berlin} {
			periods := zones.PeriodsAt(p, time.Now(), loc)
			q := zones.QuotaLimit{Limit: 100, Periods: &periods}
			zone := fmt.Sprintf("ttl-%v-%s", p, strings.ReplaceAll(loc.String(), "/", "-"))
			for i := range 20 {
				wg.Go(func() {
					k := "k" + strconv.Itoa(i)
					if _, err := stepDecideQuota(s, ctx, zone, k, q, 3); err != nil {
						t.Error(err)
					}
					if i%2 == 0 {
						_, _ = stepChargeQuota(s, ctx, zone, k, q, 200)
						_ = stepRefundQuota(s, ctx, zone, k, q, 1)
					}
				})
			}
		}
	}
	wg.Wait()
	for _, k := range srv.requireEveryKeyExpires(t, 200) {
		if !strings.Contains(k, ".quota:") {
			continue
		}
		at, err := rdb.PExpireTime(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		end, err := rdb.HGet(ctx, k, "e").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		if at > time.Duration(end/1000)*time.Millisecond {
			t.Errorf("%s expires at %v, after the end of the period it counts (%v)", k, at, time.Duration(end/1000)*time.Millisecond)
		}
	}
}

// Quota steps share the batcher with GCRA steps: 256 callers deciding a
// rate and a quota each, concurrently, cost far fewer script calls than
// decisions, and both stay exact.
func TestStoreBatchesQuotaStepsBesideGCRASteps(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 10 * time.Second}, nil)
	periods := zones.PeriodsAt(algorithms.Day, time.Now(), time.UTC)
	shared := zones.QuotaLimit{Limit: 500, Periods: &periods}
	own := zones.QuotaLimit{Limit: 3, Periods: &periods}
	rate := algorithms.NewLimit(1000, int64(time.Hour), 0)
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const callers, rounds = 256, 5
	var sharedAllowed, rateAllowed atomic.Int64
	ownAllowed := make([]int64, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range callers {
		wg.Go(func() {
			<-start
			for range rounds {
				if r, err := stepDecideQuota(s, ctx, "bq", "shared", shared, 1); err != nil {
					t.Error(err)
					return
				} else if r.Allowed {
					sharedAllowed.Add(1)
				}
				if r, err := stepDecideQuota(s, ctx, "bq", "own-"+strconv.Itoa(g), own, 1); err != nil {
					t.Error(err)
					return
				} else if r.Allowed {
					ownAllowed[g]++
				}
				if r, err := stepDecide(s, ctx, "br", "shared", rate, 1); err != nil {
					t.Error(err)
					return
				} else if r.Allowed {
					rateAllowed.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := sharedAllowed.Load(); n != 500 {
		t.Errorf("the shared quota admitted %d of %d, want exactly 500", n, callers*rounds)
	}
	if n := rateAllowed.Load(); n != 1000 {
		t.Errorf("the shared rate admitted %d of %d, want exactly 1000", n, callers*rounds)
	}
	for g, n := range ownAllowed {
		if n != 3 {
			t.Errorf("caller %d's own quota admitted %d of %d, want exactly 3", g, n, rounds)
		}
	}
	decisions := int64(3 * callers * rounds)
	if calls := evalCalls(t, srv); calls > decisions/3 {
		t.Errorf("%d script calls for %d decisions: want batches of several decisions each", calls, decisions)
	}
}

// On a Redis Cluster quota steps are batched per hash slot and exact: keys
// on every node, one shared key decided by three stores.
func TestStoreQuotaOnRedisCluster(t *testing.T) {
	addrs := startRedisCluster(t)
	opts := distributed.Options{Addresses: addrs, Timeout: 5 * time.Second}
	var stores []*distributed.Strict
	for range 3 {
		stores = append(stores, openStore(t, opts, nil))
	}
	ctx := context.Background()
	periods := zones.PeriodsAt(algorithms.Day, time.Now(), time.UTC)
	q := zones.QuotaLimit{Limit: 4, Periods: &periods}
	const keys = 60
	allowed := make([]atomic.Int64, keys)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, s := range stores {
		for c := range 30 {
			wg.Go(func() {
				<-start
				for k := range keys {
					key := (k + c + i) % keys
					r, err := stepDecideQuota(s, ctx, "cq", "key-"+strconv.Itoa(key), q, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						allowed[key].Add(1)
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	for k := range allowed {
		if n := allowed[k].Load(); n != 4 {
			t.Errorf("key-%d admitted %d of 90 on the cluster, want exactly 4", k, n)
		}
	}
}
