package distributed

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// The local half of async mode: what a record admits between syncs and how
// it adopts a sync's reply. The Redis half is tested in tests/async_test.go.

var hundredPerHour = algorithms.NewLimit(100, int64(time.Hour), 0)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// openUnreachable opens an async store whose Redis does not exist and whose
// sync interval is long enough that its view never goes stale in a test.
func openUnreachable(t *testing.T, maxKeys int) *Async {
	t.Helper()
	a, err := openAsync(Options{Addresses: []string{closedAddr(t)}, Mode: "async", SyncInterval: time.Hour}, maxKeys, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func TestFreshShareIsTheBurstSplitAmongInstances(t *testing.T) {
	for _, c := range []struct {
		burst int64
		n     int
		want  int64
	}{{100, 1, 100}, {100, 3, 33}, {2, 3, 1}, {1, 10, 1}, {100, 0, 100}} {
		if got := freshShare(c.burst, c.n); got != c.want {
			t.Errorf("freshShare(%d, %d) = %d, want %d", c.burst, c.n, got, c.want)
		}
	}
}

func TestFreshRecordAdmitsItsShareThenDeniesUntilTheNextSync(t *testing.T) {
	const now, nextSync = int64(1e18), int64(1e18) + int64(40*time.Millisecond)
	r := &record{allow: freshShare(100, 3)}
	for i := range 33 {
		res := r.decide(now, nextSync, hundredPerHour, 1)
		if !res.Allowed || res.Remaining != int64(32-i) {
			t.Fatalf("request %d: %+v, want allowed with %d remaining", i+1, res, 32-i)
		}
	}
	res := r.decide(now, nextSync, hundredPerHour, 1)
	if res.Allowed || res.RetryAfter != nextSync-now {
		t.Fatalf("34th request: %+v, want denied until the next sync (%v)", res, time.Duration(nextSync-now))
	}
	if r.pending != 33 || r.reserved {
		t.Fatalf("pending %d reserved %v, want 33 admitted and not counted in Redis", r.pending, r.reserved)
	}
	r.refund(1)
	if r.allow != 1 || r.pending != 32 {
		t.Fatalf("after a refund: allow %d pending %d, want 1 and 32", r.allow, r.pending)
	}
}

func TestDeniedRetryAfterIsTheFleetsNextTokenWhenLater(t *testing.T) {
	const now = int64(1e18)
	r := &record{reserved: true, retryAt: now + int64(30*time.Second)}
	res := r.decide(now, now+int64(50*time.Millisecond), hundredPerHour, 1)
	if res.Allowed || res.RetryAfter != int64(30*time.Second) {
		t.Fatalf("%+v, want denied for 30s", res)
	}
	res = r.decide(now+int64(30*time.Second), now, hundredPerHour, 1)
	if res.RetryAfter != 1 {
		t.Fatalf("RetryAfter %d at retryAt with the sync overdue, want 1ns (never 0)", res.RetryAfter)
	}
}

func TestSyncReportsAdmittedCostAndHandsBackUnusedLease(t *testing.T) {
	cases := []struct {
		name string
		s    sent
		want int64
	}{
		{"fresh share: what was admitted and the rest reserved", sent{allow: 20, pending: 13}, 33},
		{"lease: the unused part goes back", sent{allow: 5, reserved: true}, -5},
		{"lease overdrawn during an earlier sync", sent{allow: 0, pending: 2, reserved: true}, 2},
	}
	for _, c := range cases {
		if got := c.s.delta(); got != c.want {
			t.Errorf("%s: delta %d, want %d", c.name, got, c.want)
		}
	}
}

func TestDecisionsDuringASyncStayCounted(t *testing.T) {
	const now = int64(1e18)
	t.Run("lease", func(t *testing.T) {
		r := &record{allow: 10, reserved: true, limit: hundredPerHour}
		s, _ := r.snapshot(now, int64(time.Second), false, new(atomic.Uint64))
		for range 3 {
			r.decide(now, now, hundredPerHour, 1) // in flight: out of the lease handed back
		}
		r.apply(s, syncReply{lease: 5}, now, 100, 100)
		if r.allow != 2 || r.pending != 0 {
			t.Fatalf("allow %d pending %d, want 2 (lease 5 minus 3 admitted in flight) and 0", r.allow, r.pending)
		}
		s, _ = r.snapshot(now, int64(time.Second), false, new(atomic.Uint64))
		r.decide(now, now, hundredPerHour, 1)
		r.decide(now, now, hundredPerHour, 1)
		r.apply(s, syncReply{lease: 1}, now, 100, 100)
		if r.allow != 0 || r.pending != 1 {
			t.Fatalf("allow %d pending %d, want 0 and 1 (admitted in flight beyond the new lease)", r.allow, r.pending)
		}
	})
	t.Run("fresh share", func(t *testing.T) {
		r := &record{allow: 33}
		for range 5 {
			r.decide(now, now, hundredPerHour, 1)
		}
		s, _ := r.snapshot(now, int64(time.Second), false, new(atomic.Uint64))
		r.decide(now, now, hundredPerHour, 1)
		r.decide(now, now, hundredPerHour, 1)
		r.apply(s, syncReply{lease: 4}, now, 100, 100)
		if r.allow != 30 || r.pending != 0 || !r.reserved {
			t.Fatalf("allow %d pending %d reserved %v, want the lease (4) plus the reserved rest of the share (28-2), nothing pending, reserved",
				r.allow, r.pending, r.reserved)
		}
	})
}

func TestRecordOfAFullKeyWithoutTrafficIsDropped(t *testing.T) {
	const now = int64(1e18)
	r := &record{allow: 1, reserved: true, limit: hundredPerHour}
	s, need := r.snapshot(now, int64(time.Second), false, new(atomic.Uint64))
	if !need || !s.idle {
		t.Fatalf("snapshot need %v idle %v, want an idle record that syncs (it holds a lease)", need, s.idle)
	}
	if !r.apply(s, syncReply{avail: 100}, now, 100, 100) {
		t.Fatal("an idle record of a full key was kept")
	}
	r = &record{allow: 1, reserved: true, limit: hundredPerHour}
	s, _ = r.snapshot(now, int64(time.Second), false, new(atomic.Uint64))
	r.decide(now, now, hundredPerHour, 1)
	if r.apply(s, syncReply{avail: 100}, now, 100, 50) {
		t.Fatal("a record used while its sync was in flight was dropped")
	}
	// Redis forgot the key; the request admitted in flight (from the
	// handed-back token) is counted as from a fresh share of 50.
	if r.reserved || r.pending != 1 || r.allow != 49 {
		t.Fatalf("record after its forgotten key was used in flight: %+v, want a fresh record with 49 left and 1 pending", *r)
	}
	if res := r.decide(now, now, hundredPerHour, 1); !res.Allowed {
		t.Fatal("the key's next request was denied although the fleet has its whole burst")
	}
}

func TestBlockedKeyWithoutTrafficIsNotSyncedUntilItRefills(t *testing.T) {
	const now, interval = int64(1e18), int64(100 * time.Millisecond)
	r := &record{reserved: true, retryAt: now + int64(30*time.Second)}
	if _, need := r.snapshot(now, interval, false, new(atomic.Uint64)); need {
		t.Fatal("a blocked idle key was synced 30s before its next token")
	}
	if _, need := r.snapshot(now+int64(30*time.Second), interval, false, new(atomic.Uint64)); !need {
		t.Fatal("a blocked idle key was not synced once its next token is due")
	}
}

func TestStaleViewMakesDecideFailOnceASyncHasFailed(t *testing.T) {
	a := openUnreachable(t, asyncMaxKeys)
	ctx := context.Background()
	if r, err := a.Rate(ctx, "z", "k", zones.RateStep{Op: zones.OpDecide, Limit: hundredPerHour, Cost: 1}); err != nil || !r.Allowed {
		t.Fatalf("Decide right after Open: %+v, %v; want allowed from a fresh share", r, err)
	}
	a.lastSync.Store(monotime.Now() - int64(3*time.Hour))
	// A sync merely late (a starved machine) keeps the view: its
	// allowances are leases, and the fail policy would admit more.
	if r, err := a.Rate(ctx, "z", "k", zones.RateStep{Op: zones.OpDecide, Limit: hundredPerHour, Cost: 1}); err != nil || !r.Allowed {
		t.Fatalf("Decide with a view 3h old and no failed sync: %+v, %v; want allowed from the view", r, err)
	}
	a.syncFailed.Store(true)
	_, err := a.Rate(ctx, "z", "k", zones.RateStep{Op: zones.OpDecide, Limit: hundredPerHour, Cost: 1})
	if !errors.Is(err, ErrStale) && !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Decide with a view 3h old after a failed sync: %v, want ErrStale or ErrUnavailable", err)
	}
}

// The records of a zone stay within its max_keys (SetMaxKeys), and Keys
// counts them: the zone's metric and admin local_keys read it.
func TestAsyncZoneKeepsAtMostItsMaxKeys(t *testing.T) {
	a := openUnreachable(t, asyncMaxKeys)
	a.SetMaxKeys("capped", 1000)
	ctx := context.Background()
	limit := algorithms.NewLimit(100, int64(time.Hour), 0)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1100 {
				if _, err := a.Rate(ctx, "capped", strconv.Itoa(g)+"-"+strconv.Itoa(i), zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
					t.Error(err)
					return
				}
				_ = a.Keys("capped")
			}
		})
	}
	wg.Wait()
	if n := a.Keys("capped"); n > 1000 || n < 900 {
		t.Fatalf("8800 keys in a zone with max_keys 1000: %d records, want at most 1000 (and the table used)", n)
	}
	if _, err := a.Rate(ctx, "other", "k", zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if n := a.Keys("other"); n != 1 {
		t.Fatalf("Keys(other) = %d, want 1", n)
	}
	if n := a.Len(); n != a.Keys("capped")+1 {
		t.Fatalf("Len %d, want the zones' keys summed", n)
	}
}

func TestDecideOnAKnownKeyAllocatesNothing(t *testing.T) {
	a := openUnreachable(t, asyncMaxKeys)
	ctx := context.Background()
	limit := algorithms.NewLimit(1_000_000_000, int64(time.Second), 0)
	key := string([]byte("known-key")) // not a constant: the lookup must not need one
	if _, err := a.Rate(ctx, "zone", key, zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := a.Rate(ctx, "zone", key, zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Decide on a known key allocates %v times per call, want 0", allocs)
	}
}

func TestFullZoneEvictsRecordsWithNothingPendingFirst(t *testing.T) {
	a := openUnreachable(t, 4)
	ctx := context.Background()
	limit := algorithms.NewLimit(100, int64(time.Hour), 0)
	// Three keys with admitted cost Redis has not seen, one without.
	for i := range 3 {
		if _, err := a.Rate(ctx, "z", "busy"+strconv.Itoa(i), zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	z := a.zone("z")
	s := z.shard("idle")
	s.mu.Lock()
	insert(z, s.m, "idle", &record{reserved: true})
	s.mu.Unlock()
	if _, err := a.Rate(ctx, "z", "new", zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	_, idleKept := s.m["idle"]
	n := len(s.m)
	s.mu.Unlock()
	if idleKept || n != 4 {
		t.Fatalf("after a 5th key in a zone capped at 4: idle kept %v, %d keys; want the idle one evicted, 4 keys", idleKept, n)
	}
}

func TestAReportWhoseReplyWasLostIsSentAgainUnchanged(t *testing.T) {
	const now = int64(1e18)
	var seq atomic.Uint64
	r := &record{allow: 10, reserved: true, limit: hundredPerHour}
	r.decide(now, now, hundredPerHour, 1)
	first, _ := r.snapshot(now, int64(time.Second), false, &seq)
	// The sync fails; meanwhile more requests are admitted.
	r.decide(now, now, hundredPerHour, 1)
	again, need := r.snapshot(now, int64(time.Second), false, &seq)
	if !need || again != first {
		t.Fatalf("after a lost reply the next sync sends %+v (need %v), want the same report %+v", again, need, first)
	}
	r.apply(again, syncReply{lease: 4}, now, 100, 100)
	next, _ := r.snapshot(now, int64(time.Second), false, &seq)
	if next.seq == first.seq {
		t.Fatal("a new report reuses the acknowledged report's sequence number")
	}
}

// A charge after the response takes what the allowance has; what it does
// not cover is reported at the next sync and counted in Redis past the
// burst, whether it lands before or during a sync.
func TestChargesPastTheAllowanceAreReportedAtTheNextSync(t *testing.T) {
	const now = int64(1e18)
	t.Run("lease", func(t *testing.T) {
		r := &record{allow: 10, reserved: true, limit: hundredPerHour}
		if res := r.check(now, now, hundredPerHour); !res.Allowed || res.Remaining != 10 {
			t.Fatalf("check on a lease of 10: %+v", res)
		}
		r.charge(25) // 10 from the lease, 15 beyond it
		if r.allow != 0 || r.pending != 15 {
			t.Fatalf("allow %d pending %d, want 0 and 15", r.allow, r.pending)
		}
		if res := r.check(now, now+int64(time.Second), hundredPerHour); res.Allowed {
			t.Fatalf("check after the lease is spent: %+v, want denied until the next sync", res)
		}
		s, _ := r.snapshot(now, int64(time.Second), false, new(atomic.Uint64))
		if d := s.delta(); d != 15 {
			t.Fatalf("the sync reports %d, want the 15 charged beyond the lease", d)
		}
		r.charge(4) // lands while the sync is in flight: nothing left to take it from
		r.apply(s, syncReply{lease: 0, avail: -30}, now, 100, 100)
		if r.allow != 0 || r.pending != 4 {
			t.Fatalf("allow %d pending %d, want 0 and the 4 charged in flight", r.allow, r.pending)
		}
	})
	t.Run("fresh share", func(t *testing.T) {
		r := &record{allow: 33, limit: hundredPerHour}
		r.charge(40)
		if r.allow != 0 || r.pending != 40 {
			t.Fatalf("allow %d pending %d, want 0 and 40: Redis knows nothing of a fresh share", r.allow, r.pending)
		}
		s, _ := r.snapshot(now, int64(time.Second), false, new(atomic.Uint64))
		if d := s.delta(); d != 40 {
			t.Fatalf("the sync reports %d, want 40", d)
		}
	})
}

func TestConcurrentChecksAndChargesOnOneKeyAllCount(t *testing.T) {
	a := openUnreachable(t, 1000)
	limit := algorithms.NewLimit(1000, int64(time.Hour), 0)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, err := a.Rate(ctx, "z", "k", zones.RateStep{Op: zones.OpCheck, Limit: limit}); err != nil {
					t.Error(err)
					return
				}
				if _, err := a.Rate(ctx, "z", "k", zones.RateStep{Op: zones.OpCharge, Limit: limit, Cost: 2}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	z := a.zone("z")
	s := z.shard("k")
	s.mu.Lock()
	r := s.m["k"]
	s.mu.Unlock()
	// A fresh share of the whole burst (1 instance): 1280 charged, 1000
	// of it from the share, all of it pending for the first sync.
	if r.allow != 0 || r.pending != 1280 {
		t.Fatalf("allow %d pending %d after 640 charges of 2, want 0 and 1280", r.allow, r.pending)
	}
}

// A record holding a lease is sent only when the lease needs Redis: running
// low, at its lifetime, or while the fleet is short of tokens; at Close
// every lease goes back.
func TestRecordWithALeaseIsSentOnlyWhenTheLeaseNeedsIt(t *testing.T) {
	const now, interval = int64(1e18), int64(100 * time.Millisecond)
	far := now + int64(time.Hour) // a lifetime that does not end in the case
	cases := []struct {
		name  string
		r     record
		spent int64 // admitted since the last sync
		all   bool
		want  bool
	}{
		{"plenty left for its use, fleet has room", record{allow: 50, renewAt: far, roomy: true}, 3, false, false},
		{"idle with a lease, fleet has room", record{allow: 50, renewAt: far, roomy: true}, 0, false, false},
		{"less left than twice the last interval's use", record{allow: 5, renewAt: far, roomy: true}, 3, false, true},
		{"exactly twice the last interval's use left", record{allow: 6, renewAt: far, roomy: true}, 3, false, false},
		{"empty and idle, the fleet has a token", record{allow: 0, renewAt: far, roomy: true, retryAt: now}, 0, false, true},
		{"lifetime ends before the next sync", record{allow: 50, renewAt: now + interval, roomy: true}, 3, false, true},
		{"lifetime ends after the next sync", record{allow: 50, renewAt: now + interval + 1, roomy: true}, 3, false, false},
		{"fleet short of tokens", record{allow: 50, renewAt: far}, 3, false, true},
		{"dormant", record{dormant: true, renewAt: now, roomy: true}, 0, false, false},
		{"blocked, its requests denied", record{allow: 0, renewAt: far, retryAt: now + int64(time.Minute), used: true}, 0, false, false},
		{"blocked, its requests denied, at its lifetime", record{allow: 0, renewAt: now, retryAt: now + int64(time.Minute), used: true}, 0, false, true},
		{"closing with a lease", record{allow: 1, renewAt: far, roomy: true}, 0, true, true},
		{"closing without one", record{allow: 0, renewAt: far, roomy: true}, 0, true, false},
	}
	for _, c := range cases {
		r := c.r
		r.reserved, r.limit = true, hundredPerHour
		r.used, r.spent = r.used || c.spent > 0, c.spent
		if _, got := r.snapshot(now, interval, c.all, new(atomic.Uint64)); got != c.want {
			t.Errorf("%s: sent %v, want %v", c.name, got, c.want)
		}
	}
}

// A report at the end of a lease's lifetime from a record idle since the
// sync before hands everything back and leaves the record dormant.
func TestIdleRecordAtItsLifetimeGoesDormant(t *testing.T) {
	const now, interval = int64(1e18), int64(100 * time.Millisecond)
	r := &record{allow: 40, reserved: true, roomy: true, renewAt: now + int64(time.Hour), limit: hundredPerHour}
	if _, need := r.snapshot(now, interval, false, new(atomic.Uint64)); need {
		t.Fatal("an idle record with a live lease and room in the fleet was sent")
	}
	r.renewAt = now
	s, need := r.snapshot(now+interval, interval, false, new(atomic.Uint64))
	if !need || !s.final || s.delta() != -40 {
		t.Fatalf("at its lifetime: sent %v final %v delta %d, want the whole lease of 40 handed back", need, s.final, s.delta())
	}
	r.apply(s, syncReply{avail: 90}, now+interval, 100, 100)
	if !r.dormant || r.allow != 0 {
		t.Fatalf("after handing back: dormant %v allow %d, want dormant with nothing", r.dormant, r.allow)
	}
}

// With every record of a full shard pending, the one with least pending
// goes (losing it loses the fewest admissions Redis has not counted). The
// shard's 4 records are all in the eviction sample, so the choice does not
// depend on map order.
func TestFullZoneEvictsTheRecordWithLeastPending(t *testing.T) {
	for run := range 20 { // map order differs between runs
		a := openUnreachable(t, 4)
		ctx := context.Background()
		limit := algorithms.NewLimit(100, int64(time.Hour), 0)
		for i, n := range []int{3, 1, 2, 4} {
			for range n {
				if _, err := a.Rate(ctx, "z", "k"+strconv.Itoa(i), zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := a.Rate(ctx, "z", "new", zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		z := a.zone("z")
		s := z.shard("k1")
		s.mu.Lock()
		_, kept := s.m["k1"]
		n := len(s.m)
		s.mu.Unlock()
		if kept || n != 4 {
			t.Fatalf("run %d: a 5th key in a zone capped at 4 whose keys have 3, 1, 2 and 4 pending: the one with 1 kept %v, %d keys; want it evicted, 4 keys", run, kept, n)
		}
	}
}

// A quota sync that fails is one failure for its breaker, however many
// records it carried, as an async sync is: eight keys handing leases back
// to an unreachable Redis do not open the breaker in one round.
func TestFailedQuotaSyncIsOneFailureForTheBreaker(t *testing.T) {
	a := openUnreachable(t, asyncMaxKeys)
	periods := zones.PeriodsAt(algorithms.Day, time.Now(), time.UTC)
	end := monotime.Now() + int64(time.Hour)
	z := a.zone("q")
	for i := range 8 {
		key := "k" + strconv.Itoa(i)
		s := z.shard(key)
		s.mu.Lock()
		insert(z, s.q, key, &quotaRecord{endMono: end, used: 1, held: 16, known: true, q: zones.QuotaLimit{Limit: 1000, Periods: &periods}})
		s.mu.Unlock()
	}
	// The heartbeat beats once at Open, and again only a second later.
	for deadline := time.Now().Add(5 * time.Second); a.breaker.failures.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the first heartbeat to an unreachable Redis counted no failure")
		}
		time.Sleep(time.Millisecond)
	}
	before := a.breaker.failures.Load()
	a.syncQuotas(context.Background(), false)
	if got := a.breaker.failures.Load() - before; got != 1 || a.breaker.state.Load() != stateClosed {
		t.Fatalf("after one failed quota sync of 8 records: %d failures counted, breaker state %d; want 1 and closed", got, a.breaker.state.Load())
	}
}
