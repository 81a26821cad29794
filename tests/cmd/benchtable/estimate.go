package main

// estimate request (docs/llm.md) behind reverse_proxy, in front of this
// process's model upstream:
//
//	estimate-read      a POSTed 2 KB chat request charged by charge tokens,
//	                   with estimate request (its body read, parsed and
//	                   replayed) vs without, by Caddy's CPU per request
//	estimate-overshoot 20 requests at once of one key with one request's
//	                   budget left, held 200 ms by the upstream: the spend
//	                   over the budget with estimate request vs without

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// estimateBody is a chat request of about 2 KB: a system prompt, a
// question, max_tokens.
var estimateBody = `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 40) +
	`"},{"role":"user","content":"` + strings.Repeat("What is the capital of France? ", 30) + `"}],"max_tokens":256,"temperature":0.2}`

var estimateScenarios = []scenario{
	{
		name: "estimate-read",
		metric: fmt.Sprintf("Allowed POSTed chat request (%d B body, max_tokens 256) through reverse_proxy, `charge tokens` with `estimate request` (the body read, parsed and replayed to the upstream) vs without, %d keys, no denial, Caddy CPU per request (ratio of the two rate-limited routes)",
			len(estimateBody), llmKeys),
		setup:      startEstimateUpstream,
		routes:     estimateRoutes,
		baseline:   route{path: "/est/none", key: llmKey, status: 200, every: true, body: estimateBody},
		candidate:  route{path: "/est/body", key: llmKey, status: 200, every: true, body: estimateBody},
		warmup:     warmLLMKeys("/est/none", "/est/body"),
		target:     0.85,
		byCPU:      true,
		comparison: "the same zone without the estimate: the body streams to the upstream unread",
	},
	{
		name:       "estimate-overshoot",
		metric:     "20 requests at once of one key with 30 of 300 tokens left, each costing 30 (10 input, max_tokens 20), held 200 ms by the upstream, `charge tokens`: tokens spent over the budget with `estimate request` vs without",
		setup:      startEstimateUpstream,
		routes:     estimateRoutes,
		custom:     measureOvershoot,
		target:     30,
		targetText: "at most one request's cost (30 tokens) over the budget with estimate request",
	},
}

func init() { scenarios = append(scenarios, estimateScenarios...) }

func estimateRoutes(e *env) string {
	quota := func(name, extra string) string {
		return `		zone ` + name + ` {
			key {http.request.header.X-Key}
			quota 300 per day
			charge tokens` + extra + `
		}
`
	}
	return proxied(e, "",
		"/est/none", tokenZone("est_none", "tokens"),
		"/est/body", tokenZone("est_body", "tokens\n\t\t\testimate request"),
		"/over/none", quota("over_none", ""),
		"/over/body", quota("over_body", "\n\t\t\testimate request"))
}

// startEstimateUpstream is the JSON completion (30 tokens) upstream, which
// holds requests under /over/ for 200 ms: the model's time.
func startEstimateUpstream(e *env) (func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/over/") {
			time.Sleep(200 * time.Millisecond) // the model's time, not synchronisation
		}
		serveLLM(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(l); close(done) }()
	e.values["llm"] = l.Addr().String()
	return func() {
		_ = srv.Close()
		<-done
	}, nil
}

// measureOvershoot spends 270 of a key's 300 tokens in 9 requests, then
// sends 20 at once, each estimated at exactly its cost (a 40-byte prompt,
// max_tokens 20: 10 + 20), on each route, and reports the tokens spent
// over the budget once every response is charged.
func measureOvershoot(o options, e *env, c *caddyProcess) (customResult, error) {
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 36) + `"}],"max_tokens":20}`
	over := map[string]int64{}
	admitted := map[string]int{}
	for _, path := range []string{"/over/none", "/over/body"} {
		post := func() (int, error) {
			req, err := http.NewRequest(http.MethodPost, "http://"+c.addr+path, strings.NewReader(body))
			if err != nil {
				return 0, err
			}
			req.Header.Set("X-Key", "overshoot")
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			res.Body.Close()
			return res.StatusCode, nil
		}
		for i := range 9 {
			if s, err := post(); err != nil || s != 200 {
				return customResult{}, fmt.Errorf("%s: request %d of the budget's first 270 tokens: %d %v", path, i+1, s, err)
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		for range 20 {
			wg.Go(func() {
				s, err := post()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else if s == 200 {
					admitted[path]++
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			return customResult{}, errs[0]
		}
		// Each admitted request is charged its 30 tokens once it ends,
		// before its client reads the response's end.
		over[path] = int64(270+30*admitted[path]) - 300
	}
	return customResult{
		value: float64(over["/over/body"]),
		text: fmt.Sprintf("with estimate request %d admitted, %d tokens over the budget; without %d admitted, %d over",
			admitted["/over/body"], over["/over/body"], admitted["/over/none"], over["/over/none"]),
		comparison: fmt.Sprintf("without estimate request: %d tokens over (every request at once passes the check)", over["/over/none"]),
	}, nil
}
