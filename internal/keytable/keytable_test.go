package keytable

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func set(t *Table, key string, value, now int64) {
	t.Update(key, now, func(int64, bool) (int64, Op) { return value, Store })
}

// The table agrees with a Go map through random inserts, updates, deletes
// and sweeps, over keys of every length the zones use (empty, short, long),
// through growth, shrinking and arena compaction.
func TestTableAgreesWithAMap(t *testing.T) {
	tab := New(1 << 20) // never full: nothing is evicted
	ref := map[string]int64{}
	rng := rand.New(rand.NewPCG(1, 2))
	keyOf := func(i int) string {
		switch i % 4 {
		case 0:
			return fmt.Sprint(i)
		case 1:
			return fmt.Sprintf("key-%012d", i)
		case 2:
			return strings.Repeat("k", 100+i%200) + fmt.Sprint(i)
		}
		return fmt.Sprintf("%x", i)
	}
	for step := range 200_000 {
		k := keyOf(rng.IntN(20_000))
		switch op := rng.IntN(100); {
		case op < 60:
			v := rng.Int64N(1000)
			set(tab, k, v, 0)
			ref[k] = v
		case op < 90:
			tab.Delete(k)
			delete(ref, k)
		case op < 99:
			got, ok := tab.Get(k)
			want, wok := ref[k]
			if ok != wok || got != want {
				t.Fatalf("step %d: Get(%q) = %d %v, want %d %v", step, k, got, ok, want, wok)
			}
		default:
			now := rng.Int64N(1000)
			n := tab.Sweep(now)
			for rk, v := range ref {
				if v <= now {
					delete(ref, rk)
				}
			}
			if n != len(ref) {
				t.Fatalf("step %d: sweep left %d keys, want %d", step, n, len(ref))
			}
		}
	}
	if tab.Len() != len(ref) {
		t.Fatalf("table holds %d keys, want %d", tab.Len(), len(ref))
	}
	for k, want := range ref {
		if got, ok := tab.Get(k); !ok || got != want {
			t.Fatalf("Get(%q) = %d %v, want %d", k, got, ok, want)
		}
	}
	set(tab, "", 7, 0)
	if v, ok := tab.Get(""); !ok || v != 7 {
		t.Fatalf("the empty key: %d %v", v, ok)
	}
}

// Two keys whose hashes agree in every bit the table keeps are still two
// entries: keys are compared byte for byte.
func TestCollidingHashesKeepKeysApart(t *testing.T) {
	s := &shard{}
	const tag = 0x12345679
	s.insert(tag, "alice", 1)
	s.insert(tag, "mallory", 2)
	for key, want := range map[string]int64{"alice": 1, "mallory": 2} {
		if i := s.find(tag, key); i < 0 || s.slots[i].value != want {
			t.Fatalf("%s: slot %d", key, i)
		}
	}
	if i := s.find(tag, "bob"); i >= 0 {
		t.Fatal("found a key never stored, by its hash alone")
	}
	s.deleteAt(s.find(tag, "alice"))
	if i := s.find(tag, "mallory"); i < 0 || s.slots[i].value != 2 {
		t.Fatal("deleting one colliding key lost the other")
	}
}

// Keys on either side of the inline length (kept in their slot up to 16
// bytes, in the arena beyond), keys that differ only by trailing zero bytes
// and the empty key, all with one hash, stay apart through deletes,
// compaction and eviction.
func TestKeysAroundTheInlineLengthStayApart(t *testing.T) {
	keys := []string{"", "a", "a\x00", "a\x00\x00", strings.Repeat("\x00", 16), strings.Repeat("\x00", 17),
		strings.Repeat("k", 15), strings.Repeat("k", 16), strings.Repeat("k", 17), strings.Repeat("k", 16) + "\x00",
		strings.Repeat("k", 300)}
	s := &shard{}
	const tag = 0x2468ace1
	for i, k := range keys {
		s.insert(tag, k, int64(i+1))
	}
	check := func(stage string, gone map[string]bool) {
		t.Helper()
		for i, k := range keys {
			j := s.find(tag, k)
			switch {
			case gone[k] && j >= 0:
				t.Fatalf("%s: %q found after it was deleted", stage, k)
			case !gone[k] && (j < 0 || s.slots[j].value != int64(i+1)):
				t.Fatalf("%s: %q at slot %d, want value %d", stage, k, j, i+1)
			}
		}
	}
	check("inserted", nil)
	gone := map[string]bool{}
	for _, k := range []string{"a", strings.Repeat("k", 17), strings.Repeat("\x00", 17), strings.Repeat("\x00", 16)} {
		s.deleteAt(s.find(tag, k))
		gone[k] = true
	}
	check("deleted", gone)
	if s.dead != 34 {
		t.Fatalf("%d dead arena bytes, want 34 (the two 17-byte keys; short keys take none)", s.dead)
	}
	s.compact(0)
	if len(s.keys) != 16+1+300 {
		t.Fatalf("arena of %d bytes after compaction, want the 317 of the two long keys left", len(s.keys))
	}
	check("compacted", gone)
	// Each entry evicted by its copy is the entry copied, not an earlier
	// one sharing its hash and slot bytes but not its length.
	for _, k := range []string{"a\x00\x00", strings.Repeat("k", 16)} {
		s.deleteAt(s.slotOf(s.slots[s.find(tag, k)]))
		gone[k] = true
	}
	check("evicted", gone)
}

func TestNeverHoldsMoreThanMaxKeys(t *testing.T) {
	for _, maxKeys := range []int{1, 10, 1000, 100_000} {
		tab := New(maxKeys)
		for i := range maxKeys * 3 {
			set(tab, fmt.Sprint("k", i), 10, 1)
		}
		if n := tab.Len(); n > maxKeys || n < maxKeys/2 {
			t.Errorf("max_keys %d: table holds %d keys", maxKeys, n)
		}
	}
}

func TestFullShardEvictsExpiredEntriesFirst(t *testing.T) {
	tab := New(10) // one shard of 10
	for i := range 9 {
		set(tab, fmt.Sprint("old", i), 1000, 0) // expired at 5000
	}
	set(tab, "active", 5500, 4500)
	for i := range 9 {
		set(tab, fmt.Sprint("new", i), 6000, 5000)
	}
	if _, ok := tab.Get("active"); !ok {
		t.Fatal("an active key was evicted while expired keys were left to evict")
	}
}

func TestStoreIfRoomNeverEvicts(t *testing.T) {
	tab := New(10)
	for i := range 10 {
		set(tab, fmt.Sprint("held", i), 1, 100) // expired, but StoreIfRoom must not evict
	}
	if tab.Update("late", 100, func(int64, bool) (int64, Op) { return 1, StoreIfRoom }) {
		t.Fatal("a key was added to a full shard")
	}
	if tab.Len() != 10 {
		t.Fatalf("%d keys held, want the 10 there were", tab.Len())
	}
	if !tab.Update("held3", 100, func(v int64, _ bool) (int64, Op) { return v + 1, StoreIfRoom }) {
		t.Fatal("a key the full shard holds could not be updated")
	}
}

// StoreIfExpired makes room only from expired entries (<= the now given):
// a full shard of live ones refuses a new key and keeps every entry.
func TestStoreIfExpiredEvictsOnlyExpiredEntries(t *testing.T) {
	tab := New(10) // one shard of 10
	for i := range 10 {
		set(tab, fmt.Sprint("live", i), 1000, 0)
	}
	store := func(key string, now int64) bool {
		return tab.Update(key, now, func(int64, bool) (int64, Op) { return 2000, StoreIfExpired })
	}
	if store("late", 999) {
		t.Fatal("a key was added to a shard full of live entries")
	}
	if tab.Len() != 10 {
		t.Fatalf("%d keys held, want the 10 live ones", tab.Len())
	}
	if !store("live3", 999) {
		t.Fatal("a key the full shard holds could not be updated")
	}
	if !store("after", 1000) { // all but live3 have expired at 1000
		t.Fatal("no room made from expired entries")
	}
	for _, k := range []string{"live3", "after"} {
		if _, ok := tab.Get(k); !ok {
			t.Errorf("%s, not expired, was evicted", k)
		}
	}
	if got := tab.CountAbove(1000); got != 2 {
		t.Errorf("CountAbove(1000) = %d, want 2", got)
	}
}

// A sweep that empties the table gives back the memory its keys took.
func TestSweepGivesMemoryBack(t *testing.T) {
	tab := New(1 << 20)
	for i := range 300_000 {
		set(tab, fmt.Sprintf("key-%012d", i), 10, 0)
	}
	set(tab, "survivor", 1000, 0)
	full := tab.Bytes()
	if left := tab.Sweep(100); left != 1 {
		t.Fatalf("sweep left %d keys", left)
	}
	if after := tab.Bytes(); after > 4096 {
		t.Fatalf("after a sweep left one key, the table holds %d bytes (%d when full)", after, full)
	}
	if v, ok := tab.Get("survivor"); !ok || v != 1000 {
		t.Fatalf("survivor: %d %v", v, ok)
	}
}

// A key added and deleted again, as a concurrency zone's key is by each
// request, allocates nothing once its shard has held a key: an emptied
// shard keeps its slots (and arena) until a sweep or Shrink.
func TestAKeyComingAndGoingAllocatesNothing(t *testing.T) {
	tab := New(1 << 20)
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("request-%08d", i)
		if i%2 == 1 {
			keys[i] += strings.Repeat("x", 40) // kept in the arena
		}
		set(tab, keys[i], 1, 0)
		tab.Delete(keys[i])
	}
	i := 0
	if n := testing.AllocsPerRun(10_000, func() {
		set(tab, keys[i], 1, 0)
		tab.Delete(keys[i])
		i = (i + 1) % len(keys)
	}); n != 0 {
		t.Fatalf("%v allocations per key added and deleted, want 0", n)
	}
	if tab.Len() != 0 {
		t.Fatalf("%d keys left", tab.Len())
	}
}

// Shrink gives an emptied table's memory back and rebuilds a sparse shard
// smaller, deleting nothing.
func TestShrinkGivesMemoryBackAndKeepsEveryKey(t *testing.T) {
	tab := New(1 << 20)
	for i := range 300_000 {
		set(tab, fmt.Sprintf("key-%012d", i), 1, 0)
	}
	full := tab.Bytes()
	for i := range 300_000 {
		if i%1000 != 0 {
			tab.Delete(fmt.Sprintf("key-%012d", i))
		}
	}
	if kept := tab.Bytes(); kept < full/2 {
		t.Fatalf("deletes alone gave memory back (%d of %d bytes): the request path should not", kept, full)
	}
	tab.Shrink()
	if after := tab.Bytes(); after > full/20 {
		t.Fatalf("after Shrink the table holds %d bytes for 300 keys (%d when full)", after, full)
	}
	for i := 0; i < 300_000; i += 1000 {
		if v, ok := tab.Get(fmt.Sprintf("key-%012d", i)); !ok || v != 1 {
			t.Fatalf("key %d: %d %v after Shrink", i, v, ok)
		}
	}
	for i := 0; i < 300_000; i += 1000 {
		tab.Delete(fmt.Sprintf("key-%012d", i))
	}
	tab.Shrink()
	if after := tab.Bytes(); after != 0 {
		t.Fatalf("an empty table holds %d bytes after Shrink", after)
	}
}

// Many goroutines count on shared keys while others churn short-lived keys
// through the same shards and sweeps rebuild them: every count is exact
// (-race).
func TestConcurrentUpdatesAreExactThroughChurnAndSweeps(t *testing.T) {
	tab := New(4096) // 16 shards of 256: the churn fills them and evicts
	const goroutines, perGoroutine, shared = 32, 2000, 8
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(1)
	go func() {
		defer churn.Done()
		for round := int64(1); ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			for i := range 4096 {
				set(tab, fmt.Sprint("churn-", i), round*10+5, round*10)
			}
			tab.Sweep(round*10 + 6)
		}
	}()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perGoroutine {
				key := fmt.Sprint("shared-", (g+i)%shared)
				// Counts stay in force (> any now the churn uses) and are
				// never evicted.
				ok := tab.Update(key, 0, func(v int64, found bool) (int64, Op) {
					if !found {
						v = 1 << 60
					}
					return v + 1, StoreIfRoom
				})
				for !ok { // a full shard: the churn's sweep makes room
					ok = tab.Update(key, 0, func(v int64, found bool) (int64, Op) {
						if !found {
							v = 1 << 60
						}
						return v + 1, StoreIfRoom
					})
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	churn.Wait()
	var total int64
	for k := range shared {
		v, ok := tab.Get(fmt.Sprint("shared-", k))
		if !ok {
			t.Fatalf("shared-%d lost", k)
		}
		total += v - 1<<60
	}
	if total != goroutines*perGoroutine {
		t.Fatalf("counted %d updates, want %d", total, goroutines*perGoroutine)
	}
}

// BenchmarkUpdateExistingKey is the per-request operation on one of 100k
// keys of 16 bytes, taken in the order they were added and at random (as
// requests come: one slot, and for keys kept out of line one key, that
// miss the CPU's caches). Target: 0 allocs/op.
func BenchmarkUpdateExistingKey(b *testing.B) {
	for _, order := range []string{"sequential", "random"} {
		b.Run("order="+order, func(b *testing.B) {
			tab := New(1_000_000)
			keys := make([]string, 100_000)
			for i := range keys {
				keys[i] = fmt.Sprintf("key-%012d", i)
				set(tab, keys[i], 1, 0)
			}
			if order == "random" {
				rand.New(rand.NewPCG(3, 4)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
				for i, k := range keys {
					// Laid out in the new order, as a request's key is
					// in cache: the misses measured are the table's.
					keys[i] = strings.Clone(k)
				}
			}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				tab.Update(keys[i], 0, func(v int64, _ bool) (int64, Op) { return v + 1, Store })
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	}
}

// CopyShard, over every shard, copies each entry in force (inline and arena
// keys alike) exactly once, and none that has expired.
func TestCopyShardCopiesEveryEntryInForce(t *testing.T) {
	tbl := New(4096)
	want := map[string]int64{}
	for i := range 3000 {
		key := strconv.Itoa(i)
		if i%3 == 0 {
			key = strings.Repeat("long-", 8) + key // in the arena
		}
		v := int64(i % 10)
		tbl.Update(key, 0, func(int64, bool) (int64, Op) { return v, Store })
		if v > 4 {
			want[key] = v
		}
	}
	var c Copy
	got := map[string]int64{}
	for i := range tbl.Shards() {
		c.Reset()
		tbl.CopyShard(i, 4, &c)
		for j := range c.Len() {
			if _, dup := got[string(c.Key(j))]; dup {
				t.Fatalf("%q copied twice", c.Key(j))
			}
			got[string(c.Key(j))] = c.Values[j]
		}
	}
	if len(got) != len(want) {
		t.Fatalf("copied %d entries, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%q copied as %d, want %d", k, got[k], v)
		}
	}
}
