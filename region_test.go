package ratelimit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const globalCaddyfile = `rate_limit {
	zone api {
		key {http.request.header.X-API-Key}
		events 6000
		window 1m
		scope global
	}
	distributed {
		redis redis://10.1.0.5:6379
		mode strict
		region eu
		global {
			redis rediss://global.internal:6380
			regions eu:2 us:1 ap:1
			sync_interval 1s
			lease 5m
		}
	}
}`

func TestCaddyfileGlobalScopeAsWrittenInTheIssue(t *testing.T) {
	h, err := parse(t, globalCaddyfile)
	if err != nil {
		t.Fatal(err)
	}
	if h.RateLimits["api"].Scope != "global" {
		t.Errorf("scope = %q, want global", h.RateLimits["api"].Scope)
	}
	d := h.Distributed
	if d.Region != "eu" || d.Global == nil {
		t.Fatalf("region %q, global %v", d.Region, d.Global)
	}
	g := d.Global
	if g.Redis.Addresses[0] != "rediss://global.internal:6380" || g.Regions["eu"] != 2 || g.Regions["us"] != 1 || g.Regions["ap"] != 1 ||
		time.Duration(g.SyncInterval) != time.Second || time.Duration(g.Lease) != 5*time.Minute {
		t.Errorf("global = %+v", g)
	}
	// The JSON form reads back the same.
	raw, _ := json.Marshal(h)
	var back Handler
	if err := json.Unmarshal(raw, &back); err != nil || back.Distributed.Global.Regions["eu"] != 2 || back.RateLimits["api"].Scope != "global" {
		t.Errorf("JSON round trip: %s (%v)", raw, err)
	}
	opts, err := d.RegionOptions(nil)
	if err != nil || len(opts.Regions) != 3 || opts.Region != "eu" {
		t.Errorf("region options %+v, %v", opts, err)
	}
}

func TestCaddyfileGlobalErrorsNameTheLineAndTheFix(t *testing.T) {
	for _, c := range []struct{ name, from, to, want string }{
		{"region not among regions", "region eu", "region sa", "region sa is not one of global's regions (ap, eu, us): add it, e.g. regions ap eu us sa:1, or fix its name, at Testfile:11"},
		{"weight zero", "eu:2", "eu:0", "the weight of eu must be a positive whole number"},
		{"weight not a number", "eu:2", "eu:two", "the weight of eu must be a positive whole number"},
		{"not name:weight", "eu:2", "eu", `"eu" is not <name>:<weight>`},
		{"lease under 2 × sync_interval", "lease 5m", "lease 1500ms", "lease 1.5s is shorter than twice sync_interval 1s: a region must outlive two syncs without contact; use lease 2s or more, at Testfile:16"},
		{"global without region", "\t\tregion eu\n", "", "global needs this region's name"},
		{"unknown scope", "scope global", "scope world", "scope must be one of global, region, not \"world\", at Testfile:6"},
		{"scope on a concurrency zone", "events 6000\n\t\twindow 1m\n", "concurrency 3\n", "scope global applies to rate zones"},
		{"unknown global subdirective", "lease 5m", "lease 5m\n\t\t\tfoo 1", `unknown subdirective "foo": expected redis, regions, sync_interval or lease`},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := strings.Replace(globalCaddyfile, c.from, c.to, 1)
			_, err := parse(t, in)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
		})
	}
	in := strings.Replace(globalCaddyfile, "\t\tglobal {\n\t\t\tredis rediss://global.internal:6380\n\t\t\tregions eu:2 us:1 ap:1\n\t\t\tsync_interval 1s\n\t\t\tlease 5m\n\t\t}\n", "", 1)
	in = strings.Replace(in, "\t\tregion eu\n", "", 1)
	_, err := parse(t, in)
	if want := "zone api: scope global needs a global block in distributed"; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Testfile:6") {
		t.Errorf("scope global without a global block: %v, want %q at Testfile:6", err, want)
	}
	in = strings.Replace(globalCaddyfile, "\t\tglobal {\n\t\t\tredis rediss://global.internal:6380\n\t\t\tregions eu:2 us:1 ap:1\n\t\t\tsync_interval 1s\n\t\t\tlease 5m\n\t\t}\n", "", 1)
	in = strings.Replace(in, "scope global", "scope region", 1)
	if _, err := parse(t, in); err == nil || !strings.Contains(err.Error(), "region only applies with a global block") {
		t.Errorf("region without a global block: %v", err)
	}
}
