// Package llmupstream is a model LLM upstream for the tests: one HTTP
// handler that answers each common LLM API the way its provider documents
// it (bodies recorded from the providers' API references), JSON and
// streaming, with the token usage each request asks for in its headers, so
// that a test knows exactly what a response reports.
//
// Endpoints (POST; the request's JSON body says whether it streams, as
// each API has it):
//
//   - /v1/chat/completions: OpenAI Chat Completions. "stream": true gives
//     server-sent chunks, each with "usage": null and the usage chunk
//     (empty choices) before data: [DONE] only when the request sets
//     stream_options.include_usage, as OpenAI does.
//   - /v1/responses: OpenAI Responses. Streaming ends with the event
//     X-Final-Event names: completed (default), incomplete or failed, each
//     carrying response.usage.
//   - /v1/messages: Anthropic Messages. Streaming: message_start with the
//     input counts and output_tokens 1 (Anthropic's placeholder), content
//     events, X-Deltas (default 1) message_delta events with the cumulative
//     output count, message_stop. X-Input-In-Delta: 1 repeats the input
//     counts in every message_delta (a compatible backend's way: the
//     count is set, never added). X-Cut: after-start ends the stream after
//     message_start and its content, as an upstream that breaks off does.
//   - /v1beta/models/{model}:generateContent and :streamGenerateContent:
//     Gemini. The stream is server-sent events with alt=sse, else (the
//     REST default) one JSON array of the same chunks, each written as it
//     comes. Every streamed chunk carries usageMetadata, cumulative: the
//     last one is the total.
//   - /api/chat, /api/generate: Ollama's native API, streaming by default
//     as NDJSON (application/x-ndjson), "stream": false for one JSON
//     object; the counts are on the done object.
//
// The usage (Usage, from the request's headers): X-Input-Tokens (every
// input token, cached ones included; default 30), X-Cached-Tokens (the
// part of the input read from a cache), X-Cache-Creation-Tokens
// (Anthropic: the part written to the cache), X-Output-Tokens (every
// output token, reasoning included; default 12), X-Reasoning-Tokens (the
// part of the output spent reasoning), X-Model (default: a model of the
// API's provider). X-Chunks (default 3) is how many content chunks a
// stream has; X-Pace-Ms the pause after each (the model's pace).
// X-Together: n holds the response until n requests that carry the header
// have arrived (10 s at most): they are all in flight at once.
package llmupstream

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Usage is what a response reports, as tally's token scanner reads it:
// Input counts cached input, Output counts reasoning.
type Usage struct {
	Input         int64
	Cached        int64 // of Input, read from a prompt cache
	CacheCreation int64 // of Input, written to the cache (Anthropic)
	Output        int64
	Reasoning     int64 // of Output
	Model         string
}

// Total is Input + Output.
func (u Usage) Total() int64 { return u.Input + u.Output }

// SetHeaders asks the upstream for u on h (a request's headers).
func (u Usage) SetHeaders(h http.Header) {
	h.Set("X-Input-Tokens", strconv.FormatInt(u.Input, 10))
	h.Set("X-Cached-Tokens", strconv.FormatInt(u.Cached, 10))
	h.Set("X-Cache-Creation-Tokens", strconv.FormatInt(u.CacheCreation, 10))
	h.Set("X-Output-Tokens", strconv.FormatInt(u.Output, 10))
	h.Set("X-Reasoning-Tokens", strconv.FormatInt(u.Reasoning, 10))
	if u.Model != "" {
		h.Set("X-Model", u.Model)
	}
}

// Header is u as request headers.
func (u Usage) Header() http.Header {
	h := http.Header{}
	u.SetHeaders(h)
	return h
}

func usageOf(h http.Header, model string) Usage {
	n := func(name string, def int64) int64 {
		if v, err := strconv.ParseInt(h.Get(name), 10, 64); err == nil {
			return v
		}
		return def
	}
	u := Usage{Input: n("X-Input-Tokens", 30), Cached: n("X-Cached-Tokens", 0), CacheCreation: n("X-Cache-Creation-Tokens", 0),
		Output: n("X-Output-Tokens", 12), Reasoning: n("X-Reasoning-Tokens", 0), Model: h.Get("X-Model")}
	if u.Model == "" {
		u.Model = model
	}
	return u
}

// Request is one request the upstream received.
type Request struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
}

// Server is a running model upstream.
type Server struct {
	URL  string // http://127.0.0.1:port
	Addr string // 127.0.0.1:port

	mu       sync.Mutex
	reqs     []Request
	arrived  int           // requests that carry X-Together since the last release
	together chan struct{} // closed when the X-Together count is reached
}

// maxKept is how many requests a Server keeps (the latest).
const maxKept = 256

// Start starts a model upstream on a loopback port, closed when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	s.Addr = strings.TrimPrefix(srv.URL, "http://")
	return s
}

// Requests are the requests received so far, the oldest first (at most
// the latest 256).
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// request is what the handler reads of a request's body.
type request struct {
	Stream        *bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Model string `json:"model"`
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	s.mu.Lock()
	s.reqs = append(s.reqs, Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
	if len(s.reqs) > maxKept {
		s.reqs = s.reqs[len(s.reqs)-maxKept:]
	}
	s.mu.Unlock()
	var req request
	if len(body) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, `{"error":"the request body is not JSON"}`, http.StatusBadRequest)
			return
		}
	}
	if n, err := strconv.Atoi(r.Header.Get("X-Together")); err == nil && n > 0 {
		s.hold(n)
	}
	o := out{w: w, chunks: 3}
	if v, err := strconv.Atoi(r.Header.Get("X-Chunks")); err == nil && v >= 0 {
		o.chunks = v
	}
	if v, err := strconv.Atoi(r.Header.Get("X-Pace-Ms")); err == nil {
		o.pace = time.Duration(v) * time.Millisecond
	}
	stream := req.Stream != nil && *req.Stream
	path := r.URL.Path
	switch {
	case path == "/v1/chat/completions":
		u := usageOf(r.Header, modelOr(req.Model, "gpt-4.1-mini-2025-04-14"))
		if stream {
			o.chatStream(u, req.StreamOptions.IncludeUsage)
		} else {
			o.json(chatJSON(u))
		}
	case path == "/v1/responses":
		u := usageOf(r.Header, modelOr(req.Model, "gpt-4.1-2025-04-14"))
		if stream {
			o.responsesStream(u, r.Header.Get("X-Final-Event"))
		} else {
			o.json(responseObject(u, "completed"))
		}
	case path == "/v1/messages":
		u := usageOf(r.Header, modelOr(req.Model, "claude-sonnet-4-20250514"))
		if stream {
			deltas, _ := strconv.Atoi(r.Header.Get("X-Deltas"))
			o.anthropicStream(u, max(deltas, 1), r.Header.Get("X-Input-In-Delta") == "1", r.Header.Get("X-Cut") == "after-start")
		} else {
			o.json(anthropicJSON(u))
		}
	case strings.HasPrefix(path, "/v1beta/models/"):
		model, method, _ := strings.Cut(strings.TrimPrefix(path, "/v1beta/models/"), ":")
		u := usageOf(r.Header, model)
		switch method {
		case "generateContent":
			o.json(geminiChunk(u, "Hello! How can I help you today?", u.Output-u.Reasoning, true))
		case "streamGenerateContent":
			o.geminiStream(u, r.URL.Query().Get("alt") == "sse")
		default:
			http.NotFound(w, r)
		}
	case path == "/api/chat" || path == "/api/generate":
		u := usageOf(r.Header, modelOr(req.Model, "llama3.2"))
		if req.Stream == nil || *req.Stream { // Ollama streams unless told not to
			o.ollamaStream(u, path == "/api/chat")
		} else {
			o.json(ollamaDone(u, path == "/api/chat", "Hello! How are you today?"))
		}
	default:
		http.NotFound(w, r)
	}
}

// hold returns once n requests that called it have arrived, or after 10 s.
func (s *Server) hold(n int) {
	s.mu.Lock()
	if s.together == nil {
		s.together = make(chan struct{})
	}
	release := s.together
	if s.arrived++; s.arrived >= n {
		close(release)
		s.together, s.arrived = nil, 0
	}
	s.mu.Unlock()
	select {
	case <-release:
	case <-time.After(10 * time.Second):
	}
}

func modelOr(m, def string) string {
	if m != "" {
		return m
	}
	return def
}

// out writes one response.
type out struct {
	w      http.ResponseWriter
	chunks int
	pace   time.Duration
}

func (o out) json(body string) {
	o.w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(o.w, body)
}

// start begins a stream of this content type.
func (o out) start(contentType string) {
	o.w.Header().Set("Content-Type", contentType)
	o.w.Header().Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
}

// send writes and flushes one piece of a stream, then waits the pace.
func (o out) send(format string, args ...any) {
	fmt.Fprintf(o.w, format, args...)
	_ = http.NewResponseController(o.w).Flush()
	if o.pace > 0 {
		time.Sleep(o.pace) // the model's pace, not synchronisation
	}
}

// event writes one server-sent event with a name.
func (o out) event(name, data string) { o.send("event: %s\ndata: %s\n\n", name, data) }

// q is s as a JSON string.
func q(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// OpenAI Chat Completions (platform.openai.com/docs/api-reference/chat).

func chatUsage(u Usage) string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":%d,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`,
		u.Input, u.Output, u.Total(), u.Cached, u.Reasoning)
}

func chatJSON(u Usage) string {
	return fmt.Sprintf(`{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":%s,"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I assist you today?","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":%s,"service_tier":"default"}`,
		q(u.Model), chatUsage(u))
}

func (o out) chatStream(u Usage, includeUsage bool) {
	o.start("text/event-stream")
	usageNull := ""
	if includeUsage {
		usageNull = `,"usage":null`
	}
	head := fmt.Sprintf(`"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":%s,"system_fingerprint":"fp_44709d6fcb"`, q(u.Model))
	o.send("data: {%s,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]%s}\n\n", head, usageNull)
	for i := range o.chunks {
		o.send("data: {%s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"logprobs\":null,\"finish_reason\":null}]%s}\n\n", head, i, usageNull)
	}
	o.send("data: {%s,\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]%s}\n\n", head, usageNull)
	if includeUsage {
		o.send("data: {%s,\"choices\":[],\"usage\":%s}\n\n", head, chatUsage(u))
	}
	o.send("data: [DONE]\n\n")
}

// OpenAI Responses (platform.openai.com/docs/api-reference/responses and
// its streaming events).

func responseObject(u Usage, status string) string {
	usage := fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":%d},"total_tokens":%d}`,
		u.Input, u.Cached, u.Output, u.Reasoning, u.Total())
	if status == "in_progress" {
		usage = "null"
	}
	errField, incomplete := "null", "null"
	switch status {
	case "failed":
		errField = `{"code":"server_error","message":"The model failed to generate a response."}`
	case "incomplete":
		incomplete = `{"reason":"max_output_tokens"}`
	}
	return fmt.Sprintf(`{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":%q,"error":%s,"incomplete_details":%s,"instructions":null,"max_output_tokens":null,"model":%s,"output":[{"type":"message","id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":%s,"user":null,"metadata":{}}`,
		status, errField, incomplete, q(u.Model), usage)
}

func (o out) responsesStream(u Usage, final string) {
	if final == "" {
		final = "completed"
	}
	o.start("text/event-stream")
	seq := 0
	ev := func(name, rest string) {
		o.event(name, fmt.Sprintf(`{"type":%q,"sequence_number":%d,%s}`, name, seq, rest))
		seq++
	}
	ev("response.created", `"response":`+responseObject(u, "in_progress"))
	ev("response.in_progress", `"response":`+responseObject(u, "in_progress"))
	ev("response.output_item.added", `"output_index":0,"item":{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"in_progress","role":"assistant","content":[]}`)
	ev("response.content_part.added", `"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}`)
	for i := range o.chunks {
		ev("response.output_text.delta", fmt.Sprintf(`"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"t%d "`, i))
	}
	ev("response.output_text.done", `"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"text":"t0 t1 t2"`)
	ev("response.content_part.done", `"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"part":{"type":"output_text","text":"t0 t1 t2","annotations":[]}`)
	ev("response.output_item.done", `"output_index":0,"item":{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"t0 t1 t2","annotations":[]}]}`)
	ev("response."+final, `"response":`+responseObject(u, final))
}

// Anthropic Messages (docs.anthropic.com/en/api/messages and
// /en/docs/build-with-claude/streaming).

// anthropicInput is the input_tokens Anthropic reports: the input not read
// from or written to the cache.
func anthropicInput(u Usage) int64 { return u.Input - u.Cached - u.CacheCreation }

func anthropicJSON(u Usage) string {
	return fmt.Sprintf(`{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":%s,"content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d}}`,
		q(u.Model), anthropicInput(u), u.CacheCreation, u.Cached, u.Output)
}

func (o out) anthropicStream(u Usage, deltas int, inputInDelta, cut bool) {
	o.start("text/event-stream")
	o.event("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":%s,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":1}}}`,
		q(u.Model), anthropicInput(u), u.CacheCreation, u.Cached))
	o.event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	o.event("ping", `{"type": "ping"}`)
	for i := range o.chunks {
		o.event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"t%d "}}`, i))
	}
	if cut {
		return
	}
	o.event("content_block_stop", `{"type":"content_block_stop","index":0}`)
	for i := 1; i <= deltas; i++ {
		in := ""
		if inputInDelta {
			in = fmt.Sprintf(`"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,`, anthropicInput(u), u.CacheCreation, u.Cached)
		}
		o.event("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{%s"output_tokens":%d}}`, in, u.Output*int64(i)/int64(deltas)))
	}
	o.event("message_stop", `{"type":"message_stop"}`)
}

// Gemini (ai.google.dev/api/generate-content).

func geminiChunk(u Usage, text string, candidates int64, last bool) string {
	finish, thoughts := "", ""
	if last {
		finish = `,"finishReason":"STOP"`
	}
	if u.Reasoning > 0 {
		thoughts = fmt.Sprintf(`,"thoughtsTokenCount":%d`, u.Reasoning)
	}
	cached := ""
	if u.Cached > 0 {
		cached = fmt.Sprintf(`,"cachedContentTokenCount":%d`, u.Cached)
	}
	return fmt.Sprintf(`{"candidates":[{"content":{"parts":[{"text":%s}],"role":"model"}%s,"index":0}],"usageMetadata":{"promptTokenCount":%d,"candidatesTokenCount":%d,"totalTokenCount":%d%s%s,"promptTokensDetails":[{"modality":"TEXT","tokenCount":%d}]},"modelVersion":%s,"responseId":"mWuRaOzqBMGQ0ogP2tXr-Ak"}`,
		q(text), finish, u.Input, candidates, u.Input+candidates+u.Reasoning, cached, thoughts, u.Input, q(u.Model))
}

// geminiStream writes the chunks as events (sse) or as one JSON array's
// elements, as Google does without alt=sse: "[" before the first, "\r\n,"
// before each other, "]" after the last.
func (o out) geminiStream(u Usage, sse bool) {
	if sse {
		o.start("text/event-stream")
	} else {
		o.start("application/json; charset=UTF-8")
	}
	visible := u.Output - u.Reasoning
	n := max(o.chunks, 1)
	for i := 1; i <= n; i++ {
		chunk := geminiChunk(u, fmt.Sprintf("t%d ", i), visible*int64(i)/int64(n), i == n)
		switch {
		case sse:
			o.send("data: %s\r\n\r\n", chunk)
		case i == 1:
			o.send("[%s", chunk)
		default:
			o.send("\r\n,%s", chunk)
		}
	}
	if !sse {
		o.send("]")
	}
}

// Ollama (github.com/ollama/ollama, docs/api.md).

func ollamaDone(u Usage, chat bool, text string) string {
	return fmt.Sprintf(`{"model":%s,"created_at":"2023-12-12T14:13:43.416799Z",%s,"done":true,"done_reason":"stop","total_duration":5191566416,"load_duration":2154458,"prompt_eval_count":%d,"prompt_eval_duration":383809000,"eval_count":%d,"eval_duration":4799921000}`,
		q(u.Model), ollamaText(chat, text), u.Input, u.Output)
}

func ollamaText(chat bool, text string) string {
	if chat {
		return `"message":{"role":"assistant","content":` + q(text) + `}`
	}
	return `"response":` + q(text)
}

func (o out) ollamaStream(u Usage, chat bool) {
	o.start("application/x-ndjson")
	for i := range o.chunks {
		o.send(`{"model":%s,"created_at":"2023-08-04T08:52:19.385406455-07:00",%s,"done":false}`+"\n", q(u.Model), ollamaText(chat, fmt.Sprintf("t%d ", i)))
	}
	o.send("%s\n", ollamaDone(u, chat, ""))
}
