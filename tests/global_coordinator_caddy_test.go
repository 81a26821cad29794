package tests

// Multi-region budgets (issue 29): a region's coordinator is a Caddy
// process, frozen with SIGSTOP as a stuck host would be.

import (
	"syscall"
	"testing"
	"time"
)

// A region's coordinator frozen: another Caddy of the region takes over
// once the lock runs out (3 × sync_interval + the global timeout) and the
// region's shares go on following its demand; woken, the stale coordinator
// finds the region's lock another's (its late sync, if it had one in
// flight, is refused by its older token) and stops coordinating.
func TestGlobalFrozenCoordinatorCaddyIsReplacedAndFencedOff(t *testing.T) {
	t.Parallel() // with the other faults at their real length
	global, euRedis, usRedis := startRedis(t), startRedis(t), startRedis(t)
	link := func() string {
		p := startRedisProxy(t, global.Addr)
		p.SetLatency(50*time.Millisecond, 100*time.Millisecond)
		return p.Addr
	}
	eu := []*caddyInstance{startCaddy(t, globalSite(euRedis.Addr, "eu", link())), startCaddy(t, globalSite(euRedis.Addr, "eu", link()))}
	startCaddy(t, globalSite(usRedis.Addr, "us", link()))
	coordinating := func(c *caddyInstance) bool {
		v, ok := metricValue(c.scrape(), "caddy_rate_limit_global_coordinator", map[string]string{"zone": "api"})
		return ok && v == 1
	}
	var a, b *caddyInstance // the coordinator, the other
	waitFor(t, 10*time.Second, "an eu coordinator", func() bool {
		for i, c := range eu {
			if coordinating(c) {
				a, b = c, eu[1-i]
				return true
			}
		}
		return false
	})
	if coordinating(b) {
		t.Fatal("both eu instances coordinate")
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) }) // before the harness stops it
	frozen := time.Now()
	waitFor(t, 10*time.Second, "the other eu instance to take over", func() bool { return coordinating(b) })
	t.Logf("the other eu instance took over %v after the coordinator froze", time.Since(frozen).Round(time.Millisecond))

	// The region goes on: demand in eu, through b, wins eu the key.
	var key struct {
		Share *float64 `json:"share"`
	}
	waitFor(t, 15*time.Second, "eu's share of k to follow its demand to 90%", func() bool {
		for range 10 {
			b.Do(withKey("k"))
			time.Sleep(25 * time.Millisecond)
		}
		key.Share = nil
		b.adminJSON(keyPath("api", "k"), &key)
		return key.Share != nil && *key.Share >= 0.9
	})

	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the woken coordinator to stop coordinating", func() bool { return !coordinating(a) })
	if !coordinating(b) {
		t.Error("after the stale coordinator woke, its successor no longer coordinates")
	}
	// The woken instance applies what its successor publishes.
	waitFor(t, 5*time.Second, "the woken instance to apply eu's share of k", func() bool {
		key.Share = nil
		a.adminJSON(keyPath("api", "k"), &key)
		return key.Share != nil && *key.Share >= 0.9
	})
}
