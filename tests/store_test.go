package tests

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// The Redis store is what zones decide against (distributed does not import
// zones, so the guard lives here).
var _ zones.Store = (*distributed.Strict)(nil)

// A fixed "now" in microseconds since the epoch, in the range Redis TIME
// gives, so the script's double arithmetic is exercised at full size.
const nowUs = int64(1_700_000_000_123_457)

func TestLuaScriptAgreesWithGoGCRA(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.Client()
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 5 * time.Second}, nil)
	ctx := context.Background()

	const absent = int64(-1 << 62) // stored TAT offset meaning "no key"
	type tc struct {
		name   string
		op     distributed.Op
		t, b   int64 // emission interval (µs) and burst
		cost   int64
		tatOff int64 // stored TAT - now, or absent
	}
	// T is 1s so that TTLs (real time) outlast the checks; the cases that
	// need tiny TTLs tolerate the key expiring before it is read.
	const T = 1_000_000
	hourly := algorithms.NewLimit(50, int64(time.Hour/time.Microsecond), 0)
	cases := []tc{
		{"fresh key is allowed with burst-1 left", distributed.OpDecide, T, 5, 1, absent},
		{"fresh key may spend its whole burst", distributed.OpDecide, T, 5, 5, absent},
		{"cost above burst is never allowed", distributed.OpDecide, T, 5, 6, absent},
		{"TAT equal to now is a fresh key", distributed.OpDecide, T, 5, 1, 0},
		{"TAT in the past is a fresh key", distributed.OpDecide, T, 5, 1, -5_000_000},
		{"TAT inside the burst is allowed", distributed.OpDecide, T, 5, 1, 2 * T},
		{"TAT at the burst edge is denied", distributed.OpDecide, T, 5, 1, 5 * T},
		{"one microsecond too early is denied", distributed.OpDecide, T, 5, 1, 4*T + 1},
		{"one microsecond inside is allowed with 0 left", distributed.OpDecide, T, 5, 1, 4*T - 1},
		{"50 per hour, burst spent", distributed.OpDecide, hourly.EmissionInterval, hourly.Burst, 1, 49*hourly.EmissionInterval + 12345},
		{"50 per hour, half spent", distributed.OpDecide, hourly.EmissionInterval, hourly.Burst, 1, 25*hourly.EmissionInterval + 777},
		{"smooth rate denies until T passes", distributed.OpDecide, 1_000_000, 1, 1, 500_000},
		{"cost 3 with odd T", distributed.OpDecide, 7_000_003, 10, 3, 20_000_000},
		{"one per day on a fresh key", distributed.OpDecide, 86_400_000_000, 1, 1, absent},
		{"T of one microsecond, big burst", distributed.OpDecide, 1, 1_000_000_000, 1, 999_999_999},
		{"TTL rounds up to whole ms", distributed.OpDecide, 10_000_500, 1, 1, absent},
		{"TTL is at least 1ms", distributed.OpDecide, 1, 1, 1, absent},
		{"refund moves TAT back", distributed.OpRefund, T, 5, 1, 5 * T},
		{"refund never goes below now", distributed.OpRefund, T, 5, 1, T / 2},
		{"refund to exactly now deletes", distributed.OpRefund, T, 5, 2, 2 * T},
		{"refund on an absent key", distributed.OpRefund, T, 5, 1, absent},
		{"refund on a past TAT", distributed.OpRefund, T, 5, 1, -10_000_000},
		{"refund of a cost-3 request", distributed.OpRefund, 7_000_003, 10, 3, 41_000_000},
		{"peek on a fresh key", distributed.OpPeek, T, 5, 1, absent},
		{"peek inside the burst", distributed.OpPeek, T, 5, 1, 2 * T},
		{"peek on a full key", distributed.OpPeek, T, 5, 1, 5 * T},
		{"peek on a past TAT", distributed.OpPeek, T, 5, 1, -3 * T},
		{"peek one microsecond too early", distributed.OpPeek, T, 5, 1, 4*T + 1},
		{"charge on a fresh key", distributed.OpCharge, T, 5, 3, absent},
		{"charge to exactly the burst", distributed.OpCharge, T, 5, 5, absent},
		{"charge past the burst goes into debt", distributed.OpCharge, T, 5, 8, 2 * T},
		{"charge on a past TAT starts from now", distributed.OpCharge, T, 5, 2, -4 * T},
		{"charge of zero leaves the key", distributed.OpCharge, T, 5, 0, 2 * T},
		{"charge with odd T", distributed.OpCharge, 7_000_003, 10, 4, 20_000_000},
		{"charge stops at the debt cap", distributed.OpCharge, T, 5, 20, 2 * T},
		{"delay: denied within ahead is admitted for later", "w3000000", T, 1, 1, 2 * T},
		{"delay: exactly ahead away is admitted for later", "w2000000", T, 1, 1, 2 * T},
		{"delay: one microsecond beyond ahead is denied", "w2000000", T, 1, 1, 2*T + 1},
		{"delay: inside the burst passes at once", "w2000000", T, 5, 1, 2 * T},
		{"delay: a fresh key passes at once", "w2000000", T, 1, 1, absent},
		{"delay: cost above burst is never admitted", "w9000000", T, 2, 3, absent},
		{"delay with odd T and cost 2", "w30000000", 7_000_003, 3, 2, 20_000_000},
		{"delay in a ban zone, admitted for later", "b5000000,5000000,3000000", T, 1, 1, 2 * T},
	}
	// setup stores the case's TAT at key and returns it as Go sees it (0
	// when absent); verify checks the script's result and what it stored.
	setup := func(t *testing.T, c tc, key string) (tat int64) {
		t.Helper()
		if c.tatOff != absent {
			tat = nowUs + c.tatOff
			if err := rdb.Set(ctx, s.RedisKey("lua", key), tat, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}
		return tat
	}
	verify := func(t *testing.T, c tc, key string, tat int64, got algorithms.Result, writtenAt time.Time) {
		t.Helper()
		limit := algorithms.Limit{EmissionInterval: c.t, Burst: c.b}
		rkey := s.RedisKey("lua", key)
		var want algorithms.Result
		writes := false
		switch c.op {
		case distributed.OpDecide:
			want = limit.Decide(tat, nowUs, c.cost)
			writes = want.Allowed
		case distributed.OpPeek:
			want = limit.Peek(tat, nowUs)
		case distributed.OpRefund:
			newTAT := limit.Refund(tat, nowUs, c.cost)
			want = algorithms.Result{Allowed: true, TAT: newTAT, ResetAfter: newTAT - nowUs}
			writes = true
		case distributed.OpCharge:
			want = limit.Charge(tat, nowUs, c.cost)
			writes = true
		default: // a delay op, "w<ahead>" or "b<first>,<max>,<ahead>"
			f := strings.FieldsFunc(string(c.op)[1:], func(r rune) bool { return r == ',' })
			ahead, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
			want = limit.DecideAhead(tat, nowUs, c.cost, ahead)
			writes = want.Allowed
			if got.Allowed { // the store's reading of the reply (DecideAhead)
				got.Delay = max(0, got.ResetAfter-c.b*c.t)
			}
		}
		got.TAT = want.TAT // not returned by the script; checked in Redis below
		if got != want {
			t.Errorf("script %+v\n    Go %+v", got, want)
		}

		short := want.TAT-nowUs <= 2000 // a TTL of 1-2ms may run out before we look
		stored, err := rdb.Get(ctx, rkey).Int64()
		switch {
		case errors.Is(err, redis.Nil):
			if writes && want.TAT > nowUs && !short {
				t.Errorf("key absent, want TAT %d", want.TAT)
			}
			if !writes && c.tatOff != absent {
				t.Errorf("key deleted by an operation that writes nothing")
			}
		case err != nil:
			t.Fatal(err)
		case writes && want.TAT <= nowUs:
			t.Errorf("stored TAT %d <= now: the key should have been deleted", stored)
		case writes && stored != want.TAT:
			t.Errorf("stored TAT %d, want %d", stored, want.TAT)
		case !writes && stored != tat:
			t.Errorf("stored TAT changed to %d by an operation that writes nothing (was %d)", stored, tat)
		}
		if writes && want.TAT > nowUs {
			wantTTL := (want.TAT - nowUs + 999) / 1000 // ms, rounded up
			pttl, err := rdb.PTTL(ctx, rkey).Result()
			if err != nil {
				t.Fatal(err)
			}
			if short && pttl < 0 {
				return
			}
			// The TTL is the key's reset time rounded up to a
			// millisecond, less what has passed since it was written.
			passed := time.Since(writtenAt).Milliseconds()
			if ms := pttl.Milliseconds(); ms > wantTTL || ms < wantTTL-passed-1 {
				t.Errorf("PTTL %dms, want %dms less the %dms since the write (±1ms)", ms, wantTTL, passed)
			}
		}
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := "case" + string(rune('a'+i))
			tat := setup(t, c, key)
			writtenAt := time.Now()
			got, err := s.EvalAt(ctx, c.op, "lua", key, algorithms.Limit{EmissionInterval: c.t, Burst: c.b}, c.cost, nowUs)
			if err != nil {
				t.Fatal(err)
			}
			verify(t, c, key, tat, got, writtenAt)
		})
	}

	// Every case again as one batch: one call of the script with every key,
	// as the batcher sends them, and a foreign value in the middle that
	// fails its own step only.
	t.Run("all cases in one call", func(t *testing.T) {
		var steps []distributed.Step
		var tats []int64
		for i, c := range cases {
			key := "batch" + string(rune('a'+i))
			tats = append(tats, setup(t, c, key))
			steps = append(steps, distributed.Step{Op: c.op, Zone: "lua", Key: key, Limit: algorithms.Limit{EmissionInterval: c.t, Burst: c.b}, Cost: c.cost})
			if i == len(cases)/2 {
				if err := rdb.HSet(ctx, s.RedisKey("lua", "planted"), "f", "v").Err(); err != nil {
					t.Fatal(err)
				}
				steps = append(steps, distributed.Step{Op: distributed.OpDecide, Zone: "lua", Key: "planted", Limit: algorithms.Limit{EmissionInterval: T, Burst: 5}, Cost: 1})
			}
		}
		writtenAt := time.Now()
		got, errs, err := s.EvalManyAt(ctx, steps, nowUs)
		if err != nil {
			t.Fatal(err)
		}
		for i, j := 0, 0; i < len(steps); i++ {
			if steps[i].Key == "planted" {
				if errs[i] == nil || !strings.HasPrefix(errs[i].Error(), "TALLYFOREIGN") {
					t.Errorf("step on a hash: error %v, want TALLYFOREIGN", errs[i])
				}
				if n, err := rdb.Exists(ctx, s.RedisKey("lua", "planted")).Result(); err != nil || n != 0 {
					t.Errorf("the foreign value is still there (%d, %v)", n, err)
				}
				continue
			}
			if errs[i] != nil {
				t.Errorf("%s: %v", cases[j].name, errs[i])
			}
			t.Run(cases[j].name, func(t *testing.T) { verify(t, cases[j], steps[i].Key, tats[j], got[i], writtenAt) })
			j++
		}
	})

	// A random walk over one key: the script and Go, fed the same operations
	// at the same times, must hold the same state at every step. Times are
	// whole seconds so that no TTL can run out in real time during the walk.
	t.Run("random walk", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		const sec = int64(1_000_000)
		limit := algorithms.Limit{EmissionInterval: 2 * sec, Burst: 4}
		now, goTAT := nowUs, int64(0)
		rkey := s.RedisKey("lua", "walk")
		ops := []distributed.Op{distributed.OpDecide, distributed.OpDecide, distributed.OpDecide, distributed.OpRefund, distributed.OpPeek, distributed.OpCharge}
		for step := range 500 {
			now += sec * rng.Int64N(4)
			op := ops[rng.IntN(len(ops))]
			cost := 1 + rng.Int64N(3)
			got, err := s.EvalAt(ctx, op, "lua", "walk", limit, cost, now)
			if err != nil {
				t.Fatal(err)
			}
			var want algorithms.Result
			switch op {
			case distributed.OpDecide:
				want = limit.Decide(goTAT, now, cost)
				if want.Allowed {
					goTAT = want.TAT
				}
			case distributed.OpPeek:
				want = limit.Peek(goTAT, now)
			case distributed.OpCharge:
				want = limit.Charge(goTAT, now, cost)
				goTAT = want.TAT
			case distributed.OpRefund:
				goTAT = limit.Refund(goTAT, now, cost)
				want = algorithms.Result{Allowed: true, ResetAfter: goTAT - now}
			}
			got.TAT, want.TAT = 0, 0
			if got != want {
				t.Fatalf("step %d (%s cost %d at +%ds): script %+v, Go %+v", step, op, cost, (now-nowUs)/sec, got, want)
			}
			stored, err := rdb.Get(ctx, rkey).Int64()
			if errors.Is(err, redis.Nil) {
				stored = 0
			} else if err != nil {
				t.Fatal(err)
			}
			if max(stored, now) != max(goTAT, now) {
				t.Fatalf("step %d: stored TAT %d, Go TAT %d (now %d)", step, stored, goTAT, now)
			}
		}
	})

	// The same walk in batches: up to 8 operations at one instant, on one
	// key or two, in one call, apply in order as Go applies them one by one.
	t.Run("random walk in batches", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		const sec = int64(1_000_000)
		limit := algorithms.Limit{EmissionInterval: 2 * sec, Burst: 4}
		now := nowUs
		goTATs := map[string]int64{}
		ops := []distributed.Op{distributed.OpDecide, distributed.OpDecide, distributed.OpDecide, distributed.OpRefund, distributed.OpPeek, distributed.OpCharge}
		for call := range 150 {
			now += sec * rng.Int64N(4)
			steps := make([]distributed.Step, 1+rng.IntN(8))
			for i := range steps {
				steps[i] = distributed.Step{Op: ops[rng.IntN(len(ops))], Zone: "lua", Key: []string{"walk-a", "walk-b"}[rng.IntN(2)], Limit: limit, Cost: 1 + rng.Int64N(3)}
			}
			got, errs, err := s.EvalManyAt(ctx, steps, now)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range steps {
				goTAT := goTATs[st.Key]
				var want algorithms.Result
				switch st.Op {
				case distributed.OpDecide:
					want = limit.Decide(goTAT, now, st.Cost)
					if want.Allowed {
						goTAT = want.TAT
					}
				case distributed.OpPeek:
					want = limit.Peek(goTAT, now)
				case distributed.OpCharge:
					want = limit.Charge(goTAT, now, st.Cost)
					goTAT = want.TAT
				case distributed.OpRefund:
					goTAT = limit.Refund(goTAT, now, st.Cost)
					want = algorithms.Result{Allowed: true, ResetAfter: goTAT - now}
				}
				goTATs[st.Key] = goTAT
				want.TAT = 0
				if errs[i] != nil || got[i] != want {
					t.Fatalf("call %d step %d (%s %s cost %d): script %+v %v, Go %+v", call, i, st.Key, st.Op, st.Cost, got[i], errs[i], want)
				}
			}
			for key, goTAT := range goTATs {
				stored, err := rdb.Get(ctx, s.RedisKey("lua", key)).Int64()
				if errors.Is(err, redis.Nil) {
					stored = 0
				} else if err != nil {
					t.Fatal(err)
				}
				if max(stored, now) != max(goTAT, now) {
					t.Fatalf("call %d: %s stored TAT %d, Go TAT %d (now %d)", call, key, stored, goTAT, now)
				}
			}
		}
	})
}

// Three instances deciding for one key at once admit exactly the limit.
func TestStoreIsExactAcrossInstances(t *testing.T) {
	srv := startRedis(t)
	limit := algorithms.NewLimit(50, int64(time.Hour), 0)
	var stores []*distributed.Strict
	for range 3 {
		// A generous timeout: this test is about exactness, not latency.
		stores = append(stores, openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 5 * time.Second}, nil))
	}
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range stores {
		for range 100 {
			wg.Go(func() {
				<-start
				r, err := stepDecide(s, context.Background(), "api", "one-key", limit, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				} else {
					denied.Add(1)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if allowed.Load() != 50 || denied.Load() != 250 {
		t.Fatalf("allowed %d, denied %d; want exactly 50 and 250", allowed.Load(), denied.Load())
	}
}

// Concurrent decisions share script calls: 256 callers make far fewer
// EVALSHA calls than decisions, and stay exact for the key they share (each
// batch holds it many times) and for their own, with concurrency
// acquisitions riding the same batches; every key written keeps a TTL.
func TestStoreBatchesDecisionsIntoOneScriptCall(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 10 * time.Second}, nil)
	shared := algorithms.NewLimit(300, int64(time.Hour), 0)
	own := algorithms.NewLimit(7, int64(time.Hour), 0)
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const callers, rounds = 256, 10
	var sharedAllowed, slots atomic.Int64
	ownAllowed := make([]int64, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range callers {
		wg.Go(func() {
			<-start
			key := "own-" + strconv.Itoa(g)
			for range rounds {
				r, err := stepDecide(s, ctx, "batch", "shared", shared, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					sharedAllowed.Add(1)
				}
				if r, err = stepDecide(s, ctx, "batch", key, own, 1); err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					ownAllowed[g]++
				}
			}
			if g%4 == 0 {
				id, _, err := s.Acquire(ctx, "slots", "k", 20, time.Minute)
				if err != nil {
					t.Error(err)
				} else if id != "" {
					slots.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := sharedAllowed.Load(); n != 300 {
		t.Errorf("the shared key admitted %d of %d, want exactly 300", n, callers*rounds)
	}
	for g, n := range ownAllowed {
		if n != 7 {
			t.Errorf("caller %d's own key admitted %d of %d, want exactly 7", g, n, rounds)
		}
	}
	if n := slots.Load(); n != 20 {
		t.Errorf("%d concurrency slots taken of 20, by %d callers", n, callers/4)
	}
	_, calls, err := scriptStats(rdb)
	if err != nil {
		t.Fatal(err)
	}
	decisions := int64(2*callers*rounds + callers/4)
	t.Logf("%d decisions in %d script calls", decisions, calls)
	if calls > decisions/3 {
		t.Errorf("%d script calls for %d decisions by %d callers: batches are not sent as one call", calls, decisions, callers)
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	written := 0
	for _, k := range keys {
		if !strings.Contains(k, "batch:") {
			continue
		}
		written++
		if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
			t.Errorf("%s: PTTL %v, %v; every key must expire", k, ttl, err)
		}
	}
	if written != callers+1 {
		t.Errorf("%d GCRA keys in Redis, want %d", written, callers+1)
	}
}

// A batch sent after Redis lost its scripts (SCRIPT FLUSH, a restart) is
// sent again with EVAL, whole: no decision fails and none counts twice.
func TestStoreBatchAfterScriptFlushFallsBackToEval(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: 10 * time.Second}, nil)
	limit := algorithms.NewLimit(3, int64(time.Hour), 0)
	if _, err := stepDecide(s, ctx, "flush", "warm", limit, 1); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const callers = 128
	allowed := make([]int, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range callers {
		wg.Go(func() {
			<-start
			for range 5 {
				r, err := stepDecide(s, ctx, "flush", "k"+strconv.Itoa(g%32), limit, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed[g]++
				}
			}
		})
	}
	close(start)
	wg.Wait()
	perKey := make([]int, 32)
	for g, n := range allowed {
		perKey[g%32] += n
	}
	for k, n := range perKey {
		if n != 3 {
			t.Errorf("key k%d admitted %d of 20 after the flush, want exactly 3", k, n)
		}
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "cmdstat_eval:") {
		t.Errorf("no EVAL after SCRIPT FLUSH: the NOSCRIPT fallback did not run\n%s", info)
	}
}

// The results of Decide are in nanoseconds, converted from Redis's
// microseconds, and Refund gives back what Decide took.
func TestStoreDecideRefundPeekReset(t *testing.T) {
	srv := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{"redis://" + srv.Addr + "/3"}, Timeout: time.Second}, nil)
	ctx := context.Background()
	limit := algorithms.NewLimit(10, int64(time.Minute), 0) // T = 6s

	start := time.Now()
	for i := range 10 {
		r, err := stepDecide(s, ctx, "z", "k", limit, 1)
		if err != nil || !r.Allowed || r.Remaining != int64(9-i) {
			t.Fatalf("decision %d: %+v, %v", i, r, err)
		}
	}
	r, err := stepDecide(s, ctx, "z", "k", limit, 1)
	if err != nil || r.Allowed {
		t.Fatalf("11th decision: %+v, %v; want denied", r, err)
	}
	// One interval (6s) after the first decision, less the time the
	// decisions took: a unit error (µs read as ns) is a thousand times off.
	if ra, passed := time.Duration(r.RetryAfter), time.Since(start); ra > 6*time.Second || ra < 6*time.Second-passed-time.Millisecond || ra%time.Microsecond != 0 {
		t.Errorf("RetryAfter %v after %v, want 6s less the time passed, in whole microseconds", ra, passed)
	}
	if r.ResetAfter <= int64(54*time.Second) || r.ResetAfter > int64(time.Minute) {
		t.Errorf("ResetAfter %v, want about 1m", time.Duration(r.ResetAfter))
	}
	if err := stepRefund(s, ctx, "z", "k", limit, 2); err != nil {
		t.Fatal(err)
	}
	p, err := stepPeek(s, ctx, "z", "k", limit)
	if err != nil || !p.Allowed || p.Remaining != 2 {
		t.Fatalf("Peek after refunding 2: %+v, %v; want allowed with 2 remaining", p, err)
	}
	if err := stepReset(s, ctx, "z", "k"); err != nil {
		t.Fatal(err)
	}
	p, err = stepPeek(s, ctx, "z", "k", limit)
	if err != nil || p.Remaining != 10 || p.ResetAfter != 0 {
		t.Fatalf("Peek after Reset: %+v, %v; want a full key", p, err)
	}
	// The URL's database was used.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 3})
	defer rdb.Close()
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n == 0 {
		t.Errorf("DBSIZE of db 3 = %d, %v; want the store's keys there", n, err)
	}
}

// Every key the store writes has a TTL.
func TestStoreKeysAllHaveTTL(t *testing.T) {
	srv := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: time.Second}, nil)
	ctx := context.Background()
	if _, err := s.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	limits := []algorithms.Limit{
		algorithms.NewLimit(5, int64(time.Second), 0),
		algorithms.NewLimit(100, int64(time.Hour), 10),
		algorithms.NewLimit(1, int64(24*time.Hour), 1),
	}
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			l := limits[i%len(limits)]
			key := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			for j := range 3 {
				if _, err := stepDecide(s, ctx, "ttl", key, l, int64(1+j)); err != nil {
					t.Error(err)
				}
			}
			if i%2 == 0 {
				if err := stepRefund(s, ctx, "ttl", key, l, 1); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()

	srv.requireEveryKeyExpires(t, 100)
}

// When Redis dies, calls fail within the timeout, then the breaker opens and
// calls fail at once; when Redis returns, decisions succeed again. The
// outage is logged once on each side.
func TestStoreBreakerOpensOnOutageAndClosesOnRecovery(t *testing.T) {
	srv := startRedis(t)
	logger, logs := observedLogger()
	const timeout = 50 * time.Millisecond
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: timeout}, logger)
	ctx := context.Background()
	limit := algorithms.NewLimit(1000, int64(time.Second), 0)

	waitFor(t, 5*time.Second, "a first decision", func() bool {
		_, err := stepDecide(s, ctx, "b", "k", limit, 1)
		return err == nil
	})
	srv.Kill()

	var opened bool
	for i := range 50 {
		start := time.Now()
		_, err := stepDecide(s, ctx, "b", "k", limit, 1)
		took := time.Since(start)
		if err == nil {
			t.Fatalf("call %d succeeded with Redis killed", i)
		}
		if took > timeout+100*time.Millisecond {
			t.Errorf("call %d took %v with a timeout of %v", i, took, timeout)
		}
		if errors.Is(err, distributed.ErrUnavailable) {
			opened = true
			break
		}
	}
	if !opened {
		t.Fatal("the breaker did not open after 50 failed calls")
	}
	if ok, since := s.Health(); ok || since.IsZero() {
		t.Errorf("Health() = %v, %v; want not ok since the outage began", ok, since)
	}
	// Open: calls fail without touching Redis.
	for range 1000 {
		if _, err := stepDecide(s, ctx, "b", "k", limit, 1); !errors.Is(err, distributed.ErrUnavailable) {
			t.Fatalf("with the breaker open: %v, want ErrUnavailable", err)
		}
	}
	if n := s.Instances(); n != 1 {
		t.Errorf("Instances() = %d during the outage, want the last value seen (1)", n)
	}

	srv.Start()
	waitFor(t, 10*time.Second, "decisions to succeed after Redis restarts", func() bool {
		_, err := stepDecide(s, ctx, "b", "k", limit, 1)
		return err == nil
	})
	if ok, _ := s.Health(); !ok {
		t.Error("Health() not ok after recovery")
	}
	if n := logs.FilterMessage("redis unreachable; zones apply their fail_policy").Len(); n != 1 {
		t.Errorf("%d 'unreachable' log lines for one outage, want 1", n)
	}
	if n := logs.FilterMessage("redis reachable again").Len(); n != 1 {
		t.Errorf("%d 'reachable again' log lines for one outage, want 1", n)
	}
}

// A frozen Redis (connections open, no answers) costs each call at most its
// timeout, never a hang.
func TestStorePausedRedisNeverHangs(t *testing.T) {
	srv := startRedis(t)
	const timeout = 30 * time.Millisecond
	s := openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: timeout}, nil)
	ctx := context.Background()
	limit := algorithms.NewLimit(1000, int64(time.Second), 0)
	waitFor(t, 5*time.Second, "a first decision", func() bool {
		_, err := stepDecide(s, ctx, "p", "k", limit, 1)
		return err == nil
	})
	srv.Pause()
	defer srv.Resume()

	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for i := range 10 {
				start := time.Now()
				var err error
				if i%3 == 2 {
					_, err = stepPeek(s, ctx, "p", "k", limit)
				} else {
					_, err = stepDecide(s, ctx, "p", "k", limit, 1)
				}
				if took := time.Since(start); took > timeout+100*time.Millisecond {
					t.Errorf("goroutine %d call %d took %v with a timeout of %v", g, i, took, timeout)
				}
				if err == nil {
					t.Errorf("goroutine %d call %d succeeded against a paused Redis", g, i)
				}
			}
		})
	}
	wg.Wait()
}

// Open succeeds with Redis down (Caddy must start during an outage).
func TestStoreOpensWithRedisDown(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := openStore(t, distributed.Options{Addresses: []string{addr}, Timeout: 20 * time.Millisecond}, nil)
	limit := algorithms.NewLimit(10, int64(time.Second), 0)
	if _, err := stepDecide(s, context.Background(), "z", "k", limit, 1); err == nil {
		t.Fatal("Decide succeeded with nothing listening")
	}
	if n := s.Instances(); n != 1 {
		t.Errorf("Instances() = %d before any heartbeat, want 1", n)
	}
}

// Passwords never appear in errors, logs or Redacted.
func TestStoreNeverRevealsThePassword(t *testing.T) {
	const secret = "s3cr3t-Pa55"
	bad := distributed.Options{Addresses: []string{"redis://user:" + secret + "@127.0.0.1:notaport/0"}}
	if _, err := distributed.Open(bad, nil); err == nil {
		t.Error("Open accepted a URL with a bad port")
	} else if strings.Contains(err.Error(), secret) {
		t.Errorf("error reveals the password: %v", err)
	}
	bad.Addresses = []string{"redis://user:" + secret + "@127.0.0.1:1/x"}
	if _, err := distributed.Open(bad, nil); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("bad database: %v", err)
	}

	srv := startRedis(t)
	if err := srv.Client().ConfigSet(context.Background(), "requirepass", "the-right-one").Err(); err != nil {
		t.Fatal(err)
	}
	logger, logs := observedLogger()
	opts := distributed.Options{Addresses: []string{"redis://:" + secret + "@" + srv.Addr}, Password: "", Timeout: 100 * time.Millisecond}
	if strings.Contains(opts.Redacted(), secret) {
		t.Errorf("Redacted() = %q reveals the password", opts.Redacted())
	}
	s := openStore(t, opts, logger)
	limit := algorithms.NewLimit(10, int64(time.Second), 0)
	for range 10 {
		_, err := stepDecide(s, context.Background(), "z", "k", limit, 1)
		if err == nil {
			t.Fatal("Decide succeeded with a wrong password")
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("error reveals the password: %v", err)
		}
	}
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			if strings.Contains(e.Message, secret) || strings.Contains(k, secret) || strings.Contains(fmt.Sprint(v), secret) {
				t.Errorf("log line reveals the password: %s %v", e.Message, e.ContextMap())
			}
		}
	}
	if logs.FilterMessage("redis unreachable; zones apply their fail_policy").Len() != 1 {
		t.Errorf("a rejected password should open the breaker once")
	}

	right := distributed.Options{Addresses: []string{srv.Addr}, Password: "the-right-one", Timeout: time.Second}
	if right.Key() == opts.Key() {
		t.Error("Key() is the same for different passwords")
	}
	s2 := openStore(t, right, nil)
	if _, err := stepDecide(s2, context.Background(), "z", "k", limit, 1); err != nil {
		t.Errorf("with the right password: %v", err)
	}
}

// Instances counts live stores through the heartbeat set, which expires.
func TestStoreHeartbeatCountsInstances(t *testing.T) {
	srv := startRedis(t)
	var stores []*distributed.Strict
	for range 3 {
		stores = append(stores, openStore(t, distributed.Options{Addresses: []string{srv.Addr}, Timeout: time.Second}, nil))
	}
	ctx := context.Background()
	waitFor(t, 5*time.Second, "every store to see 3 instances", func() bool {
		for _, s := range stores {
			if s.Instances() != 3 {
				return false
			}
		}
		return true
	})
	rdb := srv.Client()
	pttl, err := rdb.PTTL(ctx, "tally:instances").Result()
	if err != nil || pttl <= 0 || pttl > 10*time.Second {
		t.Errorf("PTTL of tally:instances = %v, %v; want (0, 10s]", pttl, err)
	}
	stores[2].Close()
	if n, err := stores[0].Heartbeat(ctx); err != nil || n != 2 {
		t.Errorf("Heartbeat after closing one store = %d, %v; want 2", n, err)
	}
	if n := stores[0].Instances(); n != 2 {
		t.Errorf("Instances() = %d, want 2", n)
	}
}
