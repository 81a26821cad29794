package main

// Budgets in dollars (charge usd) against charge json, on the same
// responses behind reverse_proxy, by Caddy's CPU per request:
//
//	usd-json  the JSON completion of body-charge
//	usd-sse   a short chat completion stream: 20 chunks with
//	          "usage":null, then the usage chunk and [DONE], unpaced

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

var usdScenarios = []scenario{
	{
		name: "usd-json",
		metric: fmt.Sprintf("Allowed JSON completion (%d B, model gpt-4o-mini, 10 + 20 tokens) through reverse_proxy, `charge usd` (a three-line price table, the model priced by its default) vs `charge json usage.total_tokens`, %d keys, no denial, Caddy CPU per request (ratio of the two rate-limited routes)",
			len(completionBody), llmKeys),
		setup:      startUSDUpstream,
		routes:     usdRoutes,
		baseline:   route{path: "/chat/json", key: llmKey, status: 200, every: true},
		candidate:  route{path: "/chat/usd", key: llmKey, status: 200, every: true},
		warmup:     warmLLMKeys("/chat/json", "/chat/usd"),
		target:     0.95,
		byCPU:      true,
		comparison: "charge json on the same response: one path summed, no model read, no price",
	},
	{
		name: "usd-sse",
		metric: fmt.Sprintf("Allowed SSE completion stream (%d chunks of ~%d B with `\"usage\":null`, then the usage chunk and `[DONE]`, unpaced) through reverse_proxy, `charge usd` vs `charge json usage.total_tokens`, %d keys, no denial, Caddy CPU per request (ratio of the two rate-limited routes)",
			usdStreamChunks, len(sseEvent(0, 0)), llmKeys),
		setup:      startUSDUpstream,
		routes:     usdRoutes,
		baseline:   route{path: "/short/json", key: llmKey, status: 200, every: true},
		candidate:  route{path: "/short/usd", key: llmKey, status: 200, every: true},
		warmup:     warmLLMKeys("/short/json", "/short/usd"),
		target:     0.95,
		byCPU:      true,
		comparison: "charge json on the same stream",
	},
}

func init() { scenarios = append(scenarios, usdScenarios...) }

// usdStreamChunks is how many content chunks a short stream has.
const usdStreamChunks = 20

// usdZone is a zone named name charged by charge usd that denies nothing:
// a key would need to spend $1000 within the hour.
func usdZone(name string) string {
	return `		zone ` + name + ` {
			key {http.request.header.X-Key}
			events 1000 usd
			window 1h
			charge usd {
				model gpt-4.1-mini* input 0.40 cached_input 0.10 output 1.60
				model claude-sonnet-4* input 3.00 cached_input 0.30 output 15.00
				default input 0.15 output 0.60
			}
		}
`
}

func usdRoutes(e *env) string {
	return proxied(e, "\t\tflush_interval -1\n",
		"/chat/json", tokenZone("usd_base_json", bodyCharge),
		"/chat/usd", usdZone("usd_json"),
		"/short/json", tokenZone("usd_base_sse", bodyCharge),
		"/short/usd", usdZone("usd_sse"))
}

// startUSDUpstream is body-charge's upstream, with short unpaced streams
// under /short/.
func startUSDUpstream(e *env) (func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/short/") {
			serveLLM(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		buf := make([]byte, 0, 256)
		for seq := range usdStreamChunks {
			buf = appendSSEEvent(buf[:0], seq, 0)
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, sseUsageEvent)
	}), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(l); close(done) }()
	e.values["llm"] = l.Addr().String()
	return func() {
		_ = srv.Close()
		<-done
	}, nil
}
