package zones

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

func TestDeniesSaysWhatTheNextRequestWouldGetAndConsumesNothing(t *testing.T) {
	c := Config{Name: "z", Events: 2, Window: time.Second}
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	for i := range 2 {
		if z.Denies("k", now) {
			t.Fatalf("denies before request %d of a burst of 2", i+1)
		}
		z.Decide(context.Background(), "k", now)
	}
	for range 100 {
		if !z.Denies("k", now) {
			t.Fatal("does not deny a key whose burst is spent")
		}
	}
	if z.Denies("other", now) {
		t.Fatal("denies a key it never saw")
	}
	// Asking consumed nothing: the key is allowed again one interval on.
	later := now + int64(time.Second/2)
	if z.Denies("k", later) {
		t.Fatal("still denies one emission interval later")
	}
	if d := z.Decide(context.Background(), "k", later); !d.Allowed {
		t.Fatal("the request Denies said would pass was denied")
	}
}

func TestDeniesReadsTheDenyCacheWithoutCallingTheStore(t *testing.T) {
	c := Config{Name: "z", Events: 3, Window: time.Hour}
	st := &faultStore{}
	z := mustNew(c, newTestState(t, c), st)
	now := monotime.Now()
	if z.Denies("k", now) {
		t.Fatal("denies a key the store never denied")
	}
	z.Decide(context.Background(), "k", now) // the store denies it for 30s
	calls := st.calls.Load()
	if !z.Denies("k", now+int64(29*time.Second)) {
		t.Fatal("does not deny a key within its cached denial")
	}
	if z.Denies("k", now+int64(31*time.Second)) {
		t.Fatal("denies a key after its cached denial ended")
	}
	if n := st.calls.Load(); n != calls {
		t.Fatalf("Denies called the store %d times", n-calls)
	}
}

func TestDeniesNeverForAConcurrencyZone(t *testing.T) {
	c := Config{Name: "z", Concurrency: 1}
	z := mustNew(c, newTestState(t, c), nil)
	if _, s := z.Acquire(context.Background(), "k"); !s.Held() {
		t.Fatal("first slot refused")
	}
	if z.Denies("k", monotime.Now()) {
		t.Fatal("a concurrency zone denies through Denies")
	}
}

func TestDeniesUnderConcurrentDecisions(t *testing.T) {
	c := Config{Name: "z", Events: 1000, Window: time.Hour}
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				if g%2 == 0 {
					z.Decide(context.Background(), "k", now)
				} else {
					z.Denies("k", now)
				}
			}
		}()
	}
	wg.Wait()
	if !z.Denies("k", now) {
		t.Fatal("2000 decisions of a burst of 1000: not denied")
	}
}
