package zones

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func concurrencyZone(t *testing.T, c Config, store Store) *Zone {
	t.Helper()
	if c.Name == "" {
		c.Name = "uploads"
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	st := NewState(c, time.Hour)
	t.Cleanup(func() { _ = st.Destruct() })
	return mustNew(c, st, store)
}

// Many goroutines hammer one key (and others sharing its shards): the count
// of slots held never passes the limit, and every slot given back leaves the
// table empty.
func TestLocalConcurrencyNeverExceedsTheLimitUnderRace(t *testing.T) {
	z := concurrencyZone(t, Config{Concurrency: 5, MaxKeys: 1000}, nil)
	var inFlight, peak, allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				key := "shared"
				if i%2 == 1 {
					key = fmt.Sprintf("own-%d", g)
				}
				d, slot := z.Acquire(context.Background(), key)
				if d.Allowed != slot.Held() {
					t.Errorf("allowed=%v but slot held=%v", d.Allowed, slot.Held())
				}
				if !d.Allowed {
					if d.RetryAfter != time.Second {
						t.Errorf("denial Retry-After %v, want 1s", d.RetryAfter)
					}
					continue
				}
				if key == "shared" {
					allowed.Add(1)
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					inFlight.Add(-1)
				}
				z.Release(slot)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > 5 || p < 1 {
		t.Fatalf("peak in flight for one key %d, want 1..5", p)
	}
	if allowed.Load() == 0 {
		t.Fatal("no request was allowed")
	}
	if n := z.State().Len(); n != 0 {
		t.Fatalf("%d keys left in the table after every slot was released, want 0", n)
	}
	if n := z.InFlight(); n != 0 {
		t.Fatalf("in-flight gauge %d after every slot was released, want 0", n)
	}
}

func TestLocalConcurrencyAdmitsExactlyNThenFreesOnRelease(t *testing.T) {
	z := concurrencyZone(t, Config{Concurrency: 3}, nil)
	var held []Slot
	for i := range 3 {
		d, s := z.Acquire(context.Background(), "k")
		if !d.Allowed || d.Remaining != int64(2-i) {
			t.Fatalf("request %d: %+v, want allowed with %d remaining", i+1, d, 2-i)
		}
		held = append(held, s)
	}
	if d, s := z.Acquire(context.Background(), "k"); d.Allowed || s.Held() {
		t.Fatalf("4th request in flight allowed: %+v", d)
	}
	if d, _ := z.Acquire(context.Background(), "other"); !d.Allowed {
		t.Fatal("another key is limited by k's slots")
	}
	if got, _ := z.SlotsInUse(context.Background(), "k"); got != 3 {
		t.Fatalf("SlotsInUse %d, want 3", got)
	}
	z.Release(held[0])
	if d, _ := z.Acquire(context.Background(), "k"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after one release: %+v, want allowed with 0 remaining", d)
	}
	z.Release(Slot{}) // the zero Slot holds nothing
	if got := z.InFlight(); got != 4 {
		t.Fatalf("in flight %d, want 4 (3 of k, 1 of other)", got)
	}
}

// max_keys bounds the table: when that many keys are in flight, a new key
// is denied (nothing in flight may be evicted), and admitted again once one
// finishes.
func TestLocalConcurrencyTableIsBoundedByMaxKeys(t *testing.T) {
	z := concurrencyZone(t, Config{Concurrency: 2, MaxKeys: 10}, nil)
	var held []Slot
	for i := range 10 {
		d, s := z.Acquire(context.Background(), fmt.Sprintf("k%d", i))
		if !d.Allowed {
			t.Fatalf("key %d of 10 denied", i)
		}
		held = append(held, s)
	}
	if d, _ := z.Acquire(context.Background(), "k10"); d.Allowed {
		t.Fatal("an 11th key was admitted into a table of max_keys 10")
	}
	if d, _ := z.Acquire(context.Background(), "k3"); !d.Allowed {
		t.Fatal("a key already in the table was denied its second slot")
	}
	z.Release(held[0])
	if d, _ := z.Acquire(context.Background(), "k10"); !d.Allowed {
		t.Fatal("a new key is still denied after a key left the table")
	}
	if n := z.State().Len(); n > 10 {
		t.Fatalf("table holds %d keys, max_keys 10", n)
	}
}

func TestConcurrencyConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Name: "u", Concurrency: 2, Events: 10}, "concurrency replaces events"},
		{Config{Name: "u", Concurrency: 2, Window: time.Minute}, "concurrency replaces events"},
		{Config{Name: "u", Lease: time.Minute, Events: 1, Window: time.Second}, "lease only applies"},
		{Config{Name: "u", Concurrency: 2, Lease: 10 * time.Millisecond}, "lease must be at least 1s"},
		{Config{Name: "u", Concurrency: -1}, "lease only applies"},
	} {
		if err := tc.c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.c, err, tc.want)
		}
	}
	if err := (Config{Name: "u", Concurrency: 1, Lease: time.Second}).Validate(); err != nil {
		t.Errorf("a valid concurrency zone: %v", err)
	}
}

// brokenSlotStore is a store whose every call fails, as a Redis outage with
// the breaker open does: the fail policies are what is under test.
type brokenSlotStore struct{ instances int }

var errDown = errors.New("store down")

func (b brokenSlotStore) Rate(context.Context, string, string, RateStep) (RateReply, error) {
	return RateReply{}, errDown
}
func (b brokenSlotStore) Quota(context.Context, string, string, QuotaStep) (QuotaResult, error) {
	return QuotaResult{}, errDown
}
func (b brokenSlotStore) Offers() Offers { return Offers{Mode: "strict", Slots: b} }
func (b brokenSlotStore) Instances() int { return b.instances }
func (b brokenSlotStore) Acquire(context.Context, string, string, int64, time.Duration) (string, int64, error) {
	return "", 0, errDown
}
func (b brokenSlotStore) Release(string, string, string) {
	panic("released a slot the store never gave")
}
func (b brokenSlotStore) Slots(context.Context, string, string) (int64, error) {
	return 0, errDown
}

func TestConcurrencyFailPolicies(t *testing.T) {
	admitted := func(z *Zone) (n int, src Source, held []Slot) {
		for range 20 {
			d, s := z.Acquire(context.Background(), "k")
			if d.Err == nil {
				t.Fatal("a fail-policy decision carries no error")
			}
			src = d.Source
			if d.Allowed {
				n++
				held = append(held, s)
			}
		}
		return n, src, held
	}
	// local: ⌊7/3⌋ = 2 per instance; ⌊2/3⌋ = 0 becomes 1.
	for _, tc := range []struct {
		policy             FailPolicy
		concurrency, insts int
		want               int
		src                Source
	}{
		{FailLocal, 7, 3, 2, SourceFailLocal},
		{FailLocal, 2, 3, 1, SourceFailLocal},
		{FailLocal, 4, 1, 4, SourceFailLocal},
		{FailOpen, 2, 3, 20, SourceFailOpen},
		{FailClosed, 2, 3, 0, SourceFailClosed},
	} {
		z := concurrencyZone(t, Config{Concurrency: int64(tc.concurrency), FailPolicy: tc.policy}, brokenSlotStore{tc.insts})
		n, src, held := admitted(z)
		if n != tc.want || src != tc.src {
			t.Errorf("%v, concurrency %d, %d instances: %d of 20 admitted (source %v), want %d (source %v)",
				tc.policy, tc.concurrency, tc.insts, n, src, tc.want, tc.src)
		}
		for _, s := range held {
			z.Release(s)
		}
		if z.InFlight() != 0 || z.State().Len() != 0 {
			t.Errorf("%v: after release, in flight %d and %d keys, want 0 and 0", tc.policy, z.InFlight(), z.State().Len())
		}
	}
}

// A request taking and giving back a slot of a key nobody else holds (the
// usual case: the key's entry is added and deleted by each request)
// allocates nothing, and the sweeper gives the emptied table's memory back.
func TestLocalSlotOfANewKeyAllocatesNothing(t *testing.T) {
	c := Config{Name: "uploads", Concurrency: 4}
	st := NewState(c, 20*time.Millisecond)
	t.Cleanup(func() { _ = st.Destruct() })
	z := mustNew(c, st, nil)
	keys := makeBenchKeys(10_000)
	ctx := context.Background()
	for _, k := range keys {
		_, s := z.Acquire(ctx, k)
		z.Release(s)
	}
	i := 0
	if n := testing.AllocsPerRun(10_000, func() {
		d, s := z.Acquire(ctx, keys[i])
		if !d.Allowed {
			t.Fatal("denied a key with no request in flight")
		}
		z.Release(s)
		i = (i + 1) % len(keys)
	}); n != 0 {
		t.Fatalf("%v allocations per request, want 0", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for localBytes(st) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper left %d bytes in an empty concurrency table", localBytes(st))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkZoneAcquireReleaseParallel measures a local concurrency zone's
// per-request cost, Acquire then Release, from every P at once over 100k
// keys that are not in flight (the common case: the entry is created and
// deleted by each request). Target: 0 allocs/op.
func BenchmarkZoneAcquireReleaseParallel(b *testing.B) {
	keys := makeBenchKeys(benchKeys)
	c := Config{Name: "bench", Concurrency: 4}
	state := NewState(c, time.Hour)
	defer state.Destruct()
	z := mustNew(c, state, nil)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(keys))
		for pb.Next() {
			d, s := z.Acquire(ctx, keys[i])
			if !d.Allowed {
				b.Error("denied: the benchmark never has 4 requests of one key in flight")
				return
			}
			z.Release(s)
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
}

// localBytes is the memory of st's current local in-flight table.
func localBytes(st *State) int {
	cur, _ := st.conc.current()
	return cur.local.kt.Bytes()
}

// A state whose zone is redefined with another concurrency or max_keys (a
// reload: the root package pools a concurrency zone's state by name) keeps
// counting the slots taken before: they count against the new limit until
// released, in the table they were taken in, and the old table goes once
// empty.
func TestLocalSlotsCountAcrossRedefinitionsOfTheZone(t *testing.T) {
	ctx := context.Background()
	c := Config{Name: "uploads", Concurrency: 2, MaxKeys: 5000}
	st := NewState(c, time.Hour)
	t.Cleanup(func() { _ = st.Destruct() })
	z := mustNew(c, st, nil)
	var held []Slot
	for range 2 {
		_, s := z.Acquire(ctx, "alice")
		held = append(held, s)
	}
	c.Concurrency = 3
	z3 := mustNew(c, st, nil)
	if d, s := z3.Acquire(ctx, "alice"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("concurrency 2 -> 3 with 2 held: %+v, want allowed with 0 remaining", d)
	} else {
		held = append(held, s)
	}
	if d, _ := z3.Acquire(ctx, "alice"); d.Allowed {
		t.Fatal("a 4th slot at concurrency 3")
	}
	c.MaxKeys = 6000
	z6 := mustNew(c, st, nil)
	if d, _ := z6.Acquire(ctx, "alice"); d.Allowed {
		t.Fatal("a 4th slot at concurrency 3 after max_keys 5000 -> 6000")
	}
	if n, _ := z6.SlotsInUse(ctx, "alice"); n != 3 || z6.InFlight() != 3 {
		t.Fatalf("slots in use %d, in flight %d, want 3 and 3", n, z6.InFlight())
	}
	z.Release(held[0])
	d, s := z6.Acquire(ctx, "alice")
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after one of 3 released: %+v, want allowed with 0 remaining", d)
	}
	held = append(held[1:], s)
	for _, s := range held {
		z6.Release(s)
	}
	st.conc.sweep(0)
	if g := len(*st.conc.gens.Load()); g != 1 || st.Len() != 0 || z6.InFlight() != 0 {
		t.Fatalf("after every slot was released: %d generations, %d keys, %d in flight; want 1, 0, 0", g, st.Len(), z6.InFlight())
	}
}
