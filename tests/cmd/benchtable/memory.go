package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// rssKeys is how many distinct keys the memory scenario sends: the
// default max_keys, so the table is at its largest.
const rssKeys = 1_000_000

// rssKey is request i's key: 16 bytes, distinct for every request.
func rssKey(i int64) string { return fmt.Sprintf("rss-%012d", i) }

// rssRoutes is a zone whose keys stay in the table for the whole run:
// events 10 per hour, so one request leaves its key in force for 6 minutes.
func rssRoutes(*env) string {
	return `	handle /rss {
		rate_limit {
			zone rss {
				key {http.request.header.X-Key}
				events 10
				window 1h
			}
		}
		respond "ok" 200
	}
	handle /rss-warm {
		rate_limit {
			zone rss_warm {
				key {http.request.header.X-Key}
				events 10
				window 1h
			}
		}
		respond "ok" 200
	}
`
}

// measureRSSPerKey sends 1M requests with distinct keys to a Caddy that had
// already served 100k of its own (so that its buffers, goroutines and GC
// pacing are warm) and reports how much its resident set grew per key.
func measureRSSPerKey(o options, _ *env, c *caddyProcess) (customResult, error) {
	warm := load{addr: c.addr, path: "/rss-warm", key: cycleKeys, conns: o.conns, runFor: time.Hour, maxRequests: 100_000}
	if _, err := warm.run(); err != nil {
		return customResult{}, fmt.Errorf("warm-up: %v", err)
	}
	before, err := c.rss()
	if err != nil {
		return customResult{}, err
	}
	r, err := load{addr: c.addr, path: "/rss", key: rssKey, conns: o.conns, runFor: time.Hour, maxRequests: rssKeys}.run()
	if err == nil {
		err = checkStatuses(r, route{path: "/rss", status: 200})
	}
	if err != nil {
		return customResult{}, fmt.Errorf("load: %v", err)
	}
	after, err := c.rss()
	if err != nil {
		return customResult{}, err
	}
	keys := r.byStatus[200]
	v := float64(after-before) / float64(keys)
	return customResult{value: v, text: fmt.Sprintf("**%.0f B/key** (RSS %d → %d MiB over %d new keys of 16 B, at %.0f req/s)",
		v, before>>20, after>>20, keys, r.rate(200))}, nil
}

// rss is the resident set of Caddy's process, from /proc.
func (p *caddyProcess) rss() (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.cmd.Process.Pid)
}
