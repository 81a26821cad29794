package tests

// Concurrency slots in Redis whose leases are tested beyond one lease per
// store (issue 23): renewals follow the shortest lease a store holds.

import (
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
