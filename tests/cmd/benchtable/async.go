package main

// The async-mode scenarios: throughput of a zone in async mode as a ratio of
// the same zone in local mode, and the overshoot of three Caddy instances in
// async mode sharing one redis-server under a burst for one key.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// asyncKeys is how many distinct keys scenario "async-allowed" cycles
// through. Async mode syncs one script per active key every sync_interval:
// 1,000 keys at 100ms are at most 10,000 scripts a second, two pipelines
// per sync, which one redis-server absorbs beside Caddy and the load
// generator on two cores.
const asyncKeys = 1_000

func asyncCycleKeys(i int64) string { return manyKeyValues[i%asyncKeys] }

// asyncAllowedRoutes are the same zone in local mode (/local) and in async
// mode (/async) on the redis-server of the scenario's setup. fail_policy
// closed makes a decision async mode could not make (its view of Redis gone
// stale: syncs falling behind) a 429, which the run does not count as
// allowed. The distributed block is the default one a user would write.
func asyncAllowedRoutes(e *env) string {
	return `	handle /local {
		rate_limit {
			zone local_async_many {
				key {http.request.header.X-Key}
				events 1000
				window 1s
			}
		}
		respond "ok" 200
	}
	handle /async {
		rate_limit {
			zone async_many {
				key {http.request.header.X-Key}
				events 1000
				window 1s
				fail_policy closed
			}
			distributed {
				redis redis://` + e.values["redis"] + `
				mode async
				sync_interval 100ms
			}
		}
		respond "ok" 200
	}
`
}

// warmAsyncKeys sends one request for each of the async keys to both routes,
// then waits for a few syncs, so that the measured runs start with every key
// tracked and synced.
func warmAsyncKeys(_ *env, c *caddyProcess) error {
	for _, path := range []string{"/local", "/async"} {
		r, err := load{addr: c.addr, path: path, key: func(i int64) string { return manyKeyValues[i] },
			conns: 16, runFor: 20 * time.Second, maxRequests: asyncKeys}.run()
		if err == nil {
			err = checkStatuses(r, route{path: path, status: 200})
		}
		if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	return nil
}

// The overshoot scenario's zone, fleet and burst.
const (
	overshootZone      = "async_overshoot"
	overshootEvents    = 100
	overshootWindow    = time.Hour
	overshootInterval  = 100 * time.Millisecond
	overshootInstances = 3
	overshootRequests  = 900
	overshootWorkers   = 48
	overshootKey       = "overshoot-key-0001"
)

func asyncOvershootRoutes(e *env) string {
	return fmt.Sprintf(`	handle /burst {
		rate_limit {
			zone %s {
				key {http.request.header.X-Key}
				events %d
				window %s
			}
			distributed {
				redis redis://%s
				mode async
				sync_interval %s
			}
		}
		respond "ok" 200
	}
`, overshootZone, overshootEvents, overshootWindow, e.values["redis"], overshootInterval)
}

// measureAsyncOvershoot starts two more Caddy instances beside c with the
// same routes, waits until each counts three instances through the
// heartbeat, then sends a burst of concurrent requests for one key spread
// round-robin across the three and counts the 200s. Afterwards it asks each
// instance once more until all three deny (every one has synced the spent
// budget), counting any further 200. The row is met when the burst's 200s
// are within 10% of the limit and, with those after it, within docs/async.md's
// bound.
func measureAsyncOvershoot(_ options, e *env, c *caddyProcess) (customResult, error) {
	fleet := []*caddyProcess{c}
	defer func() {
		for _, p := range fleet[1:] {
			p.stop()
		}
	}()
	for i := 2; i <= overshootInstances; i++ {
		p, err := startCaddy(c.cmd.Path, filepath.Join(e.dir, fmt.Sprintf("instance-%d", i)), asyncOvershootRoutes(e))
		if err != nil {
			return customResult{}, fmt.Errorf("starting instance %d: %v", i, err)
		}
		fleet = append(fleet, p)
	}
	for _, p := range fleet {
		if err := waitForInstances(p, overshootZone, overshootInstances, 15*time.Second); err != nil {
			return customResult{}, err
		}
	}

	counts, elapsed, err := burstAcross(fleet, "/burst", overshootKey, overshootRequests, overshootWorkers, 30*time.Second)
	if err != nil {
		return customResult{}, fmt.Errorf("burst: %v", err)
	}
	if counts[200]+counts[429] != overshootRequests {
		return customResult{}, fmt.Errorf("burst: responses other than 200 and 429:%s", statusSummary(counts))
	}
	allowed := counts[200]

	// Until every instance denies the key, bounded in rounds and time.
	after, settled := int64(0), false
	deadline := time.Now().Add(10 * time.Second)
	for round := 0; round < 100 && time.Now().Before(deadline) && !settled; round++ {
		settled = true
		for _, p := range fleet {
			status, err := get(p.addr, "/burst", overshootKey)
			if err != nil {
				return customResult{}, fmt.Errorf("after the burst: %v", err)
			}
			if status != 429 {
				settled = false
				if status == 200 {
					after++
				}
			}
		}
		if !settled {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !settled {
		return customResult{}, fmt.Errorf("after the burst: the instances still allowed %s 10s later", overshootKey)
	}

	// docs/async.md's bound: B + ⌊(d + I)/T⌋, d the burst's duration. The
	// fresh-share term (N−1)·max(1, ⌊B/N⌋) is for instances that first see
	// a key after another spent it; here the burst's first requests reach
	// all three at once, so it does not apply.
	limit := zones.Config{Events: overshootEvents, Window: overshootWindow}.Limit()
	bound := limit.Burst + int64(elapsed+overshootInterval)/limit.EmissionInterval
	overshoot := allowed - overshootEvents
	total := allowed + after
	met := allowed >= overshootEvents*9/10 && allowed <= overshootEvents*11/10 && allowed <= bound && total <= bound
	text := fmt.Sprintf("**%d allowed** of %d concurrent requests for one key over %d instances (round-robin, %d workers, in %v); "+
		"limit %d; overshoot %+d (%+.1f%%); bound B + ⌊(d+I)/T⌋ = %d + ⌊(%v + %v)/%v⌋ = **%d**; "+
		"%d more allowed after the burst until all %d instances denied",
		allowed, overshootRequests, overshootInstances, overshootWorkers, elapsed.Round(time.Millisecond),
		overshootEvents, overshoot, float64(overshoot)*100/overshootEvents,
		limit.Burst, elapsed.Round(time.Millisecond), overshootInterval, time.Duration(limit.EmissionInterval), bound,
		after, overshootInstances)
	return customResult{value: float64(allowed), text: text, met: &met}, nil
}

// waitForInstances waits until p's admin GET /rate_limit/zones shows the
// zone's store with the given number of live instances.
func waitForInstances(p *caddyProcess, zone string, want int, within time.Duration) error {
	client := http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(within)
	last := "no answer"
	for {
		var list []struct {
			Name  string `json:"name"`
			Mode  string `json:"mode"`
			Store *struct {
				OK        bool `json:"ok"`
				Instances int  `json:"instances"`
			} `json:"store"`
		}
		resp, err := client.Get("http://" + p.adminAddr + "/rate_limit/zones")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
		}
		if err != nil {
			last = err.Error()
		}
		for _, z := range list {
			if z.Name != zone {
				continue
			}
			if z.Mode != "async" || z.Store == nil {
				return fmt.Errorf("zone %s on %s: mode %q, want async with a store", zone, p.adminAddr, z.Mode)
			}
			if z.Store.OK && z.Store.Instances == want {
				return nil
			}
			last = fmt.Sprintf("store ok %v, instances %d", z.Store.OK, z.Store.Instances)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zone %s on %s did not show %d instances within %v: %s", zone, p.adminAddr, want, within, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// burstAcross sends n requests for one key with the given number of
// concurrent workers, request i to fleet[i%len(fleet)], and returns the
// statuses and how long the burst took. Each request times out after 10s and
// the burst stops issuing after maxTime.
func burstAcross(fleet []*caddyProcess, path, key string, n, workers int, maxTime time.Duration) (map[int]int64, time.Duration, error) {
	for _, p := range fleet {
		if !isLoopback(p.addr) {
			return nil, 0, fmt.Errorf("refusing to load %q: only 127.0.0.1 is allowed", p.addr)
		}
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: workers, DisableCompression: true},
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), maxTime)
	defer cancel()
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[int]int64{}
		errs   []string
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				status, err := doGet(ctx, client, fleet[i%int64(len(fleet))].addr, path, key)
				mu.Lock()
				if err != nil {
					errs = append(errs, err.Error())
				} else {
					counts[status]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		return counts, elapsed, fmt.Errorf("%d requests failed, first: %s", len(errs), errs[0])
	}
	return counts, elapsed, nil
}

// get sends one request with the given X-Key to a loopback Caddy.
func get(addr, path, key string) (int, error) {
	if !isLoopback(addr) {
		return 0, fmt.Errorf("refusing to load %q: only 127.0.0.1 is allowed", addr)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	return doGet(context.Background(), client, addr, path, key)
}

func doGet(ctx context.Context, client *http.Client, addr, path, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// The many-keys scenario: what async mode costs Redis for many keys each
// far below its limit. Caddy's load generator on a 2-core machine reaches
// about 17k requests/s, which visits 100,000 keys once every 6s, far less
// often than a lease lifetime: the keys would be quiet ones, not active. So
// the scenario drives an async store directly, in this process, with the
// traffic of 100,000 active keys: each decided twice a second.
const (
	manyActiveKeys   = 100_000
	manyKeysEvery    = 500 * time.Millisecond // each key is decided once per this
	manyKeysEvents   = 100                    // per second, burst 100: 2/s is far below it
	manyKeysInterval = 100 * time.Millisecond // sync_interval
	manyKeysWarm     = 4 * time.Second        // every key synced, leases taken and renewed once
	manyKeysMeasure  = 10 * time.Second
	manyKeysWorkers  = 4
)

func asyncManyKeysRoutes(e *env) string {
	return "\thandle /unused {\n\t\trespond \"ok\" 200\n\t}\n"
}

// measureAsyncManyKeys opens an async store on the scenario's redis-server,
// decides each of manyActiveKeys keys every manyKeysEvery, and after a
// warm-up measures, for manyKeysMeasure, the script calls Redis ran per
// second (INFO commandstats EVALSHA+EVAL, heartbeats excluded: the only
// script calling ZCARD) and the CPU it used (INFO cpu, used_cpu_sys +
// used_cpu_user, per second of wall time).
func measureAsyncManyKeys(_ options, e *env, _ *caddyProcess) (customResult, error) {
	addr := e.values["redis"]
	a, err := distributed.OpenAsync(distributed.Options{Addresses: []string{addr}, Mode: "async",
		SyncInterval: manyKeysInterval, Timeout: 250 * time.Millisecond}, nil)
	if err != nil {
		return customResult{}, err
	}
	defer a.Close()
	limit := zones.Config{Events: manyKeysEvents, Window: time.Second}.Limit()
	ctx := context.Background()
	var decided, denied, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range manyKeysWorkers {
		wg.Go(func() {
			for round := time.Now(); ; round = round.Add(manyKeysEvery) {
				for i := w; i < manyActiveKeys; i += manyKeysWorkers {
					rep, err := a.Rate(ctx, "many", manyKeyValues[i], zones.RateStep{Op: zones.OpDecide, Limit: limit, Cost: 1})
					r := rep.Result
					switch {
					case err != nil:
						failed.Add(1)
					case !r.Allowed:
						denied.Add(1)
					}
				}
				decided.Add(manyActiveKeys / manyKeysWorkers)
				select {
				case <-stop:
					return
				case <-time.After(time.Until(round.Add(manyKeysEvery))):
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(manyKeysWarm)

	// Every key a sync reports is one HMGET in async.lua (the only
	// caller of HMGET): keys reported per second.
	commands := []string{"evalsha", "eval", "zcard", "hmget"}
	calls0, err := redisCommandCalls(addr, commands...)
	if err != nil {
		return customResult{}, err
	}
	cpu0, err := redisCPU(addr)
	if err != nil {
		return customResult{}, err
	}
	decided0, denied0, failed0 := decided.Load(), denied.Load(), failed.Load()
	start := time.Now()
	time.Sleep(manyKeysMeasure)
	calls1, err := redisCommandCalls(addr, commands...)
	if err != nil {
		return customResult{}, err
	}
	cpu1, err := redisCPU(addr)
	if err != nil {
		return customResult{}, err
	}
	wall := time.Since(start).Seconds()
	scripts := calls1["evalsha"] + calls1["eval"] - calls0["evalsha"] - calls0["eval"] - (calls1["zcard"] - calls0["zcard"])
	perSec := float64(scripts) / wall
	cores := (cpu1 - cpu0) / wall
	keys := float64(calls1["hmget"]-calls0["hmget"]) / wall
	dec, den, fail := decided.Load()-decided0, denied.Load()-denied0, failed.Load()-failed0
	met := perSec <= 10_000 && cores <= 0.5 && den == 0 && fail == 0
	text := fmt.Sprintf("**%.0f script calls/s**, Redis CPU **%.2f core** (%d keys, each decided every %v against %d/s; "+
		"%.0f keys reported/s, %.1f µs of Redis CPU per key reported; %.0f decisions/s, %d denied, %d failed; "+
		"store driven in-process: Caddy's load generator cannot keep 100k keys active here)",
		perSec, cores, manyActiveKeys, manyKeysEvery, manyKeysEvents, keys, (cpu1-cpu0)*1e6/max(1, keys*wall),
		float64(dec)/wall, den, fail)
	return customResult{value: perSec, text: text, met: &met}, nil
}

// redisCPU is the CPU time redis-server has used, in seconds (INFO cpu:
// used_cpu_sys + used_cpu_user).
func redisCPU(addr string) (float64, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := client.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("unparsable INFO cpu line %q", line)
		}
		total += f
	}
	return total, nil
}
