package tests

// Leases are renewed when they run low or reach their lifetime, not every
// sync interval: a key far below its limit costs Redis about one report per
// lifetime, and a key whose lease runs low is renewed before it runs out.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// reportWatcher polls a key's hash for this instance's last applied report
// ("m:<id>" = "<seq> <lease>") and records when its sequence number changes:
// one change per report Redis applied for the key, whatever else the store
// sends.
type reportWatcher struct {
	times []time.Time
	seqs  []string
}

func watchReports(t *testing.T, rdb *redis.Client, a *distributed.Async, zone, key string, run time.Duration, during func(stop <-chan struct{})) reportWatcher {
	t.Helper()
	ctx := context.Background()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		during(stop)
	}()
	var w reportWatcher
	end := time.Now().Add(run)
	for time.Now().Before(end) {
		h, err := rdb.HGetAll(ctx, a.RedisKey(zone, key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range h {
			if !strings.HasPrefix(f, "m:") {
				continue
			}
			seq, _, _ := strings.Cut(v, " ")
			if n := len(w.seqs); n == 0 || w.seqs[n-1] != seq {
				w.seqs = append(w.seqs, seq)
				w.times = append(w.times, time.Now())
			}
		}
		time.Sleep(5 * time.Millisecond) // the polling period of an observer, not a synchronisation
	}
	close(stop)
	<-done
	return w
}

// longestGap is the longest time between two reports, and from the last
// one to end.
func (w reportWatcher) longestGap(end time.Time) time.Duration {
	var gap time.Duration
	for i := 1; i < len(w.times); i++ {
		gap = max(gap, w.times[i].Sub(w.times[i-1]))
	}
	if n := len(w.times); n > 0 {
		gap = max(gap, end.Sub(w.times[n-1]))
	}
	return gap
}

// steadily calls f every period until stop.
func steadily(period time.Duration, stop <-chan struct{}, f func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			f()
		}
	}
}

func TestAsyncKeyFarBelowItsLimitIsSyncedOncePerLeaseLifetime(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	ctx := context.Background()
	const interval = 100 * time.Millisecond
	a := openAsyncStores(t, 1, srv.Addr, interval, time.Second)[0]
	life := a.LeaseLifetime()
	if life != asyncLeaseLifetime*interval {
		t.Fatalf("lease lifetime %v, want %d sync intervals (%v)", life, asyncLeaseLifetime, asyncLeaseLifetime*interval)
	}
	// 20 requests a second against 1,000 an hour: the lease covers years of
	// this, so only its lifetime brings the key back to Redis.
	limit := algorithms.NewLimit(1000, int64(time.Hour), 0)
	const run = 7 * time.Second
	var denied, failed int
	start := time.Now()
	w := watchReports(t, srv.Client(), a, "z", "steady", run, func(stop <-chan struct{}) {
		steadily(50*time.Millisecond, stop, func() {
			r, err := stepDecide(a, ctx, "z", "steady", limit, 1)
			switch {
			case err != nil:
				failed++
			case !r.Allowed:
				denied++
			}
		})
	})
	end := time.Now()
	t.Logf("%d reports in %v (%d sync intervals), longest gap %v", len(w.seqs), end.Sub(start).Round(time.Millisecond), end.Sub(start)/interval, w.longestGap(end).Round(time.Millisecond))
	if denied+failed > 0 {
		t.Errorf("%d denied, %d failed: want every request allowed", denied, failed)
	}
	// The first report, then one per lifetime (renewed up to a quarter
	// before it ends): 3 or 4 in 7s, where syncing every interval made 70.
	if n := len(w.seqs); n < 3 || n > 5 {
		t.Errorf("%d reports in %v: want about one per lease lifetime (%v), no more, no fewer", n, run, life)
	}
	// Never longer than a lifetime without one, sync jitter aside.
	if gap := w.longestGap(end); gap > life+2*interval {
		t.Errorf("%v without a report: the lease outlived its lifetime (%v)", gap.Round(time.Millisecond), life)
	}
}

func TestAsyncLeaseRunningLowIsRenewedBeforeItRunsOut(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	ctx := context.Background()
	// A lifetime of 3s: what renews the lease in this run is running low.
	const interval = 300 * time.Millisecond
	a := openAsyncStores(t, 1, srv.Addr, interval, time.Second)[0]
	// 80 a second against 100 a second, burst 100: the first lease lasts
	// about 1.25s, and the fleet (this instance) always has tokens.
	limit := algorithms.NewLimit(100, int64(time.Second), 0)
	var allowed, denied, failed int
	w := watchReports(t, srv.Client(), a, "z", "busy", 2500*time.Millisecond, func(stop <-chan struct{}) {
		steadily(12500*time.Microsecond, stop, func() {
			r, err := stepDecide(a, ctx, "z", "busy", limit, 1)
			switch {
			case err != nil:
				failed++
			case r.Allowed:
				allowed++
			default:
				denied++
			}
		})
	})
	t.Logf("%d allowed, %d denied, %d failed; %d reports", allowed, denied, failed, len(w.seqs))
	if allowed < 120 {
		t.Fatalf("only %d requests made: the run did not outlast the first lease", allowed)
	}
	if denied+failed > 0 {
		t.Errorf("%d denied, %d failed while the fleet had tokens: the lease ran out before it was renewed", denied, failed)
	}
}
