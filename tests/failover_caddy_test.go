package tests

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Cluster failover through real Caddy processes: three instances, the
// dead master among the redis addresses, fail_policy closed on a limit no
// key reaches, so that every 429 is a decision the store could not make.
// No 5xx; keys on healthy masters never get a 429; the killed master's keys
// get 200s again within resumeBound of the promotion; the admin zone list
// names the unreachable node while it is down; and afterwards a key on the
// promoted shard is exact across the three instances.
func TestClusterFailoverThroughCaddy(t *testing.T) {
	t.Parallel()
	rc := startReplicatedCluster(t)
	ctx := context.Background()
	victim := rc.masters[0]
	heir := rc.replicaOf[victim.Addr]
	var urls []string
	for _, a := range rc.addrs() {
		urls = append(urls, "redis://"+a)
	}
	// The timeout the GCRA exactness test has: on a loaded 2-core machine
	// race-built Caddies answer a healthy master's key in up to 430ms with
	// this test running alone, before the kill as well as after it (many
	// keys at once: the machine stalls), so 500ms could hand a decision to
	// the fail policy in a whole-suite run (1 of 420 once).
	distributedBlock := `
			distributed {
				redis ` + strings.Join(urls, " ") + `
				timeout 2s
			}`
	site := failoverSite(distributedBlock)
	fleet := make([]*caddyInstance, 3)
	for i := range fleet {
		fleet[i] = startCaddy(t, site)
	}
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.addrs()[1:]})
	defer view.Close()
	var masterAddrs []string
	for _, m := range rc.masters {
		masterAddrs = append(masterAddrs, m.Addr)
	}
	keys, owner := keysOnEveryNode(t, ctx, view, masterAddrs, 3)

	var serverErrors, next, slowestHealthy atomic.Int64
	load := startKeyLoad(t, keys, 12, func(k string) (bool, error) {
		res, err := tryRoundRobin(fleet, &next, &serverErrors, k)
		if owner[k] != victim.Addr && int64(res.Elapsed) > slowestHealthy.Load() {
			slowestHealthy.Store(int64(res.Elapsed)) // racy max: a figure for the log
		}
		switch {
		case err != nil:
			return false, err
		case res.Status == 429:
			return false, fmt.Errorf("429: the fail policy, answered in %v", res.Elapsed)
		}
		return true, nil
	})
	waitFor(t, 20*time.Second, "a 200 for every key", func() bool {
		return load.allSucceededSince(keys, time.Time{})
	})

	victim.Kill()
	waitFor(t, 5*time.Second, "the admin zone list to name the killed master", func() bool {
		var zs []struct {
			Name  string `json:"name"`
			Store *struct {
				Unreachable []struct {
					Node string `json:"node"`
				} `json:"unreachable_nodes"`
			} `json:"store"`
		}
		fleet[0].adminJSON("/rate_limit/zones", &zs)
		for _, z := range zs {
			if z.Name == "api" && z.Store != nil && len(z.Store.Unreachable) == 1 {
				return z.Store.Unreachable[0].Node == victim.Addr
			}
		}
		return false
	})
	hc := heir.Client()
	waitFor(t, 20*time.Second, "the replica's promotion", func() bool { return promoted(ctx, hc) })
	promotedAt := time.Now()
	waitFor(t, 10*time.Second, "a 200 for every key after the promotion", func() bool {
		return load.allSucceededSince(keys, promotedAt)
	})
	load.halt()
	t.Logf("slowest answer for a key on a healthy master: %v (timeout 2s)", time.Duration(slowestHealthy.Load()))

	if n := serverErrors.Load(); n > 0 {
		t.Errorf("%d server or transport errors during the failover", n)
	}
	for _, k := range keys {
		st := load.snapshot(k)
		if owner[k] != victim.Addr {
			if st.failures > 0 {
				t.Errorf("key %s on healthy master %s: %d of %d requests failed (last: %v), want none",
					k, owner[k], st.failures, st.decisions, st.lastErr)
			}
			continue
		}
		requireFailedThenResumed(t, k, st, promotedAt)
	}
	for _, c := range fleet {
		waitFor(t, 5*time.Second, c.AdminURL+" to report the store healthy", func() bool {
			ok, _ := zoneStore(t, c, "api")
			return ok
		})
	}

	var exactKey string
	for _, k := range keys {
		if owner[k] == victim.Addr {
			exactKey = k
			break
		}
	}
	counts := sendAcross(t, fleet, 300, 48, request{Path: "/exact", Header: map[string]string{"X-API-Key": exactKey}}, 5*time.Second)
	if counts[200] != 50 || counts[429] != 250 {
		t.Fatalf("300 requests for a key on the promoted shard over 3 instances at events 50: %v, want exactly 50×200 250×429", counts)
	}
}

// failoverSite is the site of the failover tests through Caddy: zone exact
// (50 per hour) on /exact, zone api (a limit no key reaches) on every other
// path, both with fail_policy closed, so that every 429 of zone api is a
// decision the store could not make.
// tryRoundRobin sends a request for key k to the next instance of fleet. A
// transport error or a 5xx is counted in serverErrors and returned as an
// error.
func tryRoundRobin(fleet []*caddyInstance, next, serverErrors *atomic.Int64, k string) (response, error) {
	res, err := fleet[next.Add(1)%int64(len(fleet))].try(withKey(k))
	switch {
	case err != nil:
		serverErrors.Add(1) // a transport error is as bad as a 5xx
		return res, err
	case res.Status >= 500:
		serverErrors.Add(1)
		return res, fmt.Errorf("status %d", res.Status)
	}
	return res, nil
}

func failoverSite(distributedBlock string) string {
	return `http:// {
	handle /exact {
		rate_limit {
			zone exact {
				key {http.request.header.X-API-Key}
				events 50
				window 1h
				fail_policy closed
			}` + distributedBlock + `
		}
		respond "ok"
	}
	handle {
		rate_limit {
			zone api {
				key {http.request.header.X-API-Key}
				events 1000000
				window 1h
				fail_policy closed
			}` + distributedBlock + `
		}
		respond "ok"
	}
}
`
}
