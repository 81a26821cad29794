package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The overrides' storage: what a store that lost them, a reload that
// changes a zone's mode and two overrides of one match do to the set in
// force.

const overridesZone = `		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}`

// overridesInForce checks on c that the deny on "bad", the exempt "vip"
// and the raise to 20/min of "big" hold: bad refused, vip and big admitted
// past the zone's 3.
func overridesInForce(t *testing.T, c *caddyInstance, where string) {
	t.Helper()
	if res := c.Do(withKey("bad")); res.Status != http.StatusTooManyRequests {
		t.Errorf("%s: the denied key got %d", where, res.Status)
	}
	if n := admitted(c, withKey("vip"), 6); n != 6 {
		t.Errorf("%s: the exempt key admitted %d of 6", where, n)
	}
	if n := admitted(c, withKey("big"), 5); n != 5 {
		t.Errorf("%s: the raised key admitted %d of 5 (the zone allows 3, the raise 20)", where, n)
	}
}

func putThreeOverrides(t *testing.T, c *caddyInstance) {
	t.Helper()
	mustPutOverride(t, c, "api", "shut", `{"match":{"key":"bad"},"deny":true,"expires":"2h"}`)
	mustPutOverride(t, c, "api", "free", `{"match":{"key":"vip"},"exempt":true}`)
	mustPutOverride(t, c, "api", "raise", `{"match":{"key":"big"},"events":20,"window":"1m"}`)
}

// A Redis that loses its data (FLUSHALL) under 2 strict and 2 async
// instances loses none of their overrides: the instances keep enforcing
// and listing their copies, one of them writes them back within 2 s and
// says so once at WARN.
func TestOverridesRestoredAfterRedisLosesThem(t *testing.T) {
	rs := startRedis(t)
	fleet := append(startFleet(t, 2, rs.Addr, overridesZone), startAsyncFleet(t, 2, rs.Addr, "100ms", overridesZone)...)
	putThreeOverrides(t, fleet[0])
	// The same match twice, the later change's id sorting first: the
	// restore must keep the later one (exempt) in force.
	mustPutOverride(t, fleet[0], "api", "zz-earlier", `{"match":{"key":"twice"},"deny":true}`)
	mustPutOverride(t, fleet[0], "api", "aa-later", `{"match":{"key":"twice"},"exempt":true}`)
	for _, c := range fleet {
		untilOverrides(t, c, "api", 5, 2*time.Second)
	}
	rc := rs.Client()
	ctx := context.Background()
	if err := rc.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	waitFor(t, 2*time.Second, "the overrides written back to Redis after FLUSHALL", func() bool {
		return rc.HGet(ctx, "tally:api.overrides", "n").Val() == "5"
	})
	t.Logf("restored in %v", time.Since(flushed))
	for i, c := range fleet {
		if l := listOverrides(t, c, "api"); len(l.Overrides) != 5 {
			t.Errorf("instance %d lists %d overrides after FLUSHALL, want 5", i, len(l.Overrides))
		}
		overridesInForce(t, c, fmt.Sprintf("instance %d after FLUSHALL", i))
	}
	// Every instance reads the restored set again (the async ones within
	// their poll): the latest change on "twice" is the one in force.
	for i, c := range fleet {
		waitFor(t, 2*time.Second, fmt.Sprintf("instance %d to admit the key whose latest override is exempt", i), func() bool {
			return admitted(c, withKey("twice"), 5) == 5
		})
	}
	warned := 0
	for _, c := range fleet {
		warned += strings.Count(c.Output(), "Redis lost the zone's overrides: restored")
	}
	if warned != 1 {
		t.Errorf("%d WARN lines say the overrides were restored, want 1", warned)
	}
}

// A reload that moves a zone from local to strict and back keeps its
// overrides in force, and what changed while the zone was strict is what
// it holds back in local mode.
func TestOverridesFollowAZoneAcrossModes(t *testing.T) {
	rs := startRedis(t)
	c := newCaddyInstance(t)
	local := fmt.Sprintf(overrideLocalSite, "both")
	c.Start(c.Caddyfile("", local), "caddyfile")
	putThreeOverrides(t, c)
	overridesInForce(t, c, "local")

	load(t, c, "", distributedSite(rs.Addr, overridesZone, ""))
	if l := listOverrides(t, c, "api"); len(l.Overrides) != 3 || l.View != "fleet" {
		t.Fatalf("after local -> strict: %d overrides, view %q; want 3, fleet", len(l.Overrides), l.View)
	}
	overridesInForce(t, c, "strict")
	if status, body := c.adminDo(http.MethodDelete, "/rate_limit/zones/api/overrides/raise"); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	mustPutOverride(t, c, "api", "raise2", `{"match":{"key":"big"},"events":20,"window":"1m"}`)

	load(t, c, "", local)
	l := listOverrides(t, c, "api")
	var ids []string
	for _, o := range l.Overrides {
		ids = append(ids, o.ID)
	}
	if got := strings.Join(ids, ","); got != "free,raise2,shut" || l.View != "instance" {
		t.Fatalf("after strict -> local: overrides %s, view %q; want free,raise2,shut, instance", got, l.View)
	}
	overridesInForce(t, c, "local again")
}

// Two overrides of one match: the later change is in force, whatever
// their ids, in a local and a strict zone.
func TestOverrideSameMatchLatestChangeWins(t *testing.T) {
	rs := startRedis(t)
	for _, mode := range []string{"local", "strict"} {
		t.Run(mode, func(t *testing.T) {
			site := fmt.Sprintf(overrideLocalSite, "both")
			if mode == "strict" {
				site = distributedSite(rs.Addr, overridesZone, "")
			}
			c := startCaddy(t, site)
			k := withKey("twice-" + mode)
			mustPutOverride(t, c, "api", "b-raise", `{"match":{"key":"twice-`+mode+`"},"exempt":true}`)
			mustPutOverride(t, c, "api", "a-deny", `{"match":{"key":"twice-`+mode+`"},"deny":true}`)
			untilOverrides(t, c, "api", 2, 2*time.Second)
			if res := c.Do(k); res.Status != http.StatusTooManyRequests {
				t.Errorf("the deny set after the exempt: %d, want 429", res.Status)
			}
			mustPutOverride(t, c, "api", "b-raise", `{"match":{"key":"twice-`+mode+`"},"exempt":true}`)
			if n := admitted(c, k, 5); n != 5 {
				t.Errorf("the exempt set again after the deny: %d of 5 admitted", n)
			}
		})
	}
}
