package tests

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The Sentinel failover through real Caddy processes (issue 16): one master,
// one replica, three Sentinels, three instances whose redis addresses are the
// Sentinels, fail_policy closed on a limit no key reaches, so that every 429
// is a decision the store could not make. The master is killed under load
// over several keys through all three instances. No 5xx ever; 429s only from
// the kill until resumeBound after the promotion; the admin zone list names
// the dead master while it is down; and afterwards a fresh key is exact
// across the three instances on the new master.
func TestSentinelFailoverThroughCaddy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master, replica, sentinels := startSentinelSet(t)

	distributedBlock := `
			distributed {
				redis {
					addresses ` + strings.Join(sentinels, " ") + `
					sentinel_master mymaster
				}
				timeout 500ms
			}`
	site := failoverSite(distributedBlock)
	fleet := make([]*caddyInstance, 3)
	for i := range fleet {
		fleet[i] = startCaddy(t, site)
	}

	var keys []string
	for i := range 8 {
		keys = append(keys, "sentinel-key-"+strconv.Itoa(i))
	}
	var serverErrors atomic.Int64
	var next atomic.Int64
	var killedAt atomic.Int64 // UnixNano of the kill; 0 before it
	var earlyRefusals atomic.Int64
	load := startKeyLoad(t, keys, 12, func(k string) (bool, error) {
		res, err := tryRoundRobin(fleet, &next, &serverErrors, k)
		switch {
		case err != nil:
			return false, err
		case res.Status == 429:
			if killedAt.Load() == 0 {
				earlyRefusals.Add(1)
			}
			return false, errors.New("429: the fail policy")
		case res.Status != 200:
			return false, fmt.Errorf("status %d", res.Status)
		}
		return true, nil
	})
	waitFor(t, 20*time.Second, "a 200 for every key", func() bool {
		return load.allSucceededSince(keys, time.Time{})
	})

	killedAt.Store(time.Now().UnixNano())
	master.Kill()
	waitFor(t, 5*time.Second, "the admin zone list to name the killed master", func() bool {
		for _, c := range fleet {
			var zs []struct {
				Name  string `json:"name"`
				Store *struct {
					Unreachable []struct {
						Node string `json:"node"`
					} `json:"unreachable_nodes"`
				} `json:"store"`
			}
			c.adminJSON("/rate_limit/zones", &zs)
			named := false
			for _, z := range zs {
				if z.Name == "api" && z.Store != nil && len(z.Store.Unreachable) == 1 {
					named = z.Store.Unreachable[0].Node == master.Addr
				}
			}
			if !named {
				return false
			}
		}
		return true
	})
	promotedAt := waitForSentinelPromotion(t, sentinels[0], replica)
	waitFor(t, 10*time.Second, "a 200 for every key after the promotion", func() bool {
		return load.allSucceededSince(keys, promotedAt)
	})
	load.halt()

	if n := serverErrors.Load(); n > 0 {
		t.Errorf("%d server or transport errors during the failover", n)
	}
	if n := earlyRefusals.Load(); n > 0 {
		t.Errorf("%d 429s before the kill, want none (no key reaches its limit)", n)
	}
	failed, refusals, lastFail := 0, 0, time.Time{}
	for _, k := range keys {
		st := load.snapshot(k)
		if st.failures > 0 {
			failed++
		}
		refusals += st.failures
		if st.lastFail.After(lastFail) {
			lastFail = st.lastFail
		}
		if late := st.lastFail.Sub(promotedAt); late > resumeBound {
			t.Errorf("key %s still failed %v after the promotion (last: %v), want within %v",
				k, late.Round(time.Millisecond), st.lastErr, resumeBound)
		}
	}
	t.Logf("promotion %v after the kill; %d fail-policy 429s on %d of %d keys, the last %v after the promotion",
		promotedAt.Sub(time.Unix(0, killedAt.Load())).Round(time.Millisecond), refusals, failed, len(keys),
		lastFail.Sub(promotedAt).Round(time.Millisecond))
	if failed == 0 {
		t.Error("no key ever got the fail policy: the kill did not happen under load")
	}
	for _, c := range fleet {
		waitFor(t, 5*time.Second, c.AdminURL+" to report the store healthy", func() bool {
			ok, _ := zoneStore(t, c, "api")
			return ok
		})
	}

	counts := sendAcross(t, fleet, 300, 48, request{Path: "/exact", Header: map[string]string{"X-API-Key": "sentinel-exact"}}, 5*time.Second)
	if counts[200] != 50 || counts[429] != 250 {
		t.Fatalf("300 requests for a fresh key on the new master over 3 instances at events 50: %v, want exactly 50×200 250×429", counts)
	}
	if n, err := replica.Client().Exists(ctx, "tally:exact:sentinel-exact").Result(); err != nil || n != 1 {
		t.Fatalf("the exact key is not on the promoted replica: %d %v", n, err)
	}
}
