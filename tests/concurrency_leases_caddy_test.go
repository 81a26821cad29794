package tests

// Concurrency slots in Redis whose leases are tested beyond one lease per
// store (issue 23): renewals follow the shortest lease a store holds, and a
// Redis that loses its data (FLUSHALL, a restart without it) gets the slots
// of the requests still running back before anyone takes a new one.

import (
	"context"
	"testing"
	"time"
)

// A lease 1s slot held for three and a half leases beside a slot of the
// default lease (30s, renewed every 10s) on the same store stays exclusive:
// the store renews every slot at the pace of the shortest lease it holds.
func TestShortLeaseSlotBesideALongLeaseOneStaysExclusive(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	u := startCountingUpstream(t)
	site := concurrencySite(u, `
		zone long {
			match {
				path /long/*
			}
			key {http.request.header.X-API-Key}
			concurrency 1
		}
		zone short {
			match {
				path /short/*
			}
			key {http.request.header.X-API-Key}
			concurrency 1
			lease 1s
		}`, `
		distributed {
			redis redis://`+rs.Addr+`
			timeout 2s
		}`)
	a, b := startCaddy(t, site), startCaddy(t, site)
	// The long lease first: the store's renewals start at its pace.
	long := inBackground(a, keyRequest("alice", "/long/held?gate=long"))
	u.waitInFlight(1)
	short := inBackground(a, keyRequest("alice", "/short/held?gate=short"))
	u.waitInFlight(2)
	start := time.Now()
	for time.Since(start) < 3500*time.Millisecond {
		if res := b.Do(keyRequest("alice", "/short/fast")); res.Status != 429 {
			t.Fatalf("%v into a request holding alice's only lease 1s slot (beside a 30s one), another got %d, want 429",
				time.Since(start).Round(time.Millisecond), res.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	u.open("short")
	u.open("long")
	for _, ch := range []<-chan response{short, long} {
		if res := <-ch; res.Status != 200 {
			t.Fatalf("a held request: %d, want 200", res.Status)
		}
	}
}

// FLUSHALL while an instance holds every slot of a key: no instance admits
// a request of the key meanwhile, the holder takes its slots back within a
// recovery (3s), and the upstream never serves more of the key than the
// limit.
func TestConcurrencyNeverExceedsTheLimitWhenRedisLosesItsData(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	u := startCountingUpstream(t)
	site := concurrencySite(u, `
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 2
		}`, `
		distributed {
			redis redis://`+rs.Addr+`
			timeout 2s
		}`)
	a, b := startCaddy(t, site), startCaddy(t, site)
	var held []<-chan response
	for range 2 {
		held = append(held, inBackground(a, keyRequest("alice", "/held?gate=held")))
	}
	u.waitInFlight(2)
	ctx := context.Background()
	rc := rs.Client()
	// Both instances have beaten (a store beats once it opens), so both
	// know the instances set must exist.
	waitFor(t, 5*time.Second, "both instances in the instances set", func() bool {
		return rc.ZCard(ctx, "tally:instances").Val() == 2
	})
	if err := rc.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	retaken := time.Duration(0)
	for time.Since(flushed) < 5*time.Second {
		for _, c := range []*caddyInstance{b, a} {
			if res := c.Do(keyRequest("alice", "/fast")); res.Status != 429 {
				t.Fatalf("%v after FLUSHALL, beside alice's 2 requests in flight (concurrency 2): %d, want 429",
					time.Since(flushed).Round(time.Millisecond), res.Status)
			}
		}
		if retaken == 0 && rc.ZCard(ctx, "tally:uploads:alice").Val() == 2 {
			retaken = time.Since(flushed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if retaken == 0 || retaken > 3*time.Second {
		t.Errorf("alice's 2 slots back in Redis %v after FLUSHALL, want within the 3s recovery", retaken)
	}
	if p := u.peak.Load(); p != 2 {
		t.Errorf("the upstream served up to %d of alice's requests at once, want 2", p)
	}
	u.open("held")
	for i, ch := range held {
		if res := <-ch; res.Status != 200 {
			t.Fatalf("held request %d: %d, want 200", i, res.Status)
		}
	}
	waitFor(t, 2*time.Second, "alice to be admitted once her requests ended", func() bool {
		return b.Do(keyRequest("alice", "/fast")).Status == 200
	})
	t.Logf("slots back in Redis %v after FLUSHALL", retaken.Round(time.Millisecond))
	rs.requireEveryKeyExpires(t, 1)
}
