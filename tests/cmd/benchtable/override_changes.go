package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The cost of override changes at 10,000 overrides: Redis CPU per change,
// and strict requests' p99 while a change lands every 250 ms against none,
// in the same run (phases alternated).

func init() {
	scenarios = append(scenarios, scenario{
		name: "override-change-cost",
		metric: "A strict zone holding 10,000 overrides, 2 instances, one redis-server, timeout 500ms: Redis CPU per override change (INFO commandstats, no requests, " +
			"less the same time without changes), and request p99 with a change every 250 ms vs none (ratio; phases alternated, 4 of each)",
		setup: startRedisServer,
		standalone: func(_ options, e *env, bin string) (customResult, error) {
			return measureOverrideChanges(e, bin)
		},
		target:     1.1,
		targetText: "p99 with changes ≤ 1.1 × without",
		comparison: "the whole-hash design: an 18 ms script and a ~1.3 MB HGETALL per instance per change, p99 6.9 → 33.7 ms",
	})
}

func measureOverrideChanges(e *env, bin string) (customResult, error) {
	addr := e.values["redis"]
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	ctx := context.Background()
	pipe := rc.Pipeline()
	for i := range 10_000 {
		pipe.HSet(ctx, "tally:api.overrides", fmt.Sprint("o:o", i),
			fmt.Sprintf(`0|1|{"id":"o%d","match":{"prefix":"t%05d-"},"exempt":true,"set_by":"bench","set_at":"2026-01-01T00:00:00Z"}`, i, i))
	}
	pipe.HSet(ctx, "tally:api.overrides", "e", 1, "v", 1, "n", 10_000)
	pipe.Expire(ctx, "tally:api.overrides", time.Hour)
	if _, err := pipe.Exec(ctx); err != nil {
		return customResult{}, err
	}
	routes := `	rate_limit {
		zone api {
			key {http.request.header.X-Key}
			events 1000000
			window 1s
		}
		distributed {
			redis redis://` + addr + `
			timeout 500ms
		}
	}
	respond "ok" 200
`
	fleet := make([]*caddyProcess, 2)
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
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	change := func(i int) error {
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://%s/rate_limit/zones/api/overrides/o%d", fleet[i%2].adminAddr, i%10_000),
			strings.NewReader(fmt.Sprintf(`{"match":{"prefix":"t%05d-"},"events":%d,"window":"1m"}`, i%10_000, 10+i%50)))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("PUT: %d %s", resp.StatusCode, body)
		}
		return nil
	}
	// Every instance has read the 10,000 before the first phase.
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range fleet {
		for {
			resp, err := client.Get("http://" + c.adminAddr + "/rate_limit/zones/api/overrides/o9999")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return customResult{}, fmt.Errorf("%s did not read the 10,000 overrides within 30s", c.addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Redis CPU per change, with no requests: 10 s with a change every
	// 250 ms less 10 s without (the instances' polls and heartbeats).
	const quietChanges = 40
	redisUsecOver := func(changes bool) (int64, error) {
		if err := rc.ConfigResetStat(ctx).Err(); err != nil {
			return 0, err
		}
		for i := range quietChanges {
			if changes {
				if err := change(i); err != nil {
					return 0, err
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
		return redisCommandUsec(rc)
	}
	idle, err := redisUsecOver(false)
	if err != nil {
		return customResult{}, err
	}
	changing, err := redisUsecOver(true)
	if err != nil {
		return customResult{}, err
	}
	perChange := float64(changing-idle) / quietChanges

	const phase = 4 * time.Second
	var quiet, busy []time.Duration
	var made, failed int
	for round := range 8 {
		withChanges := round%2 == 1
		stop := make(chan struct{})
		var changes sync.WaitGroup
		if withChanges {
			changes.Go(func() {
				tick := time.NewTicker(250 * time.Millisecond)
				defer tick.Stop()
				for i := quietChanges + round*100; ; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					made++
					if change(i) != nil {
						failed++ // a store outage (the breaker open on a busy machine): counted
					}
				}
			})
		}
		lat, err := loadFor(client, fleet, phase)
		close(stop)
		changes.Wait()
		if err != nil {
			return customResult{}, err
		}
		if withChanges {
			busy = append(busy, lat...)
		} else {
			quiet = append(quiet, lat...)
		}
	}
	p99 := func(l []time.Duration) time.Duration { slices.Sort(l); return l[len(l)*99/100] }
	pq, pb := p99(quiet), p99(busy)
	ratio := float64(pb) / float64(pq)
	return customResult{value: ratio, text: fmt.Sprintf("Redis **%.0f µs per change** (its script and both instances reading it back); request **p99 %v with a change every 250 ms vs %v without (%.2f×)**, %d and %d requests, %d changes (%d refused by a store outage)",
		perChange, pb.Round(10*time.Microsecond), pq.Round(10*time.Microsecond), ratio, len(busy), len(quiet), made, failed)}, nil
}

// loadFor sends requests of cycling keys from 8 workers across fleet for d
// and returns their latencies.
func loadFor(client *http.Client, fleet []*caddyProcess, d time.Duration) ([]time.Duration, error) {
	var mu sync.Mutex
	var all []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for w := range 8 {
		wg.Go(func() {
			var lat []time.Duration
			for i := 0; time.Now().Before(end); i++ {
				req, _ := http.NewRequest(http.MethodGet, "http://"+fleet[(w+i)%len(fleet)].addr+"/", nil)
				req.Header.Set("X-Key", "k"+strconv.Itoa(w*100_000+i%1000))
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat = append(lat, time.Since(start))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, firstErr
}

// redisCommandUsec is the Redis CPU of every command since the last CONFIG
// RESETSTAT, in µs (INFO commandstats).
func redisCommandUsec(rc *redis.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var usec int64
	for line := range strings.SplitSeq(info, "\n") {
		_, rest, ok := strings.Cut(strings.TrimSpace(line), "usec=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unparsable commandstats line %q", line)
		}
		usec += v
	}
	return usec, nil
}
