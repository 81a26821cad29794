package zones

import (
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// A table that once held many keys gives their memory back when a sweep
// empties it: a shard a sweep leaves mostly empty is rebuilt at its new size.
func TestSweepGivesMemoryBackAfterAPeak(t *testing.T) {
	tbl := NewTable(1 << 20)
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := heap()
	for i := range 300_000 {
		tbl.Set("key-"+strconv.Itoa(i), 10, 0) // in force until 10
	}
	tbl.Set("survivor", 1000, 0)
	full := heap()
	if left := tbl.Sweep(100); left != 1 {
		t.Fatalf("sweep left %d keys, want the survivor only", left)
	}
	empty := heap()
	if full < base+10<<20 {
		t.Fatalf("300k keys took %d bytes, want > 10 MiB: the measurement is wrong", full-base)
	}
	if kept := empty - min(empty, base); kept > (full-base)/10 {
		t.Errorf("after a sweep emptied the table, %d of the %d bytes its keys took are still held", kept, full-base)
	}
	if v, ok := tbl.Get("survivor", 100); !ok || v != 1000 {
		t.Errorf("survivor after the shrink: %d %v, want 1000", v, ok)
	}
}

// Sweeps that rebuild shards run while requests use the table: every key a
// request keeps in force survives the rebuilds with its exact state (-race).
func TestTableShrinksWhileInUse(t *testing.T) {
	tbl := NewTable(4096) // 16 shards of 256: the churn fills them
	l := algorithms.NewLimit(1_000_000, int64(time.Hour), 0)
	stop := make(chan struct{})
	churned := make(chan int64)
	go func() { // short-lived keys push shards past their peak, then expire
		round := int64(1)
		defer func() { churned <- round }()
		for ; ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			for i := range 4096 {
				tbl.Set("churn-"+strconv.Itoa(i), round*10+5, round*10)
			}
			tbl.Sweep(round*10 + 6)
		}
	}()
	const perKey = 2000
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "steady-" + strconv.Itoa(g)
			for range perKey {
				if r := tbl.Decide(key, 1, l, 1, 0); !r.Allowed {
					t.Errorf("%s denied within its burst", key)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rounds := <-churned
	for g := range 8 {
		if r := tbl.Peek("steady-"+strconv.Itoa(g), 1, l); r.Remaining != l.Burst-perKey {
			t.Errorf("steady-%d: remaining %d, want %d: state lost in a rebuild", g, r.Remaining, l.Burst-perKey)
		}
	}
	if left := tbl.Sweep(rounds*10 + 10); left != 8 { // the churn expires, the steady keys do not
		t.Errorf("after the churn expired, %d keys left, want the 8 steady ones", left)
	}
	if b := tbl.kt.Bytes(); b > 16*1024 { // 8 keys: a few hundred bytes
		t.Errorf("after a sweep left 8 keys the table still holds %d bytes: shards sized for the churn", b)
	}
}
