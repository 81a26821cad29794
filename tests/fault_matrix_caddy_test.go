package tests

// The fault matrix: {strict, async} × {open, closed, local} × nine Redis
// faults, each against its own redis-server and one Caddy whose two
// handlers (strict under /strict/, async under /async/) have one zone per
// fail policy. Every cell must hold, through a short fault phase:
//
//   - no 5xx, and every response within timeout + margin (never a hang);
//   - a key blocked before the fault stays blocked: 0 admitted, under every
//     policy (the deny cache), except after a fault that loses Redis's
//     state (kill, FLUSHALL, restart), where Redis forgot it: at most the
//     limit, 5;
//   - a fresh key is admitted at most the limit (5) under closed and local,
//     6 under local and open where a foreign value sends one decision to
//     the fail policy, 10 under local when Redis restarts empty (the
//     fallback's share, then Redis afresh); open admits every request
//     while Redis is down;
//   - after the fault, within seconds: the store is healthy and Redis
//     decides again;
//   - an outage (kill, SIGSTOP, DEBUG SLEEP, CLIENT PAUSE, OOM) is visible:
//     the strict store reported unhealthy in the admin zone list during
//     the phase, store errors counted, and one WARN line per store.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	matrixTimeout = 200 * time.Millisecond
	matrixMargin  = 1500 * time.Millisecond // race-built Caddy on a loaded 2-core machine
	matrixPhase   = 2 * time.Second
	matrixLimit   = 5
)

func matrixSite(redisAddr string) string {
	handler := func(mode, prefix string) string {
		var zones strings.Builder
		for _, policy := range []string{"open", "closed", "local"} {
			fmt.Fprintf(&zones, `
		zone %s_%s {
			match {
				path /%s/%s
			}
			key {http.request.header.X-API-Key}
			events %d
			window 1h
			fail_policy %s
		}`, prefix, policy, mode, policy, matrixLimit, policy)
		}
		extra := ""
		if mode == "async" {
			extra = "\n\t\t\tsync_interval 100ms"
		}
		return fmt.Sprintf(`
	handle /%s/* {
		rate_limit {%s
			distributed {
				redis redis://%s
				mode %s
				timeout %v%s
			}
		}
		respond "ok"
	}`, mode, zones.String(), redisAddr, mode, matrixTimeout, extra)
	}
	return "http:// {" + handler("strict", "s") + handler("async", "a") + "\n}\n"
}

type matrixFault struct {
	name string
	// down: Redis cannot serve for some of the phase; outage: for long
	// enough that the breaker opens; lossy: Redis loses its state.
	down, outage, lossy bool
	start, stop         func(t *testing.T, rs *redisServer)
}

func waitRedisAnswers(t *testing.T, rs *redisServer) {
	c := rs.Client()
	waitFor(t, 10*time.Second, "redis to answer again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return c.Ping(ctx).Err() == nil
	})
}

var matrixFaults = []matrixFault{
	{name: "kill", down: true, outage: true, lossy: true,
		start: func(t *testing.T, rs *redisServer) { rs.Kill() },
		stop:  func(t *testing.T, rs *redisServer) { rs.Start() }},
	{name: "sigstop", down: true, outage: true,
		start: func(t *testing.T, rs *redisServer) { rs.Pause() },
		stop:  func(t *testing.T, rs *redisServer) { rs.Resume() }},
	{name: "debug sleep", down: true, outage: true,
		start: func(t *testing.T, rs *redisServer) {
			c := rs.Client()
			go c.Do(context.Background(), "DEBUG", "SLEEP", "2")
		},
		stop: waitRedisAnswers},
	{name: "client pause", down: true, outage: true,
		start: func(t *testing.T, rs *redisServer) {
			if err := rs.Client().Do(context.Background(), "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
				t.Fatal(err)
			}
		},
		stop: waitRedisAnswers},
	{name: "oom", down: true, outage: true,
		start: func(t *testing.T, rs *redisServer) {
			c := rs.Client()
			ctx := context.Background()
			if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
		},
		stop: func(t *testing.T, rs *redisServer) {
			if err := rs.Client().ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
		}},
	{name: "wrongtype",
		start: func(t *testing.T, rs *redisServer) {
			c := rs.Client()
			ctx := context.Background()
			for _, p := range []string{"open", "closed", "local"} {
				c.HSet(ctx, "tally:s_"+p+":fresh", "a", "b")
				c.Set(ctx, "tally:a_"+p+".async:fresh", "x", 0)
			}
		}},
	{name: "script flush",
		start: func(t *testing.T, rs *redisServer) { rs.Client().ScriptFlush(context.Background()) }},
	{name: "flushall", lossy: true,
		start: func(t *testing.T, rs *redisServer) { rs.Client().FlushAll(context.Background()) }},
	{name: "restart", down: true, lossy: true,
		start: func(t *testing.T, rs *redisServer) { rs.Kill(); rs.Start() }},
}

func TestFaultMatrix(t *testing.T) {
	t.Parallel()
	for _, f := range matrixFaults {
		t.Run(strings.ReplaceAll(f.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			runFaultCell(t, f)
		})
	}
}

type cellCount struct {
	blocked, fresh, slow, serverErrors int
}

func runFaultCell(t *testing.T, f matrixFault) {
	rs := startRedis(t)
	inst := startCaddyWith(t, "metrics", matrixSite(rs.Addr))
	modes := []string{"strict", "async"}
	policies := []string{"open", "closed", "local"}
	req := func(mode, policy, key string) request {
		return request{Path: "/" + mode + "/" + policy, Header: map[string]string{"X-API-Key": key}}
	}
	// Block "blocked" everywhere, and let async sync it (its denial then
	// lasts until Redis's retry time, not the next sync).
	for _, m := range modes {
		for _, p := range policies {
			waitFor(t, 10*time.Second, m+"/"+p+" to block the key", func() bool {
				return inst.Do(req(m, p, "blocked")).Status == 429
			})
		}
	}
	after := time.Now()
	waitFor(t, 10*time.Second, "an async sync", func() bool {
		var ok bool
		for _, z := range listHealth(t, inst) {
			if z.Name == "a_open" {
				ok = z.Store != nil && z.Store.OK
			}
		}
		return ok && time.Since(after) > 300*time.Millisecond
	})
	for _, m := range modes {
		for _, p := range policies {
			if got := inst.Do(req(m, p, "blocked")).Status; got != 429 {
				t.Fatalf("%s/%s: the blocked key answered %d before the fault", m, p, got)
			}
		}
	}

	f.start(t, rs)
	phaseEnd := time.Now().Add(matrixPhase)
	counts := map[string]*cellCount{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range modes {
		for _, p := range policies {
			c := &cellCount{}
			counts[m+"/"+p] = c
			wg.Go(func() {
				for i := 0; time.Now().Before(phaseEnd); i++ {
					key := "blocked"
					if i%2 == 1 {
						key = "fresh"
					}
					res, err := inst.try(req(m, p, key))
					mu.Lock()
					switch {
					case err != nil:
						c.serverErrors++
					case res.Status >= 500:
						c.serverErrors++
					case res.Status == 200 && key == "blocked":
						c.blocked++
					case res.Status == 200:
						c.fresh++
					}
					if err == nil && res.Elapsed > matrixTimeout+matrixMargin {
						c.slow++
					}
					mu.Unlock()
				}
			})
		}
	}
	sawUnhealthy := false
	for time.Now().Before(phaseEnd) {
		for _, z := range listHealth(t, inst) {
			if z.Name == "s_closed" && z.Store != nil && !z.Store.OK {
				sawUnhealthy = true
			}
		}
		time.Sleep(100 * time.Millisecond) // pacing the admin polls, not synchronisation
	}
	wg.Wait()
	if f.stop != nil {
		f.stop(t, rs)
	}

	for _, m := range modes {
		for _, p := range policies {
			c := counts[m+"/"+p]
			cell := f.name + " " + m + "/" + p
			if c.serverErrors > 0 {
				t.Errorf("%s: %d server errors or failed requests", cell, c.serverErrors)
			}
			if c.slow > 0 {
				t.Errorf("%s: %d responses slower than timeout %v + %v", cell, c.slow, matrixTimeout, matrixMargin)
			}
			maxBlocked := 0
			if f.lossy {
				// Redis forgot the key; an instance that resubscribes to
				// resets drops its cached denials (it may have missed a
				// reset), so Redis decides the key afresh.
				maxBlocked = matrixLimit
			}
			if c.blocked > maxBlocked {
				t.Errorf("%s: the blocked key was admitted %d times, want at most %d", cell, c.blocked, maxBlocked)
			}
			maxFresh := matrixLimit
			if f.name == "wrongtype" && p != "closed" {
				maxFresh++ // the decision that met the value: fail policy
			}
			if f.lossy && f.down && p == "local" {
				// the fallback's share, which Redis never hears of, then
				// Redis afresh
				maxFresh += matrixLimit
			}
			if (p != "open" || !f.down) && c.fresh > maxFresh {
				t.Errorf("%s: a fresh key was admitted %d times, want at most %d", cell, c.fresh, maxFresh)
			}
		}
	}

	// Recovery: Redis decides again within seconds, in both modes.
	for _, m := range modes {
		prefix := m[:1]
		n := 0
		waitFor(t, 15*time.Second, f.name+": "+m+" to decide through Redis again", func() bool {
			n++
			healthy := false
			for _, z := range listHealth(t, inst) {
				if z.Name == prefix+"_closed" {
					healthy = z.Store != nil && z.Store.OK
				}
			}
			return healthy && inst.Do(req(m, "closed", fmt.Sprintf("after-%d", n))).Status == 200
		})
	}

	if f.outage {
		if !sawUnhealthy {
			t.Errorf("%s: the admin zone list never showed the strict store unhealthy during the outage", f.name)
		}
		if v, ok := metricValue(inst.scrape(), "caddy_rate_limit_store_errors_total", map[string]string{"zone": "s_closed"}); !ok || v < 1 {
			t.Errorf("%s: store_errors_total{zone=s_closed} = %v (present %v), want the outage counted", f.name, v, ok)
		}
		if n := strings.Count(inst.Output(), "redis unreachable; zones apply their fail_policy"); n < 1 || n > 2 {
			t.Errorf("%s: %d WARN lines about the outage, want one per store (1 or 2)", f.name, n)
		}
	}
	t.Logf("%s: admitted during the phase (blocked key, fresh key): %s", f.name, formatCounts(counts))
}

func listHealth(t *testing.T, c *caddyInstance) []adminZone {
	t.Helper()
	var list []adminZone
	c.adminJSON("/rate_limit/zones", &list)
	return list
}

func formatCounts(counts map[string]*cellCount) string {
	var b strings.Builder
	for _, m := range []string{"strict", "async"} {
		for _, p := range []string{"open", "closed", "local"} {
			c := counts[m+"/"+p]
			fmt.Fprintf(&b, "%s/%s %d,%d  ", m, p, c.blocked, c.fresh)
		}
	}
	return b.String()
}
