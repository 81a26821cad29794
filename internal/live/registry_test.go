package live

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-tally/ratelimit/zones"
)

// Modules of configs loading and unloading at once register and unregister
// their zones while metrics are scraped: every registration is found until
// it goes, the last one of a name takes its series with it, and nothing
// races.
func TestRegistryUnderConcurrentReloadsAndScrapes(t *testing.T) {
	requests := CounterVec("test_registry_total", "test", "decision")
	reg := prometheus.NewRegistry()
	if err := RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("z%d", g%4) // four goroutines share each name
			cfg := zones.Config{Name: name, Events: 10, Window: time.Second}
			for i := range 50 {
				state, id, _, err := LoadState(cfg, nil, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				z, err := zones.New(cfg, state, nil)
				if err != nil {
					t.Error(err)
					return
				}
				Register(z, i%2 == 0, ZoneView{Handler: i})
				d := NewDecisions(requests, name, false)
				d.Count(true, false)
				if Lookup(name, false) == nil || View(z).Handler != i || IsConnection(z) != (i%2 == 0) {
					t.Errorf("%s: registration %d not found as registered", name, i)
				}
				if _, err := reg.Gather(); err != nil {
					t.Error(err)
				}
				Unregister(z)
				ReleaseState(id)
			}
		}()
	}
	wg.Wait()
	if n := len(Zones()); n != 0 {
		t.Fatalf("%d zones left registered", n)
	}
	if n := seriesOf(requests); n != 0 {
		t.Fatalf("%d series left after every zone went", n)
	}
}

// seriesOf counts the series v holds.
func seriesOf(v *prometheus.CounterVec) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { v.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
