package tests

// Post-charged and weighted zones across Caddy instances sharing a real
// redis-server: exact in strict mode, within the bound in async mode, and
// each fail policy with Redis killed.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/zones"
)

func strictBlock(addr string) string {
	// A generous timeout: these tests are about exactness, not latency (a
	// race-built Caddy on a loaded 2-core machine can take longer than the
	// 20ms default, and a check that times out goes to the fail policy).
	return `
		distributed {
			redis redis://` + addr + `
			timeout 2s
		}`
}

func TestPostChargedZonesAreExactAcrossThreeStrictInstances(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	loginUp, loginHits := loginUpstream(t)
	tokenUp, tokenHits := tokenUpstream(t)
	site := `http:// {
	handle /login {
		rate_limit {` + failedLoginZone + strictBlock(rs.Addr) + `
		}
		reverse_proxy ` + loginUp + `
	}
	handle {
		rate_limit {` + tokenZone + strictBlock(rs.Addr) + `
		}
		reverse_proxy ` + tokenUp + `
	}
}
`
	fleet := []*caddyInstance{startCaddy(t, site), startCaddy(t, site), startCaddy(t, site)}
	for i := range 3 {
		checkFailedLogins(t, fleet, "mallory-"+strconv.Itoa(i), loginHits)
	}
	checkTokenDebt(t, fleet, "Bearer alice", tokenHits)
	rs.requireEveryKeyExpires(t, 4)
}

func TestWeightedCostIsExactAcrossThreeStrictInstances(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	fleet := startFleet(t, 3, rs.Addr+`
			timeout 2s`, `
		zone weighted {
			key    {http.request.header.X-API-Key}
			events 100
			window 1h
			cost   {http.request.header.X-Cost}
		}`)
	// 3 per request: 33 of 200 concurrent requests fit in 100.
	r := request{Header: map[string]string{"X-API-Key": "alice", "X-Cost": "3"}}
	if got := sendAcross(t, fleet, 200, 48, r, 10*time.Second); got[200] != 33 || got[429] != 167 {
		t.Fatalf("200 concurrent requests of cost 3 at events 100 over 3 instances: %v, want exactly 33×200", got)
	}
}

func TestCostOverTheBurstReportsTheKeysTimeToFullFromRedis(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	site := strings.Replace(weightedSite, `
		zone gate {`, strictBlock(rs.Addr)+`
		zone gate {`, 1)
	checkCostOverBurstReportsTheKeysReset(t, startCaddy(t, site))
}

func TestPostChargedZoneInAsyncModeStaysWithinTheBound(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	up, hits := loginUpstream(t)
	site := loginSite(up, failedLoginZone, `
		distributed {
			redis redis://`+rs.Addr+`
			mode async
			sync_interval 100ms
		}`)
	fleet := []*caddyInstance{startCaddy(t, site), startCaddy(t, site), startCaddy(t, site)}
	for _, c := range fleet {
		waitFor(t, 10*time.Second, "the instances to see each other", func() bool {
			_, n := asyncZoneStore(t, c, "failed_logins")
			return n == 3
		})
	}
	// Wrong passwords, one every 20ms round the fleet, for 3 s (past the
	// hold and many syncs): the bound for events 5 over 3 instances is
	// B + (N-1)·max(1, B/N) = 7 failures let through, and once the
	// instances have synced the fleet lets through all 5.
	var got statusCounts = map[int]int{}
	for i := 0; i < 150; i++ {
		res := fleet[i%3].Do(request{Path: "/login", Header: map[string]string{"X-User": "mallory", "X-Password": "wrong"}})
		got[res.Status]++
		time.Sleep(20 * time.Millisecond) // the pace of the attack, not synchronisation
	}
	if got[401] < 5 || got[401] > 7 || got.serverErrors() > 0 {
		t.Fatalf("150 wrong passwords over 3 async instances at events 5: %v, want 5 to 7 failures let through", got)
	}
	if n := hits.Load(); n != int64(got[401]) {
		t.Errorf("%d requests reached the upstream, %d were answered 401", n, got[401])
	}
	rs.requireEveryKeyExpires(t, 1)
}

func TestPostChargedZonesApplyEachFailPolicyWithRedisKilled(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	up, hits := loginUpstream(t)
	zone := func(name, policy string) string {
		return `
		zone ` + name + ` {
			match {
				path /` + name + `
			}
			key    {http.request.header.X-User}
			events 30
			window 1h
			count {
				status 401
			}
			fail_policy ` + policy + `
		}`
	}
	site := loginSite(up, zone("open", "open")+zone("closed", "closed")+zone("local", "local"), `
		distributed {
			redis redis://`+rs.Addr+`
		}`)
	fleet := []*caddyInstance{startCaddyWith(t, "metrics", site), startCaddyWith(t, "metrics", site), startCaddyWith(t, "metrics", site)}
	for _, c := range fleet {
		waitFor(t, 10*time.Second, c.URL+" to see 3 instances", func() bool {
			ok, n := zoneStore(t, c, "local")
			return ok && n == 3
		})
	}
	rs.Kill()
	wrong := func(path string) request {
		return request{Path: path, Header: map[string]string{"X-User": "mallory", "X-Password": "wrong"}}
	}
	const fast = time.Second

	t.Run("open lets every failure through", func(t *testing.T) {
		before := hits.Load()
		if got := sendAcross(t, fleet, 45, 3, wrong("/open"), fast); got[401] != 45 {
			t.Errorf("fail_policy open during the outage: %v, want 45×401", got)
		}
		if n := hits.Load() - before; n != 45 {
			t.Errorf("%d reached the upstream, want 45", n)
		}
	})
	t.Run("closed denies before the upstream", func(t *testing.T) {
		before := hits.Load()
		for i, c := range fleet {
			res := c.Do(wrong("/closed"))
			if ra, err := strconv.Atoi(res.Header.Get("Retry-After")); res.Status != 429 || err != nil || ra < 1 {
				t.Errorf("instance %d: %d Retry-After %q, want 429 with Retry-After >= 1", i, res.Status, res.Header.Get("Retry-After"))
			}
		}
		if n := hits.Load() - before; n != 0 {
			t.Errorf("%d reached the upstream, want 0", n)
		}
	})
	t.Run("local lets each instance's share through", func(t *testing.T) {
		total := 0
		for i, c := range fleet {
			got := countStatuses(c.Send(15, wrong("/local")))
			if got[401] != 10 || got[429] != 5 {
				t.Errorf("instance %d, events 30 over 3 instances: %v, want 10×401 5×429", i, got)
			}
			total += got[401]
		}
		if total != 30 {
			t.Errorf("the fleet let %d failures through during the outage, want 30", total)
		}
	})
	t.Run("failed charges are counted", func(t *testing.T) {
		waitFor(t, 10*time.Second, "charge failures to be counted after their retries", func() bool {
			v, _ := metricValue(fleet[0].scrape(), "caddy_rate_limit_charge_failures_total", map[string]string{"zone": "local"})
			return v == 10
		})
		if v, _ := metricValue(fleet[0].scrape(), "caddy_rate_limit_charge_failures_total", map[string]string{"zone": "open"}); v != 15 {
			t.Errorf("charge_failures_total{zone=open} = %v, want 15", v)
		}
	})
}

// Errors returned down the chain, shaped by handle_errors, count with their
// status.
func TestErrorResponsesFromHandleErrorsAreCounted(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone failed_logins {
			key    {http.request.header.X-User}
			events 3
			window 1h
			count {
				status 4xx
			}
		}
	}
	@wrong header X-Password wrong
	error @wrong "bad password" 401
	respond "welcome"
	handle_errors {
		respond "{err.status_code}: {err.message}" {err.status_code}
	}
}
`)
	var got []int
	for i := range 8 {
		pw := "right"
		if i%2 == 0 {
			pw = "wrong"
		}
		got = append(got, c.Do(request{Header: map[string]string{"X-User": "mallory", "X-Password": pw}}).Status)
	}
	if want := "[401 200 401 200 401 429 429 429]"; fmt.Sprint(got) != want {
		t.Fatalf("errors shaped by handle_errors: %v, want %s", got, want)
	}
	if code, _ := c.adminDo(http.MethodGet, keyPath("failed_logins", "carol")); code != http.StatusNotFound {
		t.Errorf("a user who never failed has state: %d", code)
	}
}

// Weighted requests in async mode: the cost, not the count, stays within
// the bound, which is in units of cost.
func TestWeightedCostInAsyncModeStaysWithinTheBound(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	const interval = 100 * time.Millisecond
	fleet := startAsyncFleet(t, 3, rs.Addr, "100ms", `
		zone weighted {
			key    {http.request.header.X-API-Key}
			events 300
			window 1h
			cost   {http.request.header.X-Cost}
		}`)
	for _, c := range fleet {
		waitFor(t, 10*time.Second, c.URL+" to see 3 instances", func() bool {
			ok, n := asyncZoneStore(t, c, "weighted")
			return ok && n == 3
		})
	}
	limit := zones.Config{Events: 300, Window: time.Hour}.Limit()
	start := time.Now()
	r := request{Header: map[string]string{"X-API-Key": "alice", "X-Cost": "3"}}
	counts := sendAcross(t, fleet, 600, 48, r, 5*time.Second)
	elapsed := time.Since(start)
	spent := int64(3 * counts[200])
	bound := asyncBound(limit, elapsed, interval, len(fleet))
	t.Logf("async, 3 instances, events 300, cost 3: 600 concurrent requests in %v: %v; %d units spent, bound %d", elapsed, counts, spent, bound)
	if spent < 270 || spent > bound {
		t.Fatalf("600 requests of cost 3 over 3 async instances at events 300: %v, %d units spent, want 270 to %d", counts, spent, bound)
	}
}

// A post-charged zone's fail_policy local starts an outage from what Redis
// last said of the key, as a plain zone does: its check and its charges
// tell the fallback, not only a decision (issue 23, item 3). A key with 1
// of 20 left lets 1 more failure through during the outage, not a fresh
// 20.
func TestPostChargedZoneFallsBackFromWhatRedisLastSaid(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	up, hits := loginUpstream(t)
	site := loginSite(up, `
		zone failures {
			key    {http.request.header.X-User}
			events 20
			window 1h
			count {
				status 401
			}
			fail_policy local
		}`, strictBlock(rs.Addr))
	c := startCaddy(t, site)
	waitFor(t, 10*time.Second, "the instance to see itself through Redis", func() bool {
		ok, n := zoneStore(t, c, "failures")
		return ok && n == 1
	})
	wrong := request{Header: map[string]string{"X-User": "mallory", "X-Password": "wrong"}}
	if got := countStatuses(c.Send(19, wrong)); got[401] != 19 {
		t.Fatalf("19 failures with Redis up: %v, want 19×401", got)
	}
	waitFor(t, 10*time.Second, "the 19 charges to land in Redis", func() bool {
		var k adminKey
		status, body := c.adminDo(http.MethodGet, keyPath("failures", "mallory"))
		return status == http.StatusOK && json.Unmarshal([]byte(body), &k) == nil && k.Remaining == 1
	})
	rs.Kill()
	before := hits.Load()
	got := countStatuses(c.Send(30, wrong))
	if got[401] != 1 || got[429] != 29 {
		t.Errorf("30 failures during the outage for a key with 1 of 20 left: %v, want 1×401 29×429", got)
	}
	if n := hits.Load() - before; n != int64(got[401]) {
		t.Errorf("%d reached the upstream, %d were answered 401", n, got[401])
	}
}
