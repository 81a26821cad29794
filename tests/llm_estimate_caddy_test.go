package tests

// estimate request and include_usage (docs/llm.md) through a real Caddy in
// front of the model LLM upstream: the request's body reaches the upstream
// byte for byte (or with include_usage added, for an OpenAI chat stream
// alone), the estimate taken before the upstream answers is what the
// formula says, the client of a stream gets the stream it asked for, the
// charge after it is exact, and 20 requests at once at a budget's end
// overshoot it by at most one request's cost.

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/tests/internal/llmupstream"
)

// spendZone allows each key one dollar a day, priced at 1 micro-dollar an
// input token and 2 an output token, so that a cost in micro-dollars reads
// as tokens: input + 2 × output.
func spendZone(extra string) string {
	return `
		zone spend {
			key {http.request.header.Authorization}
			quota 1 usd per day
			charge usd {
				default input 1 output 2
			}` + extra + `
		}`
}

const dollar = 1_000_000 // micro-dollars

// post sends body to c at path as key, chunked when the length is not
// given, and returns the response with its body read.
func post(t *testing.T, c *caddyInstance, path, key string, body []byte, chunked bool, h http.Header) response {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(bytes.NewReader(body)) // no length known: sent chunked
	}
	req, err := http.NewRequest(http.MethodPost, c.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the body: %v", path, err)
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: string(b)}
}

// spent is what zone spend has charged, from c's metrics.
func spent(c *caddyInstance) int64 {
	v, _ := metricValue(c.scrape(), "caddy_rate_limit_cost_total", map[string]string{"zone": "spend"})
	return int64(v)
}

// lastBody is the body of the last request the upstream received.
func lastBody(t *testing.T, u *llmupstream.Server) []byte {
	t.Helper()
	reqs := u.Requests()
	if len(reqs) == 0 {
		t.Fatal("the upstream received no request")
	}
	return reqs[len(reqs)-1].Body
}

// chat is an OpenAI chat request whose prompt is prompt bytes of text
// (at least 4): the role's "user" and prompt - 4 bytes of content.
func chat(prompt int, extra string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", prompt-4) + `"}]` + extra + `}`)
}

func TestEstimateRequestReadsTheBodyAndTheUpstreamGetsEveryByte(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	c := startCaddyWith(t, "metrics", loginSite(u.Addr, spendZone("\n\t\t\testimate request"), ""))
	big := chat(3<<20, `,"max_tokens":10`) // over the 1 MiB read: no estimate
	for _, tc := range []struct {
		name    string
		path    string
		body    []byte
		chunked bool
	}{
		{"json", "/v1/chat/completions", chat(400, `,"max_tokens":50`), false},
		{"chunked", "/v1/chat/completions", chat(400, `,"max_tokens":50`), true},
		{"over 1 MiB", "/v1/chat/completions", big, false},
		{"over 1 MiB, chunked", "/v1/chat/completions", big, true},
		{"anthropic stream", "/v1/messages", []byte(`{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`), false},
		{"gemini stream", "/v1beta/models/gemini-x:streamGenerateContent?alt=sse", []byte(`{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":64}}`), false},
		{"ollama stream", "/api/chat", []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":64}}`), true},
		{"responses stream", "/v1/responses", []byte(`{"model":"o","input":"hi","stream":true}`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := post(t, c, tc.path, "Bearer "+tc.name, tc.body, tc.chunked, nil)
			if res.Status != 200 {
				t.Fatalf("%d %s", res.Status, res.Body)
			}
			if got := lastBody(t, u); !bytes.Equal(got, tc.body) {
				t.Fatalf("the upstream got %d bytes, not the %d sent (first difference at %d)", len(got), len(tc.body), firstDiff(got, tc.body))
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// The estimate: a 4000-byte prompt is 1000 input tokens, max_tokens 500
// output ones, 1000 + 2 × 500 micro-dollars, taken before the upstream is
// called (the RateLimit header of the response, set before it, says what
// was left then); the response then settles it at what the upstream
// reported, 30 input and 12 output tokens. Without max_tokens the output
// is the p95 the zone learned for the model (at most 19% over it).
func TestEstimateRequestIsTheFormulaAndTheSettleIsExact(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	c := startCaddyWith(t, "metrics", loginSite(u.Addr, spendZone("\n\t\t\testimate request"), ""))
	const key = "Bearer formula"
	leftBefore := func(res response) int64 {
		t.Helper()
		var r int64
		if _, err := fmt.Sscanf(res.Header.Get("RateLimit-Remaining"), "%d", &r); err != nil {
			t.Fatalf("RateLimit-Remaining %q: %v", res.Header.Get("RateLimit-Remaining"), err)
		}
		return r
	}
	res := post(t, c, "/v1/chat/completions", key, chat(4000, `,"max_tokens":500`), false, nil)
	if got, want := leftBefore(res), int64(dollar-(1000+2*500)); res.Status != 200 || got != want {
		t.Fatalf("%d: remaining %d while the request ran, want %d: the estimate 1000 + 2×500", res.Status, got, want)
	}
	spent := int64(30 + 2*12)
	waitCharged(t, c, "spend", key, dollar-spent)
	// With no max_tokens, and nothing learned: the input alone. The
	// responses teach the zone the model's output, 12 tokens.
	res = post(t, c, "/v1/chat/completions", key, chat(400, ""), false, nil)
	if got, want := leftBefore(res), dollar-spent-(100+2*12); got > dollar-spent-100 || got < want-2*3 {
		t.Fatalf("remaining %d while the request ran, want about %d: the input and the one response's 12 output tokens learned", got, want)
	}
	spent += 30 + 2*12
	for range 20 {
		post(t, c, "/v1/chat/completions", key, chat(4, ""), false, nil)
		spent += 30 + 2*12
	}
	waitCharged(t, c, "spend", key, dollar-spent)
	res = post(t, c, "/v1/chat/completions", key, chat(400, ""), false, nil)
	if got, want := leftBefore(res), dollar-spent-(100+2*12); got > want || got < want-2*3 {
		t.Fatalf("remaining %d while the request ran, want %d (or up to 6 less): the learned p95 of 12 output tokens, 19%% over at most", got, want)
	}
	spent += 30 + 2*12
	waitCharged(t, c, "spend", key, dollar-spent)
}

// chatStream is a streaming chat request, without include_usage.
var chatStream = []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Say hi"}],"max_tokens":40,"stream":true}`)

func TestIncludeUsageIsAddedAndItsChunkStripped(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	c := startCaddyWith(t, "metrics", loginSite(u.Addr, spendZone(""), ""))
	usage := llmupstream.Usage{Input: 17, Output: 23}
	// What the client would get from the upstream itself.
	direct, err := http.Post(u.URL+"/v1/chat/completions", "application/json", bytes.NewReader(chatStream))
	if err != nil {
		t.Fatal(err)
	}
	wantStream, _ := io.ReadAll(direct.Body)
	direct.Body.Close()
	if strings.Contains(string(wantStream), `"usage"`) {
		t.Fatalf("the upstream sent usage unasked:\n%s", wantStream)
	}
	for _, chunked := range []bool{false, true} {
		key := fmt.Sprintf("Bearer stream-%v", chunked)
		before := len(u.Requests())
		res := post(t, c, "/v1/chat/completions", key, chatStream, chunked, usage.Header())
		if res.Status != 200 || res.Body != string(wantStream) {
			t.Fatalf("chunked %v: the client got %d\n%s\nwant the stream it asked for\n%s", chunked, res.Status, res.Body, wantStream)
		}
		reqs := u.Requests()[before:]
		want := `{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Say hi"}],"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`
		if len(reqs) != 1 || string(reqs[0].Body) != want {
			t.Fatalf("the upstream got %q, want the body with include_usage added", reqs[0].Body)
		}
		if cl := reqs[0].Header.Get("Content-Length"); !chunked && cl != fmt.Sprint(len(want)) {
			t.Errorf("Content-Length %q, want %d", cl, len(want))
		}
		waitCharged(t, c, "spend", key, dollar-(17+2*23))
	}
	// A client that asked for the usage gets it, its body untouched.
	asked := []byte(`{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}`)
	res := post(t, c, "/v1/chat/completions", "Bearer asked", asked, false, usage.Header())
	if !strings.Contains(res.Body, `"usage":{"prompt_tokens":17`) || !bytes.Equal(lastBody(t, u), asked) {
		t.Fatalf("a stream that asked for usage: the client got\n%s\nthe upstream %s", res.Body, lastBody(t, u))
	}
	waitCharged(t, c, "spend", "Bearer asked", dollar-(17+2*23))
	// Other APIs' streams are never touched, nor a non-streaming request.
	for path, body := range map[string]string{
		"/v1/messages":         `{"model":"claude","max_tokens":9,"stream":true,"messages":[]}`,
		"/v1/responses":        `{"model":"o","input":"hi","stream":true}`,
		"/api/chat":            `{"model":"llama","messages":[],"stream":true}`,
		"/v1/chat/completions": `{"model":"m","messages":[],"stream":false}`,
	} {
		post(t, c, path, "Bearer other", []byte(body), false, nil)
		if got := lastBody(t, u); string(got) != body {
			t.Errorf("%s: the upstream got %s, want %s untouched", path, got, body)
		}
	}
}

func TestIncludeUsageOffLeavesTheRequestAlone(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	c := startCaddyWith(t, "metrics", loginSite(u.Addr, spendZone("\n\t\t\tinclude_usage off"), ""))
	res := post(t, c, "/v1/chat/completions", "Bearer off", chatStream, false, nil)
	if res.Status != 200 || !bytes.Equal(lastBody(t, u), chatStream) || strings.Contains(res.Body, `"usage"`) {
		t.Fatalf("include_usage off: %d, the upstream got %s", res.Status, lastBody(t, u))
	}
	// No usage came: the zone's cost (1 micro-dollar) stays charged.
	waitCharged(t, c, "spend", "Bearer off", dollar-1)
}

// overshoot sends 20 requests at once of one key with 10 000 micro-dollars
// left, each costing 30 + 2 × 1000 = 2030 (max_tokens 1000, a prompt of 30
// tokens), sent together, and returns how many
// were admitted and the spend over the budget once all were charged (the
// zone's cost_total, every charge's actual cost). together: the upstream
// answers none until all 20 reached it (10 s at most), so that none is
// charged before every check is made, however loaded the machine.
func overshoot(t *testing.T, extra, distributed string, together bool) (admitted int, over int64) {
	u := llmupstream.Start(t)
	c := startCaddyWith(t, "metrics", loginSite(u.Addr, spendZone(extra), distributed))
	const key = "Bearer overshoot"
	body := chat(120, `,"max_tokens":1000`)
	h := llmupstream.Usage{Input: 30, Output: 1000}.Header()
	// 990 000 spent first: 10 000 left.
	pre := llmupstream.Usage{Input: 990_000 - 2*1000, Output: 1000}.Header()
	if res := post(t, c, "/v1/chat/completions", key, chat(4, `,"max_tokens":1`), false, pre); res.Status != 200 {
		t.Fatalf("the first request: %d", res.Status)
	}
	waitCharged(t, c, "spend", key, 10_000)
	h.Set("X-Chunks", "2")
	h.Set("X-Pace-Ms", "300") // the model's pace: the 20 overlap
	if together {
		h.Set("X-Together", "20")
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if res := post(t, c, "/v1/chat/completions", key, body, false, h); res.Status == 200 {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	charged := 990_000 + int64(admitted)*2030
	waitFor(t, 5*time.Second, fmt.Sprintf("the %d admitted requests to be charged", admitted), func() bool { return spent(c) == charged })
	return admitted, charged - dollar
}

// 20 requests at once at the budget's end: each post-charged one passes
// the check (nothing is charged until a response ends), so all 20 run;
// with estimate request each takes its estimate, the last one what was
// left, so the spend over the budget is at most one request's cost.
func TestOvershootAtTheBudgetsEnd(t *testing.T) {
	t.Parallel()
	admittedWithout, overWithout := overshoot(t, "", "", true)
	admittedWith, overWith := overshoot(t, "\n\t\t\testimate request", "", false)
	t.Logf("20 requests at once with 10000 of 1000000 micro-dollars left, 2030 each: without estimate request %d admitted, %d over the budget; with it %d admitted, %d over",
		admittedWithout, overWithout, admittedWith, overWith)
	// Without one, every request that arrives before an earlier one's
	// response is charged passes the check: all 20, the upstream holding
	// each response until the 20 reached it.
	if admittedWithout != 20 {
		t.Errorf("without an estimate %d of 20 admitted, want all: each passes the check until a response is charged", admittedWithout)
	}
	if overWith > 2030 || admittedWith != 5 {
		t.Errorf("with estimate request: %d admitted, %d over the budget; want 5 (4 taking 2030 each, one the 1880 left), at most one request's 2030 over", admittedWith, overWith)
	}
	// In strict mode each estimate is taken in Redis, one at a time.
	rs := startRedis(t)
	if admitted, over := overshoot(t, "\n\t\t\testimate request", strictBlock(rs.Addr), false); over > 2030 || admitted != 5 {
		t.Errorf("strict mode, with estimate request: %d admitted, %d over the budget; want 5, at most 2030 over", admitted, over)
	}
}

// Under charge tokens the estimate counts what the zone counts: the input
// and the output for total, the output alone for output.
func TestEstimateRequestCountsAsChargeTokensCounts(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	zone := func(name, count string) string {
		return `
		zone ` + name + ` {
			key {http.request.header.Authorization}
			quota 1000000 per day
			charge tokens ` + count + `
			estimate request
		}`
	}
	c := startCaddyWith(t, "metrics", loginSite(u.Addr, zone("tok_total", "total")+zone("tok_output", "output"), ""))
	res := post(t, c, "/v1/chat/completions", "Bearer tokens", chat(400, `,"max_tokens":50`), false, nil)
	// RateLimit names each zone's remaining while the request ran.
	items := strings.Split(res.Header.Get("RateLimit"), ", ")
	for zone, want := range map[string]string{"tok_total": `"tok_total";r=999850`, "tok_output": `"tok_output";r=999950`} {
		if !slices.ContainsFunc(items, func(it string) bool { return it == want || strings.HasPrefix(it, want+";") }) {
			t.Errorf("%s: RateLimit %q, want %s: the estimate 100 + 50 (total), 50 (output)", zone, res.Header.Get("RateLimit"), want)
		}
	}
	waitCharged(t, c, "tok_total", "Bearer tokens", 1000000-(30+12))
	waitCharged(t, c, "tok_output", "Bearer tokens", 1000000-12)
}

// The examples of docs/llm.md run as a newcomer copies them, their
// upstream and site address moved to the model upstream and this test's
// port: a chat stream that did not ask for its usage is charged exactly,
// in tokens and in dollars, in the key's, the team's and the
// organisation's budgets, and its client gets no usage chunk.
func TestLLMDocsExamplesRun(t *testing.T) {
	t.Parallel()
	blocks := caddyfileBlocks(t, "docs/llm.md")
	if len(blocks) != 3 {
		t.Fatalf("docs/llm.md has %d caddyfile blocks, want the vLLM, the OpenAI proxy and the key/team/org examples", len(blocks))
	}
	u := llmupstream.Start(t)
	usage := llmupstream.Usage{Input: 1000, Output: 500}
	body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":600,"stream":true}`)
	run := func(block caddyfileBlock, site string) *caddyInstance {
		text := strings.NewReplacer(site+" {", "http:// {", "localhost:8000", u.Addr, "https://api.openai.com", "http://"+u.Addr).Replace(block.text)
		c := newCaddyInstance(t)
		c.Start(c.Caddyfile("metrics", text), "caddyfile")
		res := post(t, c, "/v1/chat/completions", "Bearer sk-alice", body, false, usage.Header())
		if res.Status != 200 || strings.Contains(res.Body, `"usage"`) || !strings.HasSuffix(res.Body, "data: [DONE]\n\n") {
			t.Fatalf("%s: %d, the client got\n%s", block.where, res.Status, res.Body)
		}
		return c
	}
	c := run(blocks[0], "llm.example.com")
	waitCharged(t, c, "tokens_per_day", "Bearer sk-alice", 2_000_000-1500)
	// gpt-4.1-mini: 1000 × 0.40 + 500 × 1.60 dollars a million tokens.
	c = run(blocks[1], "openai.example.com")
	waitCharged(t, c, "spend_per_key", "Bearer sk-alice", 20*dollar-(400+800))
	// The default price, 1000 × 2.00 + 500 × 8.00, in each of the three.
	c = run(blocks[2], "openai.example.com")
	waitCharged(t, c, "key", "Bearer sk-alice", 20*dollar-6000)
	waitCharged(t, c, "team", "research", 200*dollar-6000)
	waitCharged(t, c, "org", "org", 1000*dollar-6000)
}

// A response that names no model is priced as the request's model, read
// with the request's body.
func TestChargeUSDPricesAResponseWithoutModelByTheRequests(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}`)
	}))
	t.Cleanup(up.Close)
	c := startCaddyWith(t, "metrics", loginSite(strings.TrimPrefix(up.URL, "http://"), `
		zone spend {
			key {http.request.header.Authorization}
			quota 1 usd per day
			charge usd {
				model cheap* input 1 output 2
				default input 100 output 100
			}
		}`, ""))
	if res := post(t, c, "/v1/chat/completions", "Bearer nomodel", []byte(`{"model":"cheap-1","messages":[]}`), false, nil); res.Status != 200 {
		t.Fatalf("%d %s", res.Status, res.Body)
	}
	// cheap-1's prices, 100 × 1 + 10 × 2; the default would be 11000.
	waitCharged(t, c, "spend", "Bearer nomodel", dollar-120)
}

// Two rate_limit handlers on one request read its body once: the outer
// one's zone with include_usage off, the inner one's adding it; the inner
// one strips the usage chunk, so the client gets the stream it asked for,
// and its zone is charged exactly.
func TestIncludeUsageAcrossTwoHandlers(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	zone := func(name, extra string) string {
		return `
		zone ` + name + ` {
			key {http.request.header.Authorization}
			quota 1000000 per day
			charge tokens` + extra + `
		}`
	}
	c := startCaddyWith(t, "metrics", `http:// {
	route {
		rate_limit {`+zone("outer", "\n\t\t\tinclude_usage off\n\t\t\testimate request")+`
		}
		rate_limit {`+zone("inner", "")+`
		}
		reverse_proxy `+u.Addr+`
	}
}
`)
	res := post(t, c, "/v1/chat/completions", "Bearer two", chatStream, false, llmupstream.Usage{Input: 17, Output: 23}.Header())
	if res.Status != 200 || strings.Contains(res.Body, `"usage"`) || !strings.Contains(string(lastBody(t, u)), `"include_usage":true`) {
		t.Fatalf("%d: the client got\n%s\nthe upstream %s", res.Status, res.Body, lastBody(t, u))
	}
	waitCharged(t, c, "inner", "Bearer two", 1000000-40)
}

// A stream whose stream_options is null (as clients that write every
// optional field send it) does not ask for its usage either: it is made to,
// its client gets the stream without it, and the zone charges the usage.
func TestIncludeUsageReplacesAStreamOptionsOfNull(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	c := startCaddy(t, loginSite(u.Addr, spendZone(""), ""))
	usage := llmupstream.Usage{Input: 17, Output: 23}
	body := []byte(`{"model":"m","messages":[],"stream":true,"stream_options":null,"max_tokens":40}`)
	res := post(t, c, "/v1/chat/completions", "Bearer null", body, false, usage.Header())
	want := `{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_tokens":40}`
	if got := lastBody(t, u); string(got) != want {
		t.Fatalf("the upstream got %s, want %s", got, want)
	}
	if res.Status != 200 || strings.Contains(res.Body, `"usage"`) || !strings.HasSuffix(res.Body, "data: [DONE]\n\n") {
		t.Fatalf("the client got %d\n%s\nwant the stream without usage", res.Status, res.Body)
	}
	waitCharged(t, c, "spend", "Bearer null", dollar-(17+2*23))
}

// The OpenAI proxy of docs/llm.md, copied, in front of an upstream that
// compresses its JSON for a client that accepts it (as a provider's front
// does, and as every SDK's HTTP client asks): the usage is read and charged,
// not the estimate.
func TestLLMDocsProxyReadsTheUsageOfACompressingUpstream(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		var out io.Writer = w
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			z := gzip.NewWriter(w)
			defer z.Close()
			out = z
		}
		_, _ = io.WriteString(out, `{"id":"c","object":"chat.completion","model":"gpt-4.1-mini-2025-04-14","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":500,"total_tokens":1500}}`)
	}))
	t.Cleanup(up.Close)
	block := caddyfileBlocks(t, "docs/llm.md")[1]
	text := strings.NewReplacer("openai.example.com {", "http:// {", "https://api.openai.com", up.URL).Replace(block.text)
	c := newCaddyInstance(t)
	c.Start(c.Caddyfile("", text), "caddyfile")
	body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":600}`)
	if res := post(t, c, "/v1/chat/completions", "Bearer sk-alice", body, false, http.Header{"Accept-Encoding": {"gzip"}}); res.Status != 200 {
		t.Fatalf("%s: %d %s", block.where, res.Status, res.Body)
	}
	// gpt-4.1-mini: 1000 × 0.40 + 500 × 1.60 dollars a million tokens.
	waitCharged(t, c, "spend_per_key", "Bearer sk-alice", 20*dollar-(400+800))
}
