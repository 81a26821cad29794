package tests

// charge tokens through a real Caddy in front of the model LLM upstream
// (internal/llmupstream): every format's usage, JSON and streaming,
// charged exactly as input, output and total tokens, locally and in strict
// mode; the responses that carry no usable usage fall back.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/tests/internal/llmupstream"
)

// tokenZones charge the same responses three ways (and the total once
// more, settling an estimate taken before), each key a million tokens a
// year: one token refills in 31 s, so what a test reads within
// seconds is what was charged.
const tokenZones = `
		zone tok_input {
			key    {http.request.header.Authorization}
			events 1000000
			window 8760h
			charge tokens input
		}
		zone tok_output {
			key    {http.request.header.Authorization}
			events 1000000
			window 8760h
			charge tokens output
		}
		zone tok_total {
			key    {http.request.header.Authorization}
			events 1000000
			window 8760h
			charge tokens
		}
		zone tok_estimate {
			key    {http.request.header.Authorization}
			events 1000000
			window 8760h
			cost   {http.request.header.X-Max-Tokens} 1 at_least 1
			charge tokens
		}`

// tokenCase is one request to the model upstream and the format its
// response is read as.
type tokenCase struct {
	name, path, body, format string
	header                   map[string]string
}

var tokenCases = []tokenCase{
	{"openai chat json", "/v1/chat/completions", `{"model":"gpt-4.1-mini"}`, "openai_chat", nil},
	{"openai chat stream", "/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true}}`, "openai_chat", nil},
	{"openai chat stream, include_usage added by tally", "/v1/chat/completions", `{"stream":true}`, "openai_chat", nil},
	{"responses json", "/v1/responses", `{}`, "openai_responses", nil},
	{"responses stream completed", "/v1/responses", `{"stream":true}`, "openai_responses", nil},
	{"responses stream incomplete", "/v1/responses", `{"stream":true}`, "openai_responses", map[string]string{"X-Final-Event": "incomplete"}},
	{"responses stream failed", "/v1/responses", `{"stream":true}`, "openai_responses", map[string]string{"X-Final-Event": "failed"}},
	{"anthropic json", "/v1/messages", `{}`, "anthropic", nil},
	{"anthropic stream, three cumulative message_delta", "/v1/messages", `{"stream":true}`, "anthropic", map[string]string{"X-Deltas": "3"}},
	{"anthropic stream, input repeated in message_delta", "/v1/messages", `{"stream":true}`, "anthropic", map[string]string{"X-Input-In-Delta": "1"}},
	{"gemini json", "/v1beta/models/gemini-2.5-flash:generateContent", `{}`, "gemini", nil},
	{"gemini stream, cumulative chunks", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", `{}`, "gemini", map[string]string{"X-Chunks": "4"}},
	{"gemini stream without alt=sse: one JSON array of the chunks", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", `{}`, "gemini", map[string]string{"X-Chunks": "4"}},
	{"ollama chat, NDJSON stream", "/api/chat", `{"model":"llama3.2"}`, "ollama", nil},
	{"ollama generate json", "/api/generate", `{"stream":false}`, "ollama", nil},
}

// llmClient bounds every LLM request of these tests: a response that does
// not end within 30 s fails the test, naming the request.
var llmClient = &http.Client{Timeout: 30 * time.Second}

// postLLM sends body to path through c with the usage u asks for and the
// key, reads the whole response and returns its status.
func postLLM(t *testing.T, c *caddyInstance, key, path, body string, u llmupstream.Usage, header map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	u.SetHeaders(req.Header)
	req.Header.Set("Authorization", key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := llmClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("POST %s: reading the body: %v", path, err)
	}
	return resp.StatusCode
}

// checkTokenCharges sends each case once with its own key and waits for
// each zone to have charged it exactly: the input (cached included), the
// output (reasoning included), the total.
func checkTokenCharges(t *testing.T, c *caddyInstance, mode string) {
	u := llmupstream.Usage{Input: 1000, Cached: 200, CacheCreation: 100, Output: 300, Reasoning: 50}
	for _, tc := range tokenCases {
		key := fmt.Sprintf("Bearer %s %s", mode, tc.name)
		if s := postLLM(t, c, key, tc.path, tc.body, u, tc.header); s != 200 {
			t.Fatalf("%s: %d, want 200", tc.name, s)
		}
		waitCharged(t, c, "tok_input", key, 1000000-u.Input)
		waitCharged(t, c, "tok_output", key, 1000000-u.Output)
		waitCharged(t, c, "tok_total", key, 1000000-u.Total())
		waitCharged(t, c, "tok_estimate", key, 1000000-u.Total())
	}
	// No usable usage: the zones' cost (1) stays charged.
	u = llmupstream.Usage{Input: 500, Output: 500}
	for _, tc := range []tokenCase{
		{"anthropic stream cut after message_start", "/v1/messages", `{"stream":true}`, "", map[string]string{"X-Cut": "after-start"}},
	} {
		key := fmt.Sprintf("Bearer %s %s", mode, tc.name)
		if s := postLLM(t, c, key, tc.path, tc.body, u, tc.header); s != 200 {
			t.Fatalf("%s: %d, want 200", tc.name, s)
		}
		for _, z := range []string{"tok_input", "tok_output", "tok_total", "tok_estimate"} {
			waitCharged(t, c, z, key, 1000000-1)
		}
	}
}

func TestChargeTokensReadsEveryFormatLocally(t *testing.T) {
	t.Parallel()
	up := llmupstream.Start(t)
	c := startCaddyWith(t, "metrics", loginSite(up.Addr, tokenZones, ""))
	checkTokenCharges(t, c, "local")
	byFormat := map[string]float64{}
	for _, tc := range tokenCases {
		byFormat[tc.format]++
	}
	samples := c.scrape()
	for _, f := range []string{"openai_chat", "openai_responses", "anthropic", "gemini", "ollama"} {
		if v, ok := metricValue(samples, "caddy_rate_limit_token_charges_total", map[string]string{"zone": "tok_total", "format": f}); !ok || v != byFormat[f] {
			t.Errorf("token_charges_total{format=%s} = %v (present %v), want %v", f, v, ok, byFormat[f])
		}
	}
	if v, _ := metricValue(samples, "caddy_rate_limit_charge_fallbacks_total", map[string]string{"zone": "tok_total", "reason": "no_usage"}); v != 1 {
		t.Errorf("charge_fallbacks_total{reason=no_usage} = %v, want the 1 stream without usage", v)
	}
}

func TestChargeTokensReadsEveryFormatInStrictMode(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	up := llmupstream.Start(t)
	c := startCaddy(t, loginSite(up.Addr, tokenZones, strictBlock(rs.Addr)))
	checkTokenCharges(t, c, "strict")
}

// TestChargeTokensUnderConcurrencyAndAfterTheClientLeft: 48 concurrent
// requests of one key, every format, charge exactly their sum; an estimate
// is settled; a client that leaves a paced stream after its first bytes is
// charged what the upstream reports at the stream's end.
func TestChargeTokensUnderConcurrencyAndAfterTheClientLeft(t *testing.T) {
	t.Parallel()
	up := llmupstream.Start(t)
	c := startCaddy(t, loginSite(up.Addr, tokenZones, ""))
	u := llmupstream.Usage{Input: 70, Cached: 10, Output: 30}
	const n = 48
	errs := make(chan error, n)
	for i := range n {
		go func() {
			tc := tokenCases[i%len(tokenCases)]
			req, _ := http.NewRequest(http.MethodPost, c.URL+tc.path, strings.NewReader(tc.body))
			u.SetHeaders(req.Header)
			req.Header.Set("Authorization", "Bearer many")
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			resp, err := llmClient.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("%s: %d", tc.name, resp.StatusCode)
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitCharged(t, c, "tok_total", "Bearer many", 1000000-n*u.Total())
	waitCharged(t, c, "tok_input", "Bearer many", 1000000-n*u.Input)

	// An estimate taken before (cost placeholder) is settled to the usage;
	// without usage it stays charged.
	est := map[string]string{"X-Max-Tokens": "5000"}
	if s := postLLM(t, c, "Bearer estimated", "/v1/messages", `{"stream":true}`, u, est); s != 200 {
		t.Fatalf("estimated stream: %d", s)
	}
	waitCharged(t, c, "tok_estimate", "Bearer estimated", 1000000-u.Total())
	est["X-Cut"] = "after-start"
	if s := postLLM(t, c, "Bearer estimated, no usage", "/v1/messages", `{"stream":true}`, u, est); s != 200 {
		t.Fatalf("estimated stream without usage: %d", s)
	}
	waitCharged(t, c, "tok_estimate", "Bearer estimated, no usage", 1000000-5000)

	// The client reads the first bytes of an Anthropic stream paced at 40
	// ms an event (about half a second in all) and leaves.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/v1/messages", strings.NewReader(`{"stream":true}`))
	u.SetHeaders(req.Header)
	req.Header.Set("Authorization", "Bearer gone")
	req.Header.Set("X-Pace-Ms", "40")
	req.Header.Set("X-Chunks", "6")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
		t.Fatalf("reading the stream's first bytes: %v", err)
	}
	cancel()
	resp.Body.Close()
	waitCharged(t, c, "tok_total", "Bearer gone", 1000000-u.Total())
}

// TestChargeTokensReadsAResponsesStreamWhoseLastEventIsLarge: the
// Responses API's response.completed event repeats the whole response (its
// output, its instructions), so a long answer makes it larger than the
// 64 KiB of one event that is kept; its usage is charged all the same.
func TestChargeTokensReadsAResponsesStreamWhoseLastEventIsLarge(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("All work and no play. ", 10000) // 220 KB, about 50 000 tokens
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"model\":\"gpt-4.1\",\"output\":[],\"usage\":null}}\n\n")
		fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":%q}\n\n", text)
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"model\":\"gpt-4.1\",\"output\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":%q,\"annotations\":[]}]}],\"usage\":{\"input_tokens\":1000,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":50000,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":51000}}}\n\n", text)
	}))
	t.Cleanup(up.Close)
	c := startCaddy(t, loginSite(strings.TrimPrefix(up.URL, "http://"), tokenZones, ""))
	if s := postLLM(t, c, "Bearer long", "/v1/responses", `{"model":"gpt-4.1","stream":true}`, llmupstream.Usage{}, nil); s != 200 {
		t.Fatalf("long Responses stream: %d, want 200", s)
	}
	waitCharged(t, c, "tok_total", "Bearer long", 1000000-51000)
	waitCharged(t, c, "tok_output", "Bearer long", 1000000-50000)
}
