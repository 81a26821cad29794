package main

// Charges from the response body (charge json) behind reverse_proxy, in
// front of a model OpenAI-compatible upstream that this process serves on
// loopback (so that Caddy's CPU time is the proxy's and tally's alone):
//
//	body-charge  an allowed JSON completion charged from its body against
//	             the same completion charged from its X-Tokens-Used header,
//	             by Caddy's CPU per request
//	sse-stream   a stream of 1,000 server-sent events through a route
//	             without rate_limit, one charged from a header and one
//	             charged from the body: Caddy's CPU per event, and the
//	             time from the upstream's write of each event to the
//	             client's read of it

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var bodyChargeScenarios = []scenario{
	{
		name: "body-charge",
		metric: fmt.Sprintf("Allowed JSON completion (%d B, `usage.total_tokens` 30) through reverse_proxy, `charge json usage.total_tokens` vs `charge {http.response.header.X-Tokens-Used}` on the same response, %d keys, events 1000000000 window 1h (no denial), Caddy CPU per request (ratio of the two rate-limited routes)",
			len(completionBody), llmKeys),
		setup:      startLLMUpstream,
		routes:     bodyChargeRoutes,
		baseline:   route{path: "/chat/header", key: llmKey, status: 200, every: true},
		candidate:  route{path: "/chat/json", key: llmKey, status: 200, every: true},
		warmup:     warmLLMKeys("/chat/header", "/chat/json"),
		target:     0.91,
		byCPU:      true,
		comparison: "the header charge: one placeholder read after the response, the body untouched",
	},
	{
		name: "sse-stream",
		metric: fmt.Sprintf("SSE stream of %s events (~%d B each, one every %v, `\"usage\":null`, then the usage event and `[DONE]`) through reverse_proxy, %d streams at once: "+
			"time from the upstream's write of each event to the client's read of it, and Caddy CPU per event, route with `charge json usage.total_tokens` vs a header charge vs no rate_limit",
			"1,000", len(sseEvent(0, 0)), ssePace, sseStreamsAtOnce),
		setup:      startLLMUpstream,
		routes:     sseRoutes,
		warmup:     warmSSE,
		custom:     measureSSE,
		target:     5,
		targetText: "per-event latency (median and p99) within 5 ms of the route without rate_limit",
		comparison: "the same stream without rate_limit, and with a header charge (no body scan)",
	},
}

func init() { scenarios = append(scenarios, bodyChargeScenarios...) }

// llmKeys is how many API keys the body-charge scenarios cycle through:
// a gateway's clients, each far below its limit.
const llmKeys = 1_000

func llmKey(i int64) string { return manyKeyValues[i%llmKeys] }

// tokenZone is a zone named name that charges each response by charge and
// denies nothing: a key would need 10⁹ tokens within the hour.
func tokenZone(name, charge string) string {
	return `		zone ` + name + ` {
			key {http.request.header.X-Key}
			events 1000000000
			window 1h
			charge ` + charge + `
		}
`
}

const (
	headerCharge = "{http.response.header.X-Tokens-Used}"
	bodyCharge   = "json usage.total_tokens"
)

// proxied is limited's layout (a rate_limit handler per path under its
// matcher, then one handler for every path) with reverse_proxy to the
// upstream as that handler, its idle connections enough for every
// connection of the load generator.
func proxied(e *env, proxyOptions string, pathBodies ...string) string {
	routes := strings.TrimSuffix(limited(pathBodies...), "\trespond \"ok\" 200\n")
	return routes + `	reverse_proxy ` + e.values["llm"] + ` {
` + proxyOptions + `		transport http {
			keepalive_idle_conns_per_host 128
		}
	}
`
}

func bodyChargeRoutes(e *env) string {
	return proxied(e, "",
		"/chat/header", tokenZone("tokens_header", headerCharge),
		"/chat/json", tokenZone("tokens_json", bodyCharge))
}

// sseRoutes are /sse/plain (no rate_limit), /sse/header and /sse/json; the
// upstream streams whatever path it is asked for under /sse/.
func sseRoutes(e *env) string {
	return proxied(e, "\t\tflush_interval -1\n",
		"/sse/header", tokenZone("sse_header", headerCharge),
		"/sse/json", tokenZone("sse_json", bodyCharge))
}

// warmLLMKeys sends one request for each key to each path, so that the
// measured runs find every key tracked, and checks that every body charge
// found its usage.
func warmLLMKeys(paths ...string) func(*env, *caddyProcess) error {
	return func(_ *env, c *caddyProcess) error {
		for _, path := range paths {
			r, err := load{addr: c.addr, path: path, key: llmKey, conns: 16, runFor: 20 * time.Second, maxRequests: llmKeys}.run()
			if err == nil {
				err = checkStatuses(r, route{path: path, status: 200, every: true})
			}
			if err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
		}
		return checkUsageFound(c)
	}
}

// chargeFallbackLog is the warning tally logs (sampled, the first always)
// when a response carried no usage to charge.
const chargeFallbackLog = "response carried no usable usage"

// checkUsageFound fails when Caddy's runtime log holds a charge fallback:
// the body charge measured would not be the one that reads the usage.
func checkUsageFound(c *caddyProcess) error {
	data, err := os.ReadFile(filepath.Join(filepath.Dir(c.logPath), "caddy-runtime.log"))
	if err != nil {
		return err
	}
	if i := bytes.Index(data, []byte(chargeFallbackLog)); i >= 0 {
		line := data[bytes.LastIndexByte(data[:i], '\n')+1:]
		if j := bytes.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		return fmt.Errorf("a body charge found no usage: %s", line)
	}
	return nil
}

// completionBody is an OpenAI chat completion of about 400 bytes whose
// usage.total_tokens is 30, as is its X-Tokens-Used header.
var completionBody = []byte(`{"id":"chatcmpl-9x2Bench0000000000000000000","object":"chat.completion","created":1733280000,"model":"gpt-4o-mini-2024-07-18",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Rate limits protect an API from overload and share its capacity fairly among clients.","refusal":null},` +
	`"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30},"system_fingerprint":"fp_0ba0d124f1"}`)

// The stream the upstream sends for any path under /sse/.
const (
	sseEvents        = 1000
	ssePace          = time.Millisecond // between one event's flush and the next event
	sseStreamsAtOnce = 8
	sseStreamTimeout = 30 * time.Second // a stream's bound, at a pace that takes ~1.1s
)

// epoch is the clock the upstream stamps each event with and the client
// reads it against: both run in this process.
var epoch = time.Now()

// sseEvent is a chunk of a chat completion stream, about 200 bytes, its
// send time (nanoseconds since epoch) in "t" at a fixed width.
func sseEvent(seq int, sent time.Duration) []byte {
	b := make([]byte, 0, 256)
	return appendSSEEvent(b, seq, sent)
}

func appendSSEEvent(b []byte, seq int, sent time.Duration) []byte {
	b = append(b, `data: {"id":"chatcmpl-9x2Bench0000000000000000000","object":"chat.completion.chunk","model":"gpt-4o-mini","t":`...)
	b = fmt.Appendf(b, "%019d", int64(sent))
	b = append(b, `,"choices":[{"index":0,"delta":{"content":" tok`...)
	b = fmt.Appendf(b, "%04d", seq)
	return append(b, `"}}],"usage":null}`+"\n\n"...)
}

const sseUsageEvent = `data: {"id":"chatcmpl-9x2Bench0000000000000000000","object":"chat.completion.chunk","created":1733280000,"model":"gpt-4o-mini","choices":[],` +
	`"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}` + "\n\n" + "data: [DONE]\n\n"

// startLLMUpstream is a setup: the upstream on a free loopback port, its
// address in e.values["llm"]. Paths under /sse/ stream; any other path is
// the JSON completion.
func startLLMUpstream(e *env) (func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(serveLLM), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(l); close(done) }()
	e.values["llm"] = l.Addr().String()
	return func() {
		_ = srv.Close()
		<-done
	}, nil
}

func serveLLM(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Tokens-Used", "30")
	if !strings.HasPrefix(r.URL.Path, "/sse/") {
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(completionBody)))
		_, _ = w.Write(completionBody)
		return
	}
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 256)
	for seq := range sseEvents {
		if seq > 0 {
			time.Sleep(ssePace) // the model's pace, not synchronisation
		}
		buf = appendSSEEvent(buf[:0], seq, time.Since(epoch))
		if _, err := w.Write(buf); err != nil {
			return
		}
		if rc.Flush() != nil || r.Context().Err() != nil {
			return
		}
	}
	_, _ = io.WriteString(w, sseUsageEvent)
}

// sseStats are what the streams of one route measured.
type sseStats struct {
	streams   int
	events    int64
	cpu       time.Duration
	perEvent  []time.Duration // upstream write to client read, every event
	firstByte []time.Duration // request sent to the first event read, every stream
}

func (s *sseStats) add(o sseStats) {
	s.streams += o.streams
	s.events += o.events
	s.cpu += o.cpu
	s.perEvent = append(s.perEvent, o.perEvent...)
	s.firstByte = append(s.firstByte, o.firstByte...)
}

func (s sseStats) cpuPerEvent() time.Duration {
	if s.events == 0 {
		return 0
	}
	return s.cpu / time.Duration(s.events)
}

// quantile of xs (sorted in place), nearest rank.
func quantile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

var ssePaths = []string{"/sse/plain", "/sse/header", "/sse/json"}

// warmSSE runs a stream at once for each route: connections and pools.
func warmSSE(_ *env, c *caddyProcess) error {
	for _, path := range ssePaths {
		if _, err := runSSE(c.addr, path, sseStreamsAtOnce, 10*time.Second, sseStreamsAtOnce); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	}
	return checkUsageFound(c)
}

// measureSSE runs the three routes in turn for -rounds rounds of
// -duration each (streams begun within it run to their end), and compares
// their pooled figures.
func measureSSE(o options, _ *env, c *caddyProcess) (customResult, error) {
	stats := make([]sseStats, len(ssePaths))
	for round := range o.rounds {
		for i, path := range ssePaths {
			cpu0, cpuErr := c.cpuTime()
			s, err := runSSE(c.addr, path, sseStreamsAtOnce, o.runFor, 1000)
			if err != nil {
				return customResult{}, fmt.Errorf("%s: %v", path, err)
			}
			cpu1, err := c.cpuTime()
			if err != nil || cpuErr != nil {
				return customResult{}, fmt.Errorf("reading Caddy's CPU time: %v", errors.Join(err, cpuErr))
			}
			s.cpu = cpu1 - cpu0
			progressf("  sse-stream round %d: %s %d streams, %v CPU per event, per-event latency median %v",
				round+1, path, s.streams, s.cpuPerEvent(), quantile(s.perEvent, 0.5))
			stats[i].add(s)
		}
	}
	if err := checkUsageFound(c); err != nil {
		return customResult{}, err
	}
	plain, header, body := stats[0], stats[1], stats[2]
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) }
	lat := func(s sseStats) string {
		return ms(quantile(s.perEvent, 0.5)) + " / " + ms(quantile(s.perEvent, 0.99))
	}
	first := func(s sseStats) string {
		return ms(quantile(s.firstByte, 0.5)) + " / " + ms(quantile(s.firstByte, 0.99))
	}
	addedMedian := quantile(body.perEvent, 0.5) - quantile(plain.perEvent, 0.5)
	addedP99 := quantile(body.perEvent, 0.99) - quantile(plain.perEvent, 0.99)
	ratio := func(a, b sseStats) string {
		if b.cpuPerEvent() == 0 {
			return "—"
		}
		return strconv.FormatFloat(float64(a.cpuPerEvent())/float64(b.cpuPerEvent()), 'f', 2, 64)
	}
	text := fmt.Sprintf("per-event latency added by `charge json`: **%s ms median, %s ms p99** "+
		"(median / p99 in ms: charge json %s, header charge %s, no rate_limit %s; first byte %s, %s, %s); "+
		"Caddy CPU per event: charge json %s µs, header charge %s µs, no rate_limit %s µs (json / header **%s**, json / none %s); "+
		"%d, %d, %d streams of %d events over %d rounds",
		ms(addedMedian), ms(addedP99),
		lat(body), lat(header), lat(plain), first(body), first(header), first(plain),
		us(body.cpuPerEvent()), us(header.cpuPerEvent()), us(plain.cpuPerEvent()), ratio(body, header), ratio(body, plain),
		body.streams, header.streams, plain.streams, sseEvents, o.rounds)
	worst := max(addedMedian, addedP99)
	met := worst <= 5*time.Millisecond
	return customResult{value: float64(worst) / 1e6, text: text, met: &met}, nil
}

// runSSE reads streams from path, at most workers at once, beginning new
// ones for runFor and at most maxStreams in all; each stream must bring
// every event, the usage and [DONE].
func runSSE(addr, path string, workers int, runFor time.Duration, maxStreams int64) (sseStats, error) {
	if !isLoopback(addr) {
		return sseStats{}, fmt.Errorf("refusing to load %q: only 127.0.0.1 is allowed", addr)
	}
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: workers,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
	defer client.CloseIdleConnections()
	var (
		issued atomic.Int64
		mu     sync.Mutex
		total  = sseStats{perEvent: make([]time.Duration, 0, int(min(maxStreams, 64))*sseEvents)}
		errs   []error
		wg     sync.WaitGroup
	)
	deadline := time.Now().Add(runFor)
	for range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				i := issued.Add(1) - 1
				if i >= maxStreams {
					return
				}
				s, err := readSSEStream(client, addr, path, llmKey(i))
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					total.add(s)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return total, errors.Join(errs...)
}

// readSSEStream reads one stream and times each event against the send
// time it carries.
func readSSEStream(client *http.Client, addr, path, key string) (sseStats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), sseStreamTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return sseStats{}, err
	}
	req.Header.Set("X-Key", key)
	req.Header.Set("Accept", "text/event-stream")
	start := time.Since(epoch)
	resp, err := client.Do(req)
	if err != nil {
		return sseStats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sseStats{}, fmt.Errorf("status %d, want 200 (a denial: the zone's limit is far above the run)", resp.StatusCode)
	}
	s := sseStats{streams: 1, perEvent: make([]time.Duration, 0, sseEvents)}
	rd := bufio.NewReaderSize(resp.Body, 16<<10)
	stamp := []byte(`"t":`)
	var usage, done bool
	for {
		line, err := rd.ReadSlice('\n')
		now := time.Since(epoch)
		if err == io.EOF && len(line) == 0 {
			break
		}
		if err != nil {
			return sseStats{}, fmt.Errorf("after %d events: %v", s.events, err)
		}
		switch {
		case bytes.HasPrefix(line, []byte("data: [DONE]")):
			done = true
		case bytes.Contains(line, []byte(`"total_tokens":30`)):
			usage = true
		case bytes.HasPrefix(line, []byte("data: ")):
			_, rest, ok := bytes.Cut(line, stamp)
			if !ok || len(rest) < 19 {
				return sseStats{}, fmt.Errorf("event without its send time: %q", line)
			}
			sent, err := strconv.ParseInt(string(rest[:19]), 10, 64)
			if err != nil {
				return sseStats{}, fmt.Errorf("event with a bad send time: %q", line)
			}
			if s.events == 0 {
				s.firstByte = append(s.firstByte, now-start)
			}
			s.events++
			s.perEvent = append(s.perEvent, now-time.Duration(sent))
		}
	}
	if s.events != sseEvents || !usage || !done {
		return sseStats{}, fmt.Errorf("stream of %d events (usage %v, [DONE] %v), want %d, the usage and [DONE]", s.events, usage, done, sseEvents)
	}
	return s, nil
}
