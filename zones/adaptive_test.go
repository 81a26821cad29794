package zones

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

func adaptiveConfig(minL, maxL int64, classes int) Config {
	return Config{Name: "backend", Adaptive: algorithms.AdaptiveLimit{Target: int64(100 * time.Millisecond), Min: minL, Max: maxL}, Classes: classes}
}

func adaptiveTicket(z *Zone, key string, class int) Ticket[int] {
	return Ticket[int]{Zone: z, Key: key, Class: class}
}

func TestAdaptiveConfigErrorsSayTheFix(t *testing.T) {
	ok := adaptiveConfig(4, 2000, 2)
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"min 0", func(c *Config) { c.Adaptive.Min = 0 }, "adaptive min must be"},
		{"max below min", func(c *Config) { c.Adaptive.Max = 3 }, "adaptive max must be a whole number from min (4)"},
		{"target too long", func(c *Config) { c.Adaptive.Target = int64(2 * time.Minute) }, "at most 1m0s"},
		{"with concurrency", func(c *Config) { c.Concurrency = 5 }, "adaptive replaces concurrency"},
		{"with events", func(c *Config) { c.Events, c.Window = 5, time.Second }, "adaptive replaces events"},
		{"too many classes", func(c *Config) { c.Classes = 17 }, "at most 16 classes"},
		{"with ban", func(c *Config) { c.Ban = time.Minute }, "ban is for rate zones"},
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// A fresh key's limit is min: that many are admitted, the next is shed
// with a concurrency denial's Retry-After, and a finished request gives its
// place back.
func TestAdaptiveShedsPastTheLimitAndReleases(t *testing.T) {
	z := concurrencyZone(t, adaptiveConfig(4, 4, 0), nil)
	var held []Ticket[int]
	for i := range 5 {
		tk := adaptiveTicket(z, "host", 0)
		tk.Admit(context.Background(), monotime.Now())
		if tk.Allowed != (i < 4) || tk.Holds() != tk.Allowed {
			t.Fatalf("request %d: allowed %v holds %v, want allowed %v", i, tk.Allowed, tk.Holds(), i < 4)
		}
		if tk.Quota() != 4 || tk.QuotaUnit() != "concurrent-requests" {
			t.Fatalf("q %d %q, want 4 concurrent-requests", tk.Quota(), tk.QuotaUnit())
		}
		if !tk.Allowed && tk.RetryAfter != ConcurrencyRetryAfter {
			t.Fatalf("shed Retry-After %v, want %v", tk.RetryAfter, ConcurrencyRetryAfter)
		}
		if tk.Allowed {
			held = append(held, tk)
		}
	}
	if got := z.InFlight(); got != 4 {
		t.Fatalf("in flight %d, want 4", got)
	}
	held[0].Finish(monotime.Now(), 10*time.Millisecond, false)
	tk := adaptiveTicket(z, "host", 0)
	if tk.Admit(context.Background(), monotime.Now()); !tk.Allowed {
		t.Fatal("a finished request's place was not given back")
	}
	other := adaptiveTicket(z, "other-host", 0)
	if other.Admit(context.Background(), monotime.Now()); !other.Allowed {
		t.Fatal("another key has a limit of its own")
	}
}

// Anonymous (class 1) fills the limit; signed_in (class 0) still gets a
// place, one past the limit, taken from the anonymous; the next anonymous is
// shed; once signed_in's demand is known, anonymous leaves its places free.
func TestAdaptiveHigherClassTakesALowerClassesPlace(t *testing.T) {
	z := concurrencyZone(t, adaptiveConfig(10, 10, 2), nil)
	now := monotime.Now()
	admit := func(class int) *Ticket[int] {
		tk := adaptiveTicket(z, "host", class)
		tk.Admit(context.Background(), now)
		return &tk
	}
	var anon []*Ticket[int]
	for range 10 {
		if tk := admit(1); tk.Allowed {
			anon = append(anon, tk)
		}
	}
	if len(anon) != 10 {
		t.Fatalf("anonymous admitted %d of an idle limit of 10, want 10", len(anon))
	}
	if admit(1).Allowed {
		t.Fatal("anonymous admitted past the limit")
	}
	signed := admit(0)
	if !signed.Allowed {
		t.Fatal("signed_in shed while anonymous held every place")
	}
	if admit(0).Allowed {
		t.Fatal("signed_in took more than an eighth (at least one) past the limit")
	}
	// Signed_in keeps one in flight for a while: its demand is then
	// reserved, and an anonymous place that frees is not refilled past it.
	now += 5 * algorithms.AdaptiveDemandTau
	for _, tk := range anon[:3] {
		tk.Finish(now, 10*time.Millisecond, false)
	}
	signed.Finish(now, 10*time.Millisecond, false)
	// 7 anonymous in flight; signed_in's demand ≈ 1, unused now.
	got := 0
	for range 5 {
		if admit(1).Allowed {
			got++
		}
	}
	if got != 2 {
		t.Fatalf("anonymous took %d of 3 free places, want 2 (one kept for signed_in)", got)
	}
	if !admit(0).Allowed {
		t.Fatal("signed_in shed with its reserved place free")
	}
}

func TestAdaptiveLimitFollowsLatencyAndSurvivesAReload(t *testing.T) {
	c := adaptiveConfig(4, 100, 0)
	st := NewState(c, time.Hour)
	t.Cleanup(func() { _ = st.Destruct() })
	z := mustNew(c, st, nil)
	now := monotime.Now()
	// Saturated and fast: slow start doubles the limit each window.
	for range 200 {
		tk := adaptiveTicket(z, "host", 0)
		tk.Admit(context.Background(), now)
		for tk.Allowed {
			tk2 := adaptiveTicket(z, "host", 0)
			tk2.Admit(context.Background(), now)
			if !tk2.Allowed {
				break
			}
			defer tk2.Finish(now, 10*time.Millisecond, false)
		}
		now += int64(10 * time.Millisecond)
		tk.Finish(now, 10*time.Millisecond, false)
	}
	grown, _, _ := z.KeyLimit("host")
	if grown <= 4 {
		t.Fatalf("limit %d after saturated fast windows, want above min 4", grown)
	}
	// A reload (the same state, a new zone) keeps it.
	z2 := mustNew(c, st, nil)
	if l, _, _ := z2.KeyLimit("host"); l != grown {
		t.Fatalf("limit after reload %d, want %d", l, grown)
	}
	// Slow responses bring it down.
	for range 100 {
		tk := adaptiveTicket(z2, "host", 0)
		tk.Admit(context.Background(), now)
		now += int64(20 * time.Millisecond)
		if tk.Allowed {
			tk.Finish(now, 400*time.Millisecond, false)
		}
	}
	if l, _, _ := z2.KeyLimit("host"); l >= grown {
		t.Fatalf("limit %d after slow windows, want below %d", l, grown)
	}
	if limit, p90 := z2.AdaptiveLimit(); p90 != 400*time.Millisecond || limit < 4 {
		t.Fatalf("zone limit %d p90 %v, want p90 400ms", limit, p90)
	}
}

// Many goroutines of three classes hammer one key and others: the requests
// in flight never pass the limit plus a higher class's borrowed place, and
// every place comes back.
func TestAdaptiveInFlightBoundedUnderRace(t *testing.T) {
	for _, delay := range []time.Duration{0, 3 * time.Millisecond} {
		t.Run(fmt.Sprintf("delay %v", delay), func(t *testing.T) { adaptiveUnderRace(t, delay) })
	}
}

func adaptiveUnderRace(t *testing.T, delay time.Duration) {
	c := adaptiveConfig(8, 8, 3)
	if delay > 0 {
		c.Delay, c.Queue = delay, 16
	}
	z := concurrencyZone(t, c, nil)
	var inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				key := "host"
				if i%3 == 2 {
					key = fmt.Sprintf("own-%d", g%4)
				}
				tk := adaptiveTicket(z, key, g%4) // class 3: unknown, the lowest
				if g%8 == 7 {
					done := make(chan struct{})
					close(done) // a client already gone
					tk.Done = done
				}
				tk.Admit(context.Background(), monotime.Now())
				if tk.Allowed != tk.Holds() {
					t.Errorf("allowed %v holds %v", tk.Allowed, tk.Holds())
				}
				if !tk.Allowed {
					continue
				}
				if key == "host" {
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					inFlight.Add(-1)
				}
				if i%5 == 0 {
					tk.Cancel(context.Background(), monotime.Now())
				} else {
					tk.Finish(monotime.Now(), time.Duration(i%7)*time.Millisecond, false)
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > 8+1 {
		t.Fatalf("peak in flight %d, want at most the limit 8 plus one borrowed", p)
	}
	if n, w := z.InFlight(), z.Waiting(); n != 0 || w != 0 {
		t.Fatalf("in flight %d, waiting %d after every request ended, want 0", n, w)
	}
	if _, n, ok := z.KeyLimit("host"); !ok || n != 0 {
		t.Fatalf("key in flight %d (known %v), want 0", n, ok)
	}
}

func TestAdaptiveZoneIgnoresAStore(t *testing.T) {
	c := adaptiveConfig(4, 4, 0)
	st := NewState(c, time.Hour)
	t.Cleanup(func() { _ = st.Destruct() })
	z, err := New(c, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if z.Mode() != "local" || z.Store() != nil {
		t.Fatalf("adaptive zone mode %q store %v, want local, none", z.Mode(), z.Store())
	}
}

func TestAdaptiveIdleKeysAreSwept(t *testing.T) {
	z := concurrencyZone(t, adaptiveConfig(4, 4, 0), nil)
	now := monotime.Now()
	tk := adaptiveTicket(z, "busy", 0)
	tk.Admit(context.Background(), now)
	idle := adaptiveTicket(z, "idle", 0)
	idle.Admit(context.Background(), now)
	idle.Finish(now, time.Millisecond, false)
	z.state.adaptive.sweep(now + int64(AdaptiveKeyIdle) + 1)
	if _, _, ok := z.KeyLimit("idle"); ok {
		t.Fatal("an idle key outlived AdaptiveKeyIdle")
	}
	if _, n, ok := z.KeyLimit("busy"); !ok || n != 1 {
		t.Fatal("a key with a request in flight was swept")
	}
	tk.Finish(now, time.Millisecond, false)
}

func adaptiveDelayZone(t *testing.T, limit int64, delay time.Duration, queue int64) *Zone {
	c := adaptiveConfig(limit, limit, 2)
	c.Delay, c.Queue = delay, queue
	return concurrencyZone(t, c, nil)
}

// A request that finds no place waits for one; a release hands it over,
// the higher class first; a client that leaves gives its place in the
// queue back; a full queue sheds at once.
func TestAdaptiveDelayWaitsForAPlaceHigherClassFirst(t *testing.T) {
	z := adaptiveDelayZone(t, 1, 30*time.Second, 2)
	holder := adaptiveTicket(z, "host", 0)
	holder.Admit(context.Background(), monotime.Now())
	if !holder.Allowed {
		t.Fatal("first request shed")
	}
	results := make(chan string, 3)
	served := make(chan *Ticket[int], 3)
	goneCh := make(chan struct{})
	start := func(name string, class int, done <-chan struct{}) {
		go func() {
			tk := adaptiveTicket(z, "host", class)
			tk.Done = done
			tk.Admit(context.Background(), monotime.Now())
			switch {
			case tk.Gone:
				results <- name + " gone"
			case tk.Allowed:
				results <- name + " served"
				served <- &tk
			default:
				results <- name + " shed"
			}
		}()
	}
	start("anonymous", 1, goneCh)
	waitUntil(t, func() bool { return z.Waiting() == 1 })
	start("signed_in", 0, nil)
	waitUntil(t, func() bool { return z.Waiting() == 2 })
	// The queue is full: a third is shed at once.
	third := adaptiveTicket(z, "host", 0)
	third.Admit(context.Background(), monotime.Now())
	if third.Allowed || !third.QueueFull {
		t.Fatalf("third waiter: allowed %v queue full %v, want shed for a full queue", third.Allowed, third.QueueFull)
	}
	holder.Finish(monotime.Now(), time.Millisecond, false)
	if got := <-results; got != "signed_in served" {
		t.Fatalf("first handed a place: %q, want signed_in served", got)
	}
	close(goneCh)
	if got := <-results; got != "anonymous gone" {
		t.Fatalf("%q, want anonymous gone", got)
	}
	(<-served).Finish(monotime.Now(), time.Millisecond, false)
	waitUntil(t, func() bool { return z.Waiting() == 0 && z.InFlight() == 0 })
	if _, n, _ := z.KeyLimit("host"); n != 0 {
		t.Fatalf("key in flight %d after every request left, want 0", n)
	}
}

// A waiter whose wait ends is shed and holds nothing.
func TestAdaptiveDelayShedsAfterTheWait(t *testing.T) {
	z := adaptiveDelayZone(t, 1, 20*time.Millisecond, 10)
	holder := adaptiveTicket(z, "host", 0)
	holder.Admit(context.Background(), monotime.Now())
	tk := adaptiveTicket(z, "host", 0)
	tk.Admit(context.Background(), monotime.Now())
	if tk.Allowed || tk.Gone || tk.Holds() {
		t.Fatalf("waiter past its delay: allowed %v gone %v", tk.Allowed, tk.Gone)
	}
	holder.Finish(monotime.Now(), time.Millisecond, false)
	if z.InFlight() != 0 || z.Waiting() != 0 {
		t.Fatalf("in flight %d waiting %d, want 0 0", z.InFlight(), z.Waiting())
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A waiter handed its place just as its client leaves gives the place
// back: the client's leaving and the release that hands the place over
// race, 50 times, and every time the key ends with nothing in flight.
func TestAdaptiveWaiterGrantedAsItsClientLeavesGivesThePlaceBack(t *testing.T) {
	z := adaptiveDelayZone(t, 1, 30*time.Second, 10)
	for i := range 50 {
		holder := adaptiveTicket(z, "host", 0)
		holder.Admit(context.Background(), monotime.Now())
		if !holder.Allowed {
			t.Fatalf("round %d: the holder was shed", i)
		}
		done := make(chan struct{})
		waiter := make(chan Ticket[int], 1)
		go func() {
			tk := adaptiveTicket(z, "host", 1)
			tk.Done = done
			tk.Admit(context.Background(), monotime.Now())
			waiter <- tk
		}()
		waitUntil(t, func() bool { return z.Waiting() == 1 })
		close(done) // the client leaves, and at once the place frees
		holder.Finish(monotime.Now(), time.Millisecond, false)
		if tk := <-waiter; tk.Allowed {
			tk.Finish(monotime.Now(), -1, false) // admitted before it saw the client leave: the caller ends it
		}
		if _, n, _ := z.KeyLimit("host"); n != 0 || z.InFlight() != 0 || z.Waiting() != 0 {
			t.Fatalf("round %d: key in flight %d, zone in flight %d, waiting %d after every request left, want 0", i, n, z.InFlight(), z.Waiting())
		}
	}
}
