package main

// Adaptive concurrency zones: their cost on a route whose limit is never
// reached, against a fixed concurrency zone, and the overload they are for
// (an upstream model loaded at three times its capacity) beside no limiter
// and a fixed concurrency zone of the upstream's size.

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddy-tally/ratelimit/tests/internal/upstreammodel"
)

func init() {
	scenarios = append(scenarios,
		scenario{
			name: "adaptive-allowed",
			metric: "Caddy throughput with an adaptive zone (`adaptive { latency 250ms min 4 max 2000 }`, its limit grown past the load's connections, never reached) " +
				"vs a fixed concurrency zone (`concurrency 2000`), one key (ratio of the two rate-limited routes)",
			routes: func(*env) string {
				return limited("/concurrency", `		zone fixed {
			key {http.request.host}
			concurrency 2000
		}
`, "/adaptive", `		zone adaptive {
			key {http.request.host}
			adaptive {
				latency 250ms
				min 4
				max 2000
			}
		}
`)
			},
			baseline:   route{path: "/concurrency", status: 200},
			candidate:  route{path: "/adaptive", status: 200},
			warmup:     growAdaptiveLimit,
			target:     0.97,
			byCPU:      true,
			comparison: "a fixed concurrency zone: a counter taken before next and released after",
		},
		scenario{
			name: "adaptive-overload",
			metric: fmt.Sprintf("Overload at %d× an upstream's capacity (a model on loopback serving C = %d at once in S = %v each and queueing the rest: %.0f req/s), "+
				"20%% signed_in and 80%% anonymous from %d paced clients that wait for their answers, %v measured after %v: "+
				"the adaptive zone (`latency 100ms`, `min 4`, `max 2000`, priority signed_in over anonymous); goodput, p99 of the served and shed, per class",
				overloadFactor, overloadCapacity, overloadService, overloadRate(), overloadWorkers, overloadMeasure, overloadConverge),
			standalone: measureAdaptiveOverload,
			targetText: "adaptive: goodput ≥ 90% of capacity, signed_in ≥ 99% served",
		},
	)
}

// adaptiveWarmConns is the connections of the adaptive-allowed warmup: more
// than a measured run uses (-conns), so that the limit, which grows only
// while in use, ends above what the measured runs ask for.
const adaptiveWarmConns = 256

// growAdaptiveLimit loads /adaptive until one second of it sees only 200s:
// the limit starts at min and doubles each window (the target, 250ms)
// while the demand reaches half of it, so a few seconds suffice.
func growAdaptiveLimit(_ *env, c *caddyProcess) error {
	var last loadResult
	for range 20 {
		r, err := load{addr: c.addr, path: "/adaptive", conns: adaptiveWarmConns, runFor: time.Second, maxRequests: 2_000_000}.run()
		if err != nil {
			return err
		}
		if r.total() > 0 && r.byStatus[200] == r.total() {
			return nil
		}
		last = r
	}
	return fmt.Errorf("the adaptive limit did not grow past %d connections in 20s:%s", adaptiveWarmConns, statusSummary(last.byStatus))
}

// The overload run: the model and load.
const (
	overloadCapacity = 10                    // C: requests the model serves at once
	overloadService  = 90 * time.Millisecond // S: each one's service time
	overloadFactor   = 3                     // the load, in multiples of C/S
	// overloadWorkers bounds the requests the load has in flight: far
	// more than a limited route holds (C or so admitted, the shed answered
	// at once), so the offered load holds there; without a limiter the
	// model's queue grows until every worker waits.
	overloadWorkers  = 400
	overloadConverge = 5 * time.Second
	overloadMeasure  = 10 * time.Second
)

// overloadRate is the model's capacity, C/S requests per second.
func overloadRate() float64 { return overloadCapacity / overloadService.Seconds() }

// overloadConfigs are the three routes of the overload run, each in front
// of its own model: no limiter, a fixed concurrency zone of n = C, and the
// adaptive zone.
var overloadConfigs = []struct{ path, label, zone string }{
	{"/none", "no limiter", ""},
	{"/fixed", fmt.Sprintf("a fixed concurrency zone `concurrency %d`", overloadCapacity), fmt.Sprintf(`			zone fixed {
				key {http.request.host}
				concurrency %d
			}
`, overloadCapacity)},
	{"/adaptive", "adaptive", `			zone backend {
				key {http.request.host}
				adaptive {
					latency 100ms
					min 4
					max 2000
				}
				priority {http.request.header.X-Class} signed_in anonymous
			}
`},
}

// measureAdaptiveOverload starts one model per config and a Caddy with a
// route in front of each, then loads the routes one after another: the
// adaptive one is the row's figure, the other two its comparison.
func measureAdaptiveOverload(o options, e *env, bin string) (customResult, error) {
	var routes string
	models := make([]*upstreammodel.Server, len(overloadConfigs))
	for i, cfg := range overloadConfigs {
		models[i] = upstreammodel.Start(overloadCapacity, overloadService)
		defer models[i].Close()
		routes += "\thandle " + cfg.path + " {\n"
		if cfg.zone != "" {
			routes += "\t\trate_limit {\n" + cfg.zone + "\t\t}\n"
		}
		routes += "\t\treverse_proxy " + models[i].Addr + "\n\t}\n"
	}
	c, err := startCaddy(bin, e.dir, routes)
	if err != nil {
		return customResult{}, err
	}
	defer c.stop()

	measureFor := max(overloadMeasure, o.runFor)
	var results []overloadResult
	for i, cfg := range overloadConfigs {
		progressf("  adaptive-overload: %s (%s), %v", cfg.path, cfg.label, overloadConverge+measureFor)
		r := runOverload("http://"+c.addr+cfg.path, models[i], measureFor)
		progressf("  adaptive-overload: %s: %s", cfg.path, r)
		results = append(results, r)
	}
	a := results[len(results)-1]
	goodput := a.goodput / overloadRate()
	signedServed := a.served(0)
	met := goodput >= 0.9 && signedServed >= 0.99
	text := "adaptive: " + a.format("**")
	var others []string
	for i, r := range results[:len(results)-1] {
		others = append(others, overloadConfigs[i].label+": "+r.format(""))
	}
	return customResult{value: goodput, text: text, met: &met, comparison: strings.Join(others, "; ")}, nil
}

// shot is one request of the overload load.
type shot struct {
	sent, done time.Time
	signed     bool
	status     int // 0: no answer (a transport error)
}

// overloadResult sums up the requests of one config sent in the measured
// window.
type overloadResult struct {
	upstreammodel.Tally         // by class: 0 signed_in, 1 anonymous
	goodput             float64 // 200s answered in the window, per second
	dropped             int     // paced sends that found every worker waiting
	seconds             float64
	modelMean           float64 // the model's requests in flight, sampled every 10ms
	modelMax            int64
}

func (r overloadResult) served(class int) float64 {
	if r.Sent[class] == 0 {
		return 0
	}
	return float64(r.Served[class]) / float64(r.Sent[class])
}

// shed is class's requests shed (503) or refused (429).
func (r overloadResult) shed(class int) int { return r.Shed[class] + r.Refused[class] }

func (r overloadResult) String() string { return r.format("") }

// format sums the result up, the figures the row is met by (the goodput
// and the signed_in served) between the marks.
func (r overloadResult) format(mark string) string {
	class := func(name string, c int) string {
		served := fmt.Sprintf("%.1f%%", 100*r.served(c))
		if c == 0 {
			served = mark + served + mark
		}
		return fmt.Sprintf("%s %s served, p99 %v, %.1f%% shed", name, served, r.Percentile(.99, c).Round(time.Millisecond),
			100*float64(r.shed(c))/float64(max(1, r.Sent[c])))
	}
	s := fmt.Sprintf("goodput %s%.0f%%%s of capacity (%.0f/s of %.0f/s); %s; %s; model in flight mean %.1f, max %d; sent %.0f/s of %.0f/s",
		mark, 100*r.goodput/overloadRate(), mark, r.goodput, overloadRate(), class("signed_in", 0), class("anonymous", 1),
		r.modelMean, r.modelMax, float64(r.Sent[0]+r.Sent[1])/r.seconds, overloadFactor*overloadRate())
	if r.dropped > 0 {
		s += fmt.Sprintf(" (%d sends found all %d clients waiting)", r.dropped, overloadWorkers)
	}
	if r.Other+r.Errors > 0 {
		s += fmt.Sprintf("; %d other statuses, %d without answer", r.Other, r.Errors)
	}
	return s
}

// runOverload loads url at overloadFactor × the model's capacity for
// overloadConverge, then measures for d: a pacer hands out sends at the
// rate (every fifth signed_in), each to a worker that is waiting for none;
// a send that finds every worker waiting for an answer is dropped and
// counted. The model's requests in flight are sampled meanwhile.
func runOverload(url string, model *upstreammodel.Server, d time.Duration) overloadResult {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: overloadWorkers, DisableCompression: true}}
	defer client.CloseIdleConnections()
	sends := make(chan int64) // unbuffered: a send is taken by an idle worker or dropped
	shots := make([][]shot, overloadWorkers)
	var wg sync.WaitGroup
	for w := range overloadWorkers {
		wg.Go(func() {
			for n := range sends {
				s := shot{signed: n%5 == 0, sent: time.Now()}
				class := "anonymous"
				if s.signed {
					class = "signed_in"
				}
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Class", class)
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					s.status = resp.StatusCode
				}
				s.done = time.Now()
				shots[w] = append(shots[w], s)
			}
		})
	}

	start := time.Now()
	from, to := start.Add(overloadConverge), start.Add(overloadConverge+d)
	rate := overloadFactor * overloadRate()
	var res overloadResult
	var samples []int64
	var issued int64
	nextSample := from
	for now := time.Now(); now.Before(to); now = time.Now() {
		for due := int64(now.Sub(start).Seconds() * rate); issued < due; issued++ {
			select {
			case sends <- issued:
			default:
				if !now.Before(from) {
					res.dropped++
				}
			}
		}
		if !now.Before(nextSample) {
			samples = append(samples, model.InFlight())
			nextSample = nextSample.Add(10 * time.Millisecond)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(sends)
	wg.Wait()

	res.seconds = d.Seconds()
	var good int
	for _, ws := range shots {
		for _, s := range ws {
			if s.status == http.StatusOK && !s.done.Before(from) && s.done.Before(to) {
				good++
			}
			if s.sent.Before(from) || !s.sent.Before(to) {
				continue
			}
			c := 1
			if s.signed {
				c = 0
			}
			res.Add(c, s.status, s.done.Sub(s.sent))
		}
	}
	res.goodput = float64(good) / res.seconds
	var sum int64
	for _, n := range samples {
		sum += n
		res.modelMax = max(res.modelMax, n)
	}
	res.modelMean = float64(sum) / float64(max(1, len(samples)))
	return res
}
