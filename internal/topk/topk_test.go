package topk

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const minute = int64(time.Minute)

// skewedFlood is the flood: one key sends half the events, four keys
// a tenth each, and the rest is spread over 10,000 keys. It returns the
// events in a shuffled order and the true count of every key.
func skewedFlood(n int, seed uint64) ([]string, map[string]uint64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	events := make([]string, 0, n)
	for i := 0; i < n; i++ {
		switch p := rng.IntN(100); {
		case p < 50:
			events = append(events, "heavy-0")
		case p < 90:
			events = append(events, "heavy-"+strconv.Itoa(1+(p-50)/10))
		default:
			events = append(events, "spread-"+strconv.Itoa(rng.IntN(10_000)))
		}
	}
	truth := make(map[string]uint64)
	for _, k := range events {
		truth[k]++
	}
	return events, truth
}

func TestSkewedFloodTopFiveAreTheFiveHeavyKeys(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		events, truth := skewedFlood(200_000, seed)
		r := NewRecent(DefaultCapacity, minute)
		for _, k := range events {
			r.Record(k, 0)
		}
		sum := r.Top(5, 0)
		top, total := sum.Top, sum.Total
		if total != uint64(len(events)) {
			t.Fatalf("seed %d: total %d, want %d", seed, total, len(events))
		}
		if len(top) != 5 || top[0].Key != "heavy-0" {
			t.Fatalf("seed %d: top 5 = %+v, want heavy-0 first", seed, top)
		}
		found := map[string]bool{}
		for _, e := range top {
			found[e.Key] = true
			if tc := truth[e.Key]; tc > e.Count || tc < e.Count-e.Error {
				t.Errorf("seed %d: %s counted %d±%d, true count %d outside the bounds", seed, e.Key, e.Count, e.Error, tc)
			}
		}
		for i := 0; i < 5; i++ {
			if k := "heavy-" + strconv.Itoa(i); !found[k] {
				t.Errorf("seed %d: %s is missing from the top 5 %+v", seed, k, top)
			}
		}
	}
}

// Every key above N/k is reported, and every reported bound holds, for a
// Zipf-distributed stream (many keys, a long tail).
func TestBoundsHoldAndEveryHeavyHitterIsReported(t *testing.T) {
	const capacity, n = 64, 100_000
	rng := rand.New(rand.NewPCG(7, 7))
	zipf := rand.NewZipf(rng, 1.1, 1, 50_000)
	s := NewRecent(capacity, minute)
	truth := map[string]uint64{}
	for i := 0; i < n; i++ {
		k := "k" + strconv.FormatUint(zipf.Uint64(), 10)
		truth[k]++
		s.Record(k, 0)
	}
	top := s.Top(-1, 0).Top
	reported := map[string]Entry{}
	for _, e := range top {
		reported[e.Key] = e
		if tc := truth[e.Key]; tc > e.Count || tc < e.Count-e.Error {
			t.Errorf("%s counted %d±%d, true count %d outside the bounds", e.Key, e.Count, e.Error, tc)
		}
		if e.Error > n/capacity {
			t.Errorf("%s has error %d, more than N/k = %d", e.Key, e.Error, n/capacity)
		}
	}
	for k, tc := range truth {
		if _, ok := reported[k]; tc > n/capacity && !ok {
			t.Errorf("%s was counted %d times (> N/k = %d) but is not reported", k, tc, n/capacity)
		}
	}
}

func TestRecentCoversTheCurrentAndPreviousPeriod(t *testing.T) {
	r := NewRecent(8, minute)
	t0 := 100 * minute
	r.Record("a", t0+1)
	r.Record("a", t0+2)
	r.Record("b", t0+minute) // next period
	s := r.Top(10, t0+minute+5)
	top, since, total := s.Top, s.Since, s.Total
	if len(top) != 2 || top[0] != (Entry{Key: "a", Count: 2}) || top[1] != (Entry{Key: "b", Count: 1}) || total != 3 || since != t0 {
		t.Fatalf("after two periods: %+v since %d total %d, want a=2, b=1 since %d", top, since, total, t0)
	}
	// Two periods later, a's period has left the window.
	s = r.Top(10, t0+2*minute)
	top, since, total = s.Top, s.Since, s.Total
	if len(top) != 1 || top[0] != (Entry{Key: "b", Count: 1}) || total != 1 || since != t0+minute {
		t.Fatalf("one period later: %+v since %d total %d, want only b since %d", top, since, total, t0+minute)
	}
	// After a long quiet spell nothing is left.
	r.Record("c", t0+10*minute)
	s = r.Top(10, t0+10*minute)
	top, total = s.Top, s.Total
	if len(top) != 1 || top[0].Key != "c" || total != 1 {
		t.Fatalf("after a quiet spell: %+v total %d, want only c", top, total)
	}
}

// A key tracked in one period but evicted from the full sketch of the other
// may have been counted there up to that sketch's least count: the merged
// bounds must say so.
func TestMergedBoundsAccountForEvictedKeys(t *testing.T) {
	r := NewRecent(2, minute)
	for _, k := range []string{"a", "a", "a", "b", "b", "c"} { // c evicts b (count 2)
		r.Record(k, 0)
	}
	for _, k := range []string{"b", "d"} {
		r.Record(k, minute)
	}
	s := r.Top(-1, minute)
	top, total := s.Top, s.Total
	truth := map[string]uint64{"a": 3, "b": 3, "c": 1, "d": 1}
	if total != 8 {
		t.Fatalf("total %d, want 8", total)
	}
	for _, e := range top {
		if tc := truth[e.Key]; tc > e.Count || tc < e.Count-e.Error {
			t.Errorf("%s counted %d±%d, true count %d outside the bounds (top %+v)", e.Key, e.Count, e.Error, tc, top)
		}
	}
}

// Three instances each see part of the flood; merging their top 20 finds the
// fleet's five heavy keys, with bounds that hold the fleet's true counts.
func TestMergedInstancesFindTheFleetsHeavyKeys(t *testing.T) {
	events, truth := skewedFlood(150_000, 11)
	rng := rand.New(rand.NewPCG(3, 3))
	instances := []*Recent{NewRecent(DefaultCapacity, minute), NewRecent(DefaultCapacity, minute), NewRecent(DefaultCapacity, minute)}
	for _, k := range events {
		instances[rng.IntN(len(instances))].Record(k, 0)
	}
	var sums []Summary
	for _, r := range instances {
		sums = append(sums, r.Top(20, 0))
	}
	fleet := Merge(5, sums...)
	if fleet.Total != uint64(len(events)) || len(fleet.Top) != 5 || fleet.Top[0].Key != "heavy-0" {
		t.Fatalf("merged: total %d top %+v, want %d events and heavy-0 first", fleet.Total, fleet.Top, len(events))
	}
	for _, e := range fleet.Top {
		if tc := truth[e.Key]; tc > e.Count || tc < e.Count-e.Error || !strings.HasPrefix(e.Key, "heavy-") {
			t.Errorf("%s counted %d±%d, true count %d", e.Key, e.Count, e.Error, tc)
		}
	}
	// Every key of the union, however few instances list it, keeps
	// bounds that hold; keys nobody lists stay under the merged floor.
	all := Merge(-1, sums...)
	listed := map[string]bool{}
	for _, e := range all.Top {
		listed[e.Key] = true
		if tc := truth[e.Key]; tc > e.Count || tc < e.Count-e.Error {
			t.Errorf("%s counted %d±%d in the union, true count %d", e.Key, e.Count, e.Error, tc)
		}
	}
	for k, tc := range truth {
		if !listed[k] && tc > all.Floor {
			t.Errorf("%s (true count %d) is listed by no instance but above the floor %d", k, tc, all.Floor)
		}
	}
}

func TestRecordingATrackedKeyAllocatesNothing(t *testing.T) {
	r := NewRecent(DefaultCapacity, minute)
	keys := make([]string, DefaultCapacity)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
		r.Record(keys[i], 0)
	}
	i := 0
	if a := testing.AllocsPerRun(10_000, func() {
		r.Record(keys[i%len(keys)], 0)
		i++
	}); a != 0 {
		t.Errorf("Record of a tracked key: %v allocations, want 0", a)
	}
}

// heapAfter returns the live heap after recording n distinct keys (each
// denied twice) in a fresh Recent, with the Recent still reachable.
func heapAfter(t *testing.T, n int) uint64 {
	t.Helper()
	r := NewRecent(DefaultCapacity, minute)
	buf := make([]byte, 0, 64)
	for i := 0; i < n; i++ {
		buf = strconv.AppendInt(append(buf[:0], "203.0.113.0/client-"...), int64(i), 10)
		r.Record(string(buf), 0)
		r.Record(string(buf), 0)
	}
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	runtime.KeepAlive(r)
	return m.HeapAlloc
}

func TestMemoryIsConstantAsKeysGrow(t *testing.T) {
	base := heapAfter(t, 0)
	small := heapAfter(t, 10_000)
	large := heapAfter(t, 200_000)
	t.Logf("live heap: empty %d B, after 10k keys %d B, after 200k keys %d B", base, small, large)
	// 20 times the keys may not cost more than a few kilobytes more
	// (heap measurements move by a page or two on their own).
	if large > small+64<<10 {
		t.Errorf("live heap grew from %d B (10k keys) to %d B (200k keys): the sketch is not bounded", small, large)
	}
}

func TestConcurrentRecordAndTop(t *testing.T) {
	r := NewRecent(16, minute)
	var wg sync.WaitGroup
	const writers, each = 8, 5_000
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r.Record("k"+strconv.Itoa(i%40), int64(i/1000)*minute)
			}
		}()
	}
	for q := 0; q < 2; q++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				top := r.Top(5, int64(i/100)*minute).Top
				if len(top) > 5 {
					t.Errorf("Top(5) returned %d entries", len(top))
					return
				}
			}
		}()
	}
	wg.Wait()
	if total := r.Top(-1, 4*minute).Total; total == 0 || total > writers*each {
		t.Errorf("total %d after %d records", total, writers*each)
	}
}

func BenchmarkRecordTrackedKey(b *testing.B) {
	r := NewRecent(DefaultCapacity, minute)
	keys := make([]string, 32)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			r.Record(keys[i%len(keys)], 0)
			i++
		}
	})
}

func BenchmarkRecordSpreadKeys(b *testing.B) {
	r := NewRecent(DefaultCapacity, minute)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.Record(keys[i%len(keys)], 0)
	}
}
