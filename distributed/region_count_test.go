package distributed

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
)

// zoneLimit is countingRegion's zone's limit.
var zoneLimit = algorithms.Limit{EmissionInterval: 1, Burst: 1}

func countingRegion() *Region {
	r := &Region{zones: map[string]*regionZone{}, logger: zap.NewNop()}
	r.AddZone("api", zoneLimit)
	return r
}

// Many goroutines count one shared key and keys of their own while the
// counts are taken again and again, as polls do: every decision is in
// exactly one take.
func TestRegionCountIsExactUnderConcurrency(t *testing.T) {
	const workers, rounds, own = 16, 3000, 50
	r := countingRegion()
	z := r.zone("api")
	totals := map[string][2]int64{}
	add := func(m map[string][3]int64) {
		for k, c := range m {
			t := totals[k]
			t[0] += c[0]
			t[1] += c[1]
			totals[k] = t
		}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	taken := make(chan struct{})
	go func() {
		defer close(taken)
		for {
			select {
			case <-stop:
				return
			default:
				add(z.take())
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				r.count("api", "shared", true, 1, zoneLimit)
				r.count("api", "shared", false, 3, zoneLimit)
				r.count("api", "w"+strconv.Itoa(w)+"-"+strconv.Itoa(i%own), i%2 == 0, 2, zoneLimit)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-taken
	add(z.take())
	if got, want := totals["shared"], [2]int64{workers * rounds, 3 * workers * rounds}; got != want {
		t.Errorf("shared key counted %v, want %v", got, want)
	}
	for w := range workers {
		for j := range own {
			k := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(j)
			want := [2]int64{2 * rounds / own, 0} // i ≡ j (mod own): even j, even i
			if j%2 == 1 {
				want = [2]int64{0, 2 * rounds / own}
			}
			if got := totals[k]; got != want {
				t.Fatalf("key %s counted %v, want %v", k, got, want)
			}
		}
	}
	if len(totals) != workers*own+1 {
		t.Errorf("%d keys counted, want %d", len(totals), workers*own+1)
	}
}

// A zone counts at most maxCounted keys between two takes, however many
// goroutines add new ones; the keys it counts are counted in full.
func TestRegionCountKeepsItsBound(t *testing.T) {
	const workers = 8
	r := countingRegion()
	z := r.zone("api")
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range maxCounted / 2 {
				r.count("api", "k"+strconv.Itoa(w)+"-"+strconv.Itoa(i), true, 1, zoneLimit)
				r.count("api", "common", true, 1, zoneLimit)
			}
		}()
	}
	wg.Wait()
	m := z.take()
	if len(m) != maxCounted {
		t.Errorf("%d keys counted, want the bound %d", len(m), maxCounted)
	}
	for k, c := range m {
		if k != "common" && c != [3]int64{1, 0, 0} {
			t.Fatalf("key %s counted %v, want [1 0 0]", k, c)
		}
	}
	if n := len(z.take()); n != 0 {
		t.Errorf("%d keys counted after a take with no decisions, want 0", n)
	}
	r.count("api", "again", true, 1, zoneLimit)
	if n := len(z.take()); n != 1 {
		t.Errorf("%d keys counted after the take, want 1 (the bound is per take)", n)
	}
}

// BenchmarkRegionCount is Region.count under parallel goroutines: every
// goroutine the same hot key (same), or keys of its own (distinct). Run
// with -cpu 1,2,… to see contention.
func BenchmarkRegionCount(b *testing.B) {
	b.Run("same", func(b *testing.B) {
		r := countingRegion()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.count("api", "hot", true, 1, zoneLimit)
			}
		})
	})
	b.Run("distinct", func(b *testing.B) {
		r := countingRegion()
		var mu sync.Mutex
		next := 0
		b.RunParallel(func(pb *testing.PB) {
			mu.Lock()
			g := next
			next++
			mu.Unlock()
			keys := make([]string, 256)
			for i := range keys {
				keys[i] = "g" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
			}
			i := 0
			for pb.Next() {
				r.count("api", keys[i&255], true, 1, zoneLimit)
				i++
			}
		})
	})
}

// A key's span, counted by many goroutines at once, is the longest one
// since the last take; a key decided at the zone's own limit has none.
func TestRegionCountKeepsTheLongestSpan(t *testing.T) {
	const workers, rounds = 16, 500
	r := countingRegion()
	z := r.zone("api")
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				r.count("api", "planned", true, 1, algorithms.Limit{EmissionInterval: 1, Burst: int64(2 + w*rounds + i)})
				r.count("api", "plain", true, 1, zoneLimit)
			}
		})
	}
	wg.Wait()
	m := z.take()
	if got, want := m["planned"], [3]int64{workers * rounds, 0, 1 + workers*rounds}; got != want {
		t.Errorf("planned: taken %v, want %v (every count, the longest span)", got, want)
	}
	if got, want := m["plain"], [3]int64{workers * rounds, 0, 0}; got != want {
		t.Errorf("plain: taken %v, want %v (no span of its own)", got, want)
	}
	r.count("api", "planned", true, 1, algorithms.Limit{EmissionInterval: 5, Burst: 1})
	if got := z.take()["planned"][2]; got != 5 {
		t.Errorf("after a take, the span is the next count's (5), got %d", got)
	}
}

// A denial from the deny cache (Offers' Denied: the store was not asked)
// is demand the region cannot serve at its share: it counts as a denial,
// never as an admission, so that the coordinator asks for the whole key.
func TestRegionDenyCacheDenialCountsAsDemand(t *testing.T) {
	r := countingRegion()
	r.weight = ShareScale / 2
	s := &Shared{region: r}
	s.Offers().Denied("api", "k", zoneLimit)
	counts := r.zone("api").take()
	if got, want := counts["k"], [3]int64{0, 1, 0}; got != want {
		t.Fatalf("a deny-cache denial counted (admitted, denied, span) %v, want %v", got, want)
	}
	r.coord.held = map[string]*coordZone{}
	r.coord.full = true
	raw := []any{int64(1), "k", counts["k"][0], counts["k"][1], counts["k"][2]}
	reps := r.reports(r.set.Load().zones, 1, raw, int64(time.Second), false, false)
	if len(reps) != 1 || len(reps[0].keys) != 1 || reps[0].keys["k"] == nil || reps[0].keys["k"].wants != ShareScale {
		t.Errorf("reports after a deny-cache denial: %+v, want key k wanting the whole (%d)", reps, ShareScale)
	}
}

// A key's demand is reported with a fifth of headroom over what it used:
// at 5 requests in a second on a 600-per-minute zone (half the key's
// whole rate, its region's share at weight 1:1) it wants 0.6 of the key.
func TestRegionDemandIsReportedWithHeadroom(t *testing.T) {
	r := &Region{zones: map[string]*regionZone{}, prefix: "tally:", timeout: 100 * time.Millisecond,
		opts: RegionOptions{SyncInterval: time.Second, Refresh: 10 * time.Second}, weight: ShareScale / 2, floor: ShareScale / 20}
	r.AddZone("api", algorithms.NewLimit(600, int64(time.Minute), 0))
	r.coord.held = map[string]*coordZone{}
	r.coord.full = true
	raw := []any{int64(1), "k", int64(5), int64(0), int64(0)} // 5 admitted, none denied
	reps := r.reports(r.set.Load().zones, 1, raw, int64(time.Second), false, false)
	if len(reps) != 1 || len(reps[0].keys) != 1 || reps[0].keys["k"] == nil {
		t.Fatalf("reports: %+v, want key k", reps)
	}
	if got, want := reps[0].keys["k"].wants, int64(ShareScale*6/10); got < want-1 || got > want+1 {
		t.Errorf("a key using half its whole rate wants %d, want %d (its use and a fifth of headroom)", got, want)
	}
}
