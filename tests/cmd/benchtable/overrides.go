package main

import (
	"fmt"
	"io"
	"net/http"
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
}

func init() { scenarios = append(scenarios, overrideScenarios...) }

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
