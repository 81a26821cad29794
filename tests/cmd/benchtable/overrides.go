package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// overrideScenarios measure runtime overrides on the request path.
var overrideScenarios = []scenario{
	{
		// 10,000 prefix overrides of 5 lengths, none of which matches a
		// request's key: each request looks up one map per length.
		name:   "override-prefixes",
		metric: "A zone with 10,000 prefix overrides (5 prefix lengths, none matching), every request allowed, 100k keys (ratio to the same zone without overrides), Caddy CPU per request",
		routes: func(*env) string {
			return limited("/allowed", manyZone, "/overridden", strings.Replace(manyZone, "zone many", "zone many_overridden", 1))
		},
		baseline:  route{path: "/allowed", key: cycleKeys, status: 200},
		candidate: route{path: "/overridden", key: cycleKeys, status: 200},
		warmup: func(e *env, c *caddyProcess) error {
			if err := putPrefixOverrides(c, "many_overridden", 10_000); err != nil {
				return err
			}
			if err := warmManyKeys(e, c); err != nil {
				return err
			}
			return warmManyKeysAt(c, "/overridden")
		},
		target:     0.97,
		byCPU:      true,
		comparison: "the same zone without overrides",
	},
	{
		// The same Caddyfile on the working tree's Caddy and on one built
		// from -baseline-ref (default: a tally without runtime overrides): what
		// a zone with no override pays for them on every request, one
		// atomic load of its empty override set. Each round loads both
		// Caddies at once: run one after the other, two processes' CPU per
		// request differed by up to 45% a round on a busy 2-core machine
		// with the same binary on both sides; at once, by 5%.
		name:   "override-none-vs-baseline",
		metric: "A zone with no override vs the same zone in a Caddy without runtime overrides (built from `-baseline-ref`, same Caddyfile, both loaded at once), every request allowed, 100k keys, Caddy CPU per request",
		routes: func(*env) string { return limited("/allowed", manyZone) },
		baselineBinary: func(o options, e *env) (string, string, error) {
			bin, commit, err := buildBaselineCaddy(o, e)
			if err != nil {
				return "", "", err
			}
			if o.baselineRef == defaultBaselineRef {
				return bin, "the same zone in a Caddy without runtime overrides (`-baseline-ref " + o.baselineRef + "`)", nil
			}
			return bin, "the same zone on tally at " + o.baselineRef + " (commit " + commit + ")", nil
		},
		baseline:     route{path: "/allowed", key: cycleKeys, status: 200},
		candidate:    route{path: "/allowed", key: cycleKeys, status: 200},
		warmup:       warmManyKeys,
		simultaneous: true,
		target:       0.99,
		byCPU:        true,
		comparison:   "the same zone on tally before runtime overrides",
	},
	propagationRow("override-propagation-strict", "strict"),
	propagationRow("override-propagation-async", "async"),
}

func init() { scenarios = append(scenarios, overrideScenarios...) }

// propagationChanges is how many override changes a propagation row times.
const propagationChanges = 100

// propagationRow times, over 100 changes of one override PUT on the first
// of 3 instances sharing one redis-server in mode, how long until the
// other two enforce it (their admin API shows the new limit).
func propagationRow(name, mode string) scenario {
	return scenario{
		name:   name,
		metric: fmt.Sprintf("Time for an override change PUT on one of 3 instances (%s mode, one redis-server) to reach the other two, p99 over %d changes", mode, propagationChanges),
		setup:  startRedisServer,
		standalone: func(_ options, e *env, bin string) (customResult, error) {
			return measurePropagation(e, bin, mode)
		},
		target:     1,
		targetText: "p99 ≤ 1 s",
		comparison: "HAProxy `set table`: one instance only; Kong consumer groups: through its database",
	}
}

func measurePropagation(e *env, bin, mode string) (customResult, error) {
	extra := ""
	if mode == "async" {
		extra = "\t\t\tmode async\n\t\t\tsync_interval 100ms\n"
	}
	routes := `	rate_limit {
		zone api {
			key {http.request.header.X-Key}
			events 5
			window 1m
		}
		distributed {
			redis redis://` + e.values["redis"] + `
` + extra + `		}
	}
	respond "ok" 200
`
	fleet := make([]*caddyProcess, 3)
	for i := range fleet {
		dir := filepath.Join(e.dir, fmt.Sprint("caddy", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return customResult{}, err
		}
		c, err := startCaddy(bin, dir, routes)
		if err != nil {
			return customResult{}, err
		}
		defer c.stop()
		fleet[i] = c
	}
	client := &http.Client{Timeout: 5 * time.Second}
	var took []time.Duration
	for i := range propagationChanges {
		events := 10 + i
		req, _ := http.NewRequest(http.MethodPut, "http://"+fleet[0].adminAddr+"/rate_limit/zones/api/overrides/vip",
			strings.NewReader(fmt.Sprintf(`{"match":{"key":"vip"},"events":%d,"window":"1m"}`, events)))
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return customResult{}, err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return customResult{}, fmt.Errorf("PUT: %d", resp.StatusCode)
		}
		want := fmt.Sprintf(`"events":%d,`, events)
		var slowest time.Duration
		for _, c := range fleet[1:] {
			for {
				resp, err := client.Get("http://" + c.adminAddr + "/rate_limit/zones/api/overrides/vip")
				if err != nil {
					return customResult{}, err
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(body), want) {
					break
				}
				if time.Since(start) > 10*time.Second {
					return customResult{}, fmt.Errorf("change %d not seen on %s within 10s", i, c.addr)
				}
				time.Sleep(2 * time.Millisecond)
			}
			slowest = max(slowest, time.Since(start))
		}
		took = append(took, slowest)
	}
	slices.Sort(took)
	p50, p99 := took[len(took)/2], took[len(took)*99/100]
	return customResult{value: p99.Seconds(), text: fmt.Sprintf("**p99 %v** (median %v, longest %v) over %d changes, polling the other instances' admin API every 2 ms",
		p99.Round(time.Millisecond), p50.Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), len(took))}, nil
}

// putPrefixOverrides sets n prefix overrides ("p<i>-", exempt) on zone
// through c's admin API.
func putPrefixOverrides(c *caddyProcess, zone string, n int) error {
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range n {
		req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("http://%s/rate_limit/zones/%s/overrides/o%d", c.adminAddr, zone, i),
			strings.NewReader(fmt.Sprintf(`{"match":{"prefix":"p%d-"},"exempt":true}`, i)))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("PUT override %d: %d %s", i, resp.StatusCode, body)
		}
	}
	return nil
}
