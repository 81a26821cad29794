package main

// Concurrency zones (issue 11): their cost on a route whose limit is never
// reached, locally and in Redis, and the Redis calls a request costs.

import (
	"fmt"
	"strconv"
	"time"
)

func init() {
	scenarios = append(scenarios,
		scenario{
			name:   "concurrency-allowed",
			metric: "Caddy throughput with a local concurrency zone (concurrency 1000, never reached), 100k keys (ratio to the same route without rate_limit)",
			routes: func(*env) string {
				return limited("/concurrency", `		zone uploads {
			key {http.request.header.X-Key}
			concurrency 1000
		}
`)
			},
			baseline:   route{path: "/plain", key: cycleKeys, status: 200},
			candidate:  route{path: "/concurrency", key: cycleKeys, status: 200},
			target:     0.95,
			byCPU:      true,
			comparison: "a per-key counter taken before next and released after",
		},
		scenario{
			name:       "concurrency-strict-allowed",
			metric:     "Caddy throughput with a distributed concurrency zone (redis-server on loopback, timeout 1s), limit never reached, 100k keys (ratio to the same zone in local mode)",
			setup:      startRedisServer,
			routes:     concurrencyRoutes,
			baseline:   route{path: "/concurrency-local", key: cycleKeys, status: 200},
			candidate:  route{path: "/concurrency-redis", key: cycleKeys, status: 200},
			target:     0.5,
			comparison: "one script on the request path; the release (ZREM) is pipelined in the background",
		},
		scenario{
			name:       "concurrency-redis-calls",
			metric:     "Redis calls per request of a distributed concurrency zone (INFO commandstats EVALSHA+EVAL+ZREM per 200; heartbeats, ~1/s, included)",
			setup:      startRedisServer,
			routes:     concurrencyRoutes,
			custom:     measureConcurrencyRedisCalls,
			target:     2.05,
			targetText: "2 (acquire + release)",
			comparison: "acquire: one script; release: one ZREM, batched with other releases in a pipeline",
		},
	)
}

// concurrencyRoutes are the same concurrency zone locally and in Redis;
// fail_policy closed makes an acquisition Redis did not answer in time a 429,
// which the runs do not count. The timeout is 1s rather than 20ms so that
// the row measures what a slot in Redis costs, not how many round trips a
// loaded 2-core machine completes within 20ms.
func concurrencyRoutes(e *env) string {
	return `	handle /concurrency-local {
		rate_limit {
			zone uploads_local {
				key {http.request.header.X-Key}
				concurrency 1000
			}
		}
		respond "ok" 200
	}
	handle /concurrency-redis {
		rate_limit {
			zone uploads_redis {
				key {http.request.header.X-Key}
				concurrency 1000
				fail_policy closed
			}
			distributed {
				redis redis://` + e.values["redis"] + `
				timeout 1s
			}
		}
		respond "ok" 200
	}
`
}

// measureConcurrencyRedisCalls loads the distributed route for one run and
// counts the scripts and ZREMs Redis received per allowed request. Releases
// are sent after the response, so the count is read once they have all
// arrived (the ZREM count stops moving).
func measureConcurrencyRedisCalls(o options, e *env, c *caddyProcess) (customResult, error) {
	addr := e.values["redis"]
	commands := []string{"evalsha", "eval", "zrem"}
	before, err := redisCommandCalls(addr, commands...)
	if err != nil {
		return customResult{}, err
	}
	r, err := load{addr: c.addr, path: "/concurrency-redis", key: cycleKeys, conns: o.conns, runFor: o.runFor, maxRequests: o.maxRequests}.run()
	if err != nil {
		return customResult{}, fmt.Errorf("load: %v", err)
	}
	var after map[string]int64
	for last := int64(-1); ; {
		if after, err = redisCommandCalls(addr, commands...); err != nil {
			return customResult{}, err
		}
		if after["zrem"] == last {
			break
		}
		last = after["zrem"]
		time.Sleep(200 * time.Millisecond)
	}
	scripts := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]
	zrem := after["zrem"] - before["zrem"]
	allowed := r.byStatus[200]
	if allowed == 0 {
		return customResult{}, fmt.Errorf("no request allowed:%s", statusSummary(r.byStatus))
	}
	v := float64(scripts+zrem) / float64(allowed)
	text := fmt.Sprintf("**%s** (%d scripts + %d ZREM for %d 200s at %.0f/s)",
		strconv.FormatFloat(v, 'f', 2, 64), scripts, zrem, allowed, r.rate(200))
	return customResult{value: v, text: text}, nil
}
