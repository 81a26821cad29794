package tests

// The heartbeat through real Caddy processes and a real redis-server: a
// process counts once in tally:instances, through a reload during an outage
// and with strict and async handlers on one Redis (counted twice, it would
// get half its fail_policy local share).

import (
	"context"
	"testing"
	"time"
)

// A reload that replaces the store (here: another timeout) while Redis is
// unreachable must not leave this instance counted twice once Redis is
// back: that would halve every fail_policy local share.
func TestStoreChangingReloadDuringOutageCountsTheInstanceOnce(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	zone := `
		zone z {
			key {http.request.header.X-API-Key}
			events 100
			window 1h
		}`
	inst := startCaddy(t, distributedSite(rs.Addr, zone, "\t\t\ttimeout 100ms"))
	waitFor(t, 10*time.Second, "the store to see this instance", func() bool {
		h := zoneHealthOf(t, inst, "z")
		return h.Store.OK && h.Store.Instances == 1
	})
	rs.Pause()
	waitFor(t, 10*time.Second, "the breaker to open", func() bool {
		inst.Do(withKey("k"))
		return !zoneHealthOf(t, inst, "z").Store.OK
	})
	load(t, inst, "", distributedSite(rs.Addr, zone, "\t\t\ttimeout 150ms"))
	rs.Resume()
	ctx := context.Background()
	waitFor(t, 10*time.Second, "the new store to beat", func() bool {
		h := zoneHealthOf(t, inst, "z")
		return h.Store.OK && rs.Client().ZCard(ctx, "tally:instances").Val() >= 1
	})
	// The old store's id would live on for 10s after its last beat; the
	// new store removes it with its next beat (every second).
	waitFor(t, 3*time.Second, "one member in tally:instances", func() bool {
		return rs.Client().ZCard(ctx, "tally:instances").Val() == 1
	})
	waitFor(t, 3*time.Second, "the zone to count 1 instance", func() bool {
		return zoneHealthOf(t, inst, "z").Store.Instances == 1
	})
}

// A process is one instance in the heartbeat set however many stores it
// has: here a strict and an async handler on one Redis. Counted twice, it
// would get half its fail_policy local share (and async fresh shares).
func TestOneCaddyWithStrictAndAsyncHandlersCountsOnce(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	inst := startCaddy(t, matrixSite(rs.Addr))
	ctx := context.Background()
	waitFor(t, 10*time.Second, "both stores to beat", func() bool {
		s, a := zoneHealthOf(t, inst, "s_local"), zoneHealthOf(t, inst, "a_local")
		return s.Store.OK && a.Store.OK && rs.Client().Exists(ctx, "tally:instances").Val() == 1
	})
	// Both stores beat at once when they open and then every second:
	// over two seconds each has beaten at least twice.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		if n := rs.Client().ZCard(ctx, "tally:instances").Val(); n != 1 {
			t.Fatalf("tally:instances has %d members for one Caddy, want 1", n)
		}
		for _, z := range []string{"s_local", "a_local"} {
			if n := zoneHealthOf(t, inst, z).Store.Instances; n != 1 {
				t.Fatalf("zone %s counts %d instances, want 1", z, n)
			}
		}
		time.Sleep(50 * time.Millisecond) // pacing the polls over the period the invariant must hold
	}
}
