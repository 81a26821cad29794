package tests

// The harness for several Caddy instances sharing one Redis: their sites,
// starting a fleet, sending across it, and reading each instance's view of
// its store.

import (
	"sync/atomic"
	"testing"
	"time"
)

// distributedSite is a site whose rate_limit has zones and a distributed
// block with extra settings (mode, timeout...).
func distributedSite(redisAddr, zones, extra string) string {
	return `http:// {
	rate_limit {
` + zones + `
		distributed {
			redis redis://` + redisAddr + `
` + extra + `
		}
	}
	respond "ok"
}
`
}

// startFleet starts n Caddy instances whose rate_limit handler has the given
// zones and shares them through the Redis at redisAddr.
func startFleet(t *testing.T, n int, redisAddr, zones string) []*caddyInstance {
	t.Helper()
	return startFleetWith(t, n, "", redisAddr, zones)
}

// startFleetWith is startFleet with extra global options.
func startFleetWith(t *testing.T, n int, global, redisAddr, zones string) []*caddyInstance {
	t.Helper()
	site := distributedSite(redisAddr, zones, "")
	fleet := make([]*caddyInstance, n)
	for i := range fleet {
		fleet[i] = startCaddyWith(t, global, site)
	}
	return fleet
}

// startAsyncFleet starts n Caddy instances whose rate_limit handler has the
// given zones, shared through the Redis at redisAddr in async mode.
func startAsyncFleet(t *testing.T, n int, redisAddr, interval, zoneBlocks string) []*caddyInstance {
	t.Helper()
	site := distributedSite(redisAddr, zoneBlocks, "\t\t\tmode async\n\t\t\tsync_interval "+interval)
	fleet := make([]*caddyInstance, n)
	for i := range fleet {
		fleet[i] = startCaddy(t, site)
	}
	return fleet
}

// sendAcross sends n requests with r, request i to fleet[i%len(fleet)], from
// workers goroutines; every response must come within maxLatency.
func sendAcross(t *testing.T, fleet []*caddyInstance, n, workers int, r request, maxLatency time.Duration) statusCounts {
	t.Helper()
	var slow atomic.Int64
	counts := sendConcurrently(t, n, workers, func(i int) (response, error) {
		return fleet[i%len(fleet)].try(r)
	}, func(res response) {
		if res.Elapsed > maxLatency {
			slow.Add(1)
		}
	})
	if n := slow.Load(); n > 0 {
		t.Errorf("%d responses took longer than %v", n, maxLatency)
	}
	if n := counts.serverErrors(); n > 0 {
		t.Errorf("%d server errors: %v", n, counts)
	}
	return counts
}

// zoneStore is the store part of a zone in GET /rate_limit/zones.
func zoneStore(t *testing.T, c *caddyInstance, zone string) (ok bool, instances int) {
	t.Helper()
	return storeOfMode(t, c, zone, "strict")
}

// asyncZoneStore is the store part of an async zone in GET /rate_limit/zones.
func asyncZoneStore(t *testing.T, c *caddyInstance, zone string) (ok bool, instances int) {
	t.Helper()
	return storeOfMode(t, c, zone, "async")
}

// storeOfMode is the store part of a zone in GET /rate_limit/zones, which
// must be in mode.
func storeOfMode(t *testing.T, c *caddyInstance, zone, mode string) (ok bool, instances int) {
	t.Helper()
	z := zoneHealthOf(t, c, zone)
	if z.Store == nil || z.Mode != mode {
		t.Fatalf("zone %s in GET /rate_limit/zones: mode %q store %v, want a %s store", zone, z.Mode, z.Store, mode)
	}
	return z.Store.OK, z.Store.Instances
}
