package usage

import (
	"fmt"
	"strings"
	"testing"
)

// scanTokens runs body through a token scanner in chunks of n bytes (0:
// at once).
func scanTokens(contentType, encoding, body string, n int) (Tokens, Reason) {
	var s Scanner
	s.StartTokens(contentType, encoding)
	if n <= 0 {
		n = len(body) + 1
	}
	for len(body) > 0 {
		k := min(n, len(body))
		s.Write([]byte(body[:k]))
		body = body[k:]
	}
	return s.Tokens()
}

// sse is events as a text/event-stream body, each "name\tdata".
func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		name, data, ok := strings.Cut(e, "\t")
		if ok {
			fmt.Fprintf(&b, "event: %s\n", name)
		} else {
			data = name
		}
		fmt.Fprintf(&b, "data: %s\n\n", data)
	}
	return b.String()
}

type tokenCase struct {
	name, contentType, body string
	want                    Tokens
	reason                  Reason
}

var tokenCases = []tokenCase{
	{"openai chat json", "application/json",
		`{"id":"chatcmpl-B9","object":"chat.completion","model":"gpt-4.1-2025-04-14","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":3}}}`,
		Tokens{Input: 19, CachedInput: 4, Output: 10, Model: "gpt-4.1-2025-04-14", Format: OpenAIChat}, OK},
	{"openai chat stream", "text/event-stream", sse(
		`{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}`,
		`{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":2,"total_tokens":10}}`,
		`[DONE]`),
		Tokens{Input: 8, Output: 2, Model: "gpt-4o-mini", Format: OpenAIChat}, OK},
	{"openai chat stream without usage", "text/event-stream", sse(
		`{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"}}]}`, `[DONE]`),
		Tokens{}, NoUsage},
	{"vllm usage chunk with choices null", "text/event-stream", sse(
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":null,"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}`, `[DONE]`),
		Tokens{Input: 5, Output: 6, Model: "m", Format: OpenAIChat}, OK},
	{"responses json", "application/json",
		`{"id":"resp_1","object":"response","status":"completed","model":"gpt-4.1","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}],"text":{"format":{"type":"text"}},"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":6},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":20},"total_tokens":123}}`,
		Tokens{Input: 36, CachedInput: 6, Output: 87, Model: "gpt-4.1", Format: OpenAIResponses}, OK},
	{"responses stream completed", "text/event-stream", sse(
		"response.created\t"+`{"type":"response.created","response":{"object":"response","model":"gpt-4.1","usage":null}}`,
		"response.output_item.added\t"+`{"type":"response.output_item.added","item":{"type":"message","status":"in_progress"}}`,
		"response.output_text.delta\t"+`{"type":"response.output_text.delta","delta":"Hi"}`,
		"response.completed\t"+`{"type":"response.completed","response":{"object":"response","model":"gpt-4.1","usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":0},"output_tokens":9,"total_tokens":16}}}`),
		Tokens{Input: 7, Output: 9, Model: "gpt-4.1", Format: OpenAIResponses}, OK},
	{"responses stream incomplete", "text/event-stream", sse(
		"response.incomplete\t" + `{"type":"response.incomplete","response":{"status":"incomplete","model":"o3","usage":{"input_tokens":7,"output_tokens":100,"total_tokens":107}}}`),
		Tokens{Input: 7, Output: 100, Model: "o3", Format: OpenAIResponses}, OK},
	{"responses stream failed", "text/event-stream", sse(
		"response.failed\t" + `{"type":"response.failed","response":{"status":"failed","model":"o3","usage":{"input_tokens":7,"output_tokens":0,"total_tokens":7}}}`),
		Tokens{Input: 7, Model: "o3", Format: OpenAIResponses}, OK},
	{"anthropic json", "application/json",
		`{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":2095,"output_tokens":503,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000}}`,
		Tokens{Input: 3195, CachedInput: 1000, Output: 503, Model: "claude-sonnet-4-20250514", Format: Anthropic}, OK},
	{"anthropic stream, cumulative deltas", "text/event-stream", sse(
		"message_start\t"+`{"type":"message_start","message":{"id":"m","type":"message","model":"claude-opus-4","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}`,
		"content_block_delta\t"+`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
		"message_delta\t"+`{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":10}}`,
		"message_delta\t"+`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`,
		"message_stop\t"+`{"type":"message_stop"}`),
		Tokens{Input: 30, CachedInput: 5, Output: 15, Model: "claude-opus-4", Format: Anthropic}, OK},
	{"anthropic stream, input repeated in message_delta: set, not added", "text/event-stream", sse(
		"message_start\t"+`{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}`,
		"message_delta\t"+`{"type":"message_delta","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":15}}`),
		Tokens{Input: 30, CachedInput: 5, Output: 15, Model: "claude", Format: Anthropic}, OK},
	{"anthropic stream, input only in message_delta", "text/event-stream", sse(
		"message_start\t"+`{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":0,"output_tokens":0}}}`,
		"message_delta\t"+`{"type":"message_delta","usage":{"input_tokens":40,"output_tokens":15}}`),
		Tokens{Input: 40, Output: 15, Model: "claude", Format: Anthropic}, OK},
	{"anthropic stream cut after message_start", "text/event-stream", sse(
		"message_start\t"+`{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":25,"output_tokens":1}}}`,
		"content_block_delta\t"+`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`),
		Tokens{}, NoUsage},
	{"gemini json", "application/json",
		`{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":12,"totalTokenCount":35,"cachedContentTokenCount":2,"thoughtsTokenCount":10,"toolUsePromptTokenCount":5,"promptTokensDetails":[{"modality":"TEXT","tokenCount":8}]},"modelVersion":"gemini-2.5-flash"}`,
		Tokens{Input: 13, CachedInput: 2, Output: 22, Model: "gemini-2.5-flash", Format: Gemini}, OK},
	{"gemini stream: cumulative, the last counts", "text/event-stream", strings.ReplaceAll(sse(
		`{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":3,"totalTokenCount":11},"modelVersion":"gemini-2.0-flash"}`,
		`{"candidates":[{"content":{"parts":[{"text":"b"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":7,"totalTokenCount":15},"modelVersion":"gemini-2.0-flash"}`), "\n", "\r\n"),
		Tokens{Input: 8, Output: 7, Model: "gemini-2.0-flash", Format: Gemini}, OK},
	{"ollama json", "application/json",
		`{"model":"llama3.2","created_at":"2023-12-12T14:13:43.416799Z","message":{"role":"assistant","content":"Hello!"},"done":true,"total_duration":5191566416,"prompt_eval_count":26,"prompt_eval_duration":383809000,"eval_count":298,"eval_duration":4799921000}`,
		Tokens{Input: 26, Output: 298, Model: "llama3.2", Format: Ollama}, OK},
	{"ollama ndjson", "application/x-ndjson",
		`{"model":"llama3.2","response":"The","done":false}` + "\n" + `{"model":"llama3.2","response":" sky","done":false}` + "\r\n" +
			`{"model":"llama3.2","response":"","done":true,"prompt_eval_count":26,"eval_count":290}`,
		Tokens{Input: 26, Output: 290, Model: "llama3.2", Format: Ollama}, OK},
	{"ndjson with a broken line", "application/x-ndjson", `{"model":"m","eval_count":3` + "\n",
		Tokens{}, Malformed},
	{"no usage", "application/json", `{"id":"x","choices":[]}`, Tokens{}, NoUsage},
	{"gemini stream without alt=sse: one JSON array", "application/json", `[{"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":2}}]`,
		Tokens{Input: 1, Output: 2, Format: Gemini}, OK},
	{"an array of other formats' documents has no usage", "application/json",
		`[{"model":"m","usage":{"prompt_tokens":1,"completion_tokens":2}},{"type":"message","usage":{"input_tokens":1,"output_tokens":2}},{"model":"o","eval_count":3}]`,
		Tokens{}, NoUsage},
	{"an array of values that are no documents", "application/json", `[1,"usageMetadata",true,null,[{"usageMetadata":{"promptTokenCount":1}}],[]]`, Tokens{}, NoUsage},
	{"an empty array", "application/json", ` [ ] `, Tokens{}, NoUsage},
	{"an array cut mid-chunk keeps the chunks it completed", "application/json",
		`[{"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":1},"modelVersion":"g"},{"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":`,
		Tokens{Input: 4, Output: 1, Model: "g", Format: Gemini}, OK},
	{"an array cut before any usage", "application/json", `[{"usageMetadata":{"promptTokenCount":4`, Tokens{}, Malformed},
	{"a gemini chunk with another format's usage too counts as gemini in an array", "application/json",
		`[{"usage":{"prompt_tokens":9,"completion_tokens":9},"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":2}}]`,
		Tokens{Input: 1, Output: 2, Format: Gemini}, OK},
	{"a value after the array: the chunks read as they came count", "application/json", `[{"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":2}}][]`,
		Tokens{Input: 1, Output: 2, Format: Gemini}, OK},
	{"a model with an escape is kept as written", "application/json", `{"model":"a\"b","usage":{"prompt_tokens":1,"completion_tokens":1}}`,
		Tokens{Input: 1, Output: 1, Model: `a\"b`, Format: OpenAIChat}, OK},
	{"the later usage document wins", "text/event-stream", sse(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`, `{"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":6}}`),
		Tokens{Input: 5, Output: 6, Format: Gemini}, OK},
	{"truncated json", "application/json", `{"usage":{"prompt_tokens":3,"completion_tokens":4}`, Tokens{}, Malformed},
	{"plain text", "text/plain", `{"usage":{"prompt_tokens":3,"completion_tokens":4}}`, Tokens{}, NotJSON},
	{"model bounded", "application/json", `{"model":"` + strings.Repeat("m", 300) + `","usage":{"prompt_tokens":1,"completion_tokens":1}}`,
		Tokens{Input: 1, Output: 1, Model: strings.Repeat("m", MaxModel), Format: OpenAIChat}, OK},
	{"a model in content is not the model", "application/json", `{"choices":[{"message":{"model":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`,
		Tokens{Input: 1, Output: 1, Format: OpenAIChat}, OK},
}

func TestTokenFormats(t *testing.T) {
	for _, c := range tokenCases {
		for _, n := range []int{0, 1, 2, 7, 64} {
			got, reason := scanTokens(c.contentType, "", c.body, n)
			if got != c.want || reason != c.reason {
				t.Errorf("%s, in chunks of %d: %+v, %v; want %+v, %v", c.name, n, got, reason, c.want, c.reason)
			}
		}
	}
}

// geminiChunks are a stream's chunks as Google sends them, cumulative
// usage in each.
var geminiChunks = []string{
	`{"candidates": [{"content": {"parts": [{"text": "The"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 8,"totalTokenCount": 8,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 8}]},"modelVersion": "gemini-2.5-flash","responseId": "mWuRaOzqBMGQ0ogP2tXr-Ak"}`,
	`{"candidates": [{"content": {"parts": [{"text": " sky \"is\" blue"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 8,"candidatesTokenCount": 5,"totalTokenCount": 30,"thoughtsTokenCount": 17},"modelVersion": "gemini-2.5-flash","responseId": "mWuRaOzqBMGQ0ogP2tXr-Ak"}`,
	`{"candidates": [{"content": {"parts": [{"text": "."}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 8,"candidatesTokenCount": 9,"totalTokenCount": 34,"cachedContentTokenCount": 3,"thoughtsTokenCount": 17},"modelVersion": "gemini-2.5-flash","responseId": "mWuRaOzqBMGQ0ogP2tXr-Ak"}`,
}

// TestGeminiArrayReadsAsItsEvents: streamGenerateContent without alt=sse
// answers one JSON array of the chunks alt=sse sends as events; it gives
// the same usage, split anywhere.
func TestGeminiArrayReadsAsItsEvents(t *testing.T) {
	want, reason := scanTokens("text/event-stream", "", sse(geminiChunks...), 0)
	if reason != OK || want != (Tokens{Input: 8, CachedInput: 3, Output: 26, Model: "gemini-2.5-flash", Format: Gemini}) {
		t.Fatalf("the event stream: %+v, %v", want, reason)
	}
	body := "[" + strings.Join(geminiChunks, "\r\n,\r\n") + "]"
	for i := range len(body) + 1 {
		var s Scanner
		s.StartTokens("application/json; charset=UTF-8", "")
		s.Write([]byte(body[:i]))
		s.Write([]byte(body[i:]))
		if got, r := s.Tokens(); got != want || r != OK {
			t.Fatalf("split at %d: %+v, %v; want %+v", i, got, r, want)
		}
	}
	if got, r := scanTokens("application/json", "", body, 1); got != want || r != OK {
		t.Errorf("byte by byte: %+v, %v; want %+v", got, r, want)
	}
	// charge json reads no array's elements.
	if n, r := scan(mustPaths(t, "usageMetadata.totalTokenCount"), "application/json", "", body, 0); r != NoUsage {
		t.Errorf("charge json: %d, %v; want no usage", n, r)
	}
}

// TestGeminiArrayNesting: each of the array's documents may nest
// MaxDepth deep, as an event's data may, and no deeper.
func TestGeminiArrayNesting(t *testing.T) {
	nested := func(depth int) string { // a chunk whose deepest value is depth levels down
		return `{"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":2},"x":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + "}"
	}
	for _, c := range []struct {
		depth  int
		reason Reason
	}{{MaxDepth, OK}, {MaxDepth + 1, Malformed}} {
		chunk := nested(c.depth)
		if _, r := scanTokens("text/event-stream", "", sse(chunk), 0); r != c.reason {
			t.Errorf("as an event, %d deep: %v, want %v", c.depth, r, c.reason)
		}
		if _, r := scanTokens("application/json", "", "["+chunk+"]", 0); r != c.reason {
			t.Errorf("in an array, %d deep: %v, want %v", c.depth, r, c.reason)
		}
	}
}

func TestTokensEncodedBodyIsNotScanned(t *testing.T) {
	if _, reason := scanTokens("application/json", "gzip", tokenCases[0].body, 0); reason != Encoded {
		t.Errorf("gzip: %v, want encoded", reason)
	}
}

// TestTokensOfAnEventLargerThanMaxEvent: the Responses API's last event
// repeats the whole response before its usage, an Ollama line its whole
// message; a long answer's is read as it comes.
func TestTokensOfAnEventLargerThanMaxEvent(t *testing.T) {
	text := strings.Repeat("All work and no play. ", MaxEvent/10)
	responses := sse("response.created\t"+`{"type":"response.created","response":{"model":"gpt-4.1","usage":null}}`,
		"response.completed\t"+`{"type":"response.completed","response":{"model":"gpt-4.1","output":[{"content":[{"text":"`+text+`"}]}],"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":30000}}}`)
	ollama := `{"model":"llama3.2","message":{"content":"` + text + `"},"done":true,"prompt_eval_count":10,"eval_count":30000}` + "\n"
	for _, c := range []struct{ name, contentType, body string }{
		{"responses stream", "text/event-stream", responses},
		{"ollama line", "application/x-ndjson", ollama},
	} {
		for _, n := range []int{0, 1, 7, 4096} {
			got, why := scanTokens(c.contentType, "", c.body, n)
			if why != OK || got.Input != 10 || got.Output != 30000 {
				t.Errorf("%s in chunks of %d: %+v, %v; want 10 in, 30000 out", c.name, n, got, why)
			}
		}
	}
}

// TestTokensLargeStreamBoundedMemory: a stream far larger than MaxEvent
// keeps the scanner's buffer within MaxEvent.
func TestTokensLargeStreamBoundedMemory(t *testing.T) {
	var s Scanner
	s.StartTokens("text/event-stream", "")
	chunk := []byte(sse(`{"choices":[{"delta":{"content":"` + strings.Repeat("x", 1000) + `"}}],"usage":null}`))
	for range 8 << 10 {
		s.Write(chunk)
	}
	s.Write([]byte(sse(`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`)))
	if got, reason := s.Tokens(); reason != OK || got.Total() != 7 {
		t.Errorf("%+v, %v", got, reason)
	}
	if c := cap(s.buf); c > MaxEvent {
		t.Errorf("buffer grew to %d", c)
	}
}

func TestTokensAllocationsPerStream(t *testing.T) {
	body := []byte(tokenCases[9].body)
	var s Scanner
	allocs := testing.AllocsPerRun(100, func() {
		s.StartTokens("text/event-stream", "")
		s.Write(body)
		s.Tokens()
	})
	if allocs > 1 { // the model's string
		t.Errorf("%.0f allocations per stream", allocs)
	}
}

func FuzzTokens(f *testing.F) {
	for i, c := range tokenCases {
		f.Add(c.body, uint8(i), 3)
	}
	types := []string{"application/json", "text/event-stream", "application/x-ndjson"}
	f.Fuzz(func(t *testing.T, body string, ct uint8, n int) {
		contentType := types[int(ct)%len(types)]
		got, reason := scanTokens(contentType, "", body, 0)
		if split, r := scanTokens(contentType, "", body, n%19); split != got || r != reason {
			t.Fatalf("split in %d: %+v, %v; at once %+v, %v", n%19, split, r, got, reason)
		}
		if (reason == OK) != (got.Format != FormatNone) || len(got.Model) > MaxModel || got.Input < 0 || got.Output < 0 || got.CachedInput < 0 {
			t.Fatalf("%+v, %v", got, reason)
		}
		// One document reads the same as a JSON body, an NDJSON line and
		// an event's data.
		if reason != OK || contentType != "application/json" || strings.ContainsAny(body, "\r\n") {
			return
		}
		if line, r := scanTokens("application/x-ndjson", "", body, n%19); line != got || r != OK {
			t.Fatalf("as an NDJSON line: %+v, %v; as JSON %+v", line, r, got)
		}
		if event, r := scanTokens("text/event-stream", "", "data: "+body+"\n\n", n%19); event != got || r != OK {
			t.Fatalf("as an event: %+v, %v; as JSON %+v", event, r, got)
		}
		if list, r := scanTokens("application/json", "", "["+body+"]", n%19); got.Format == Gemini && body[0] == '{' && (list != got || r != OK) {
			t.Fatalf("as a gemini array's chunk: %+v, %v; as JSON %+v", list, r, got)
		}
	})
}

// benchStream is an OpenAI chat stream of 200 content chunks and its usage
// chunk (about 30 KiB), and an Anthropic one of as many deltas.
var benchStreams = map[string]string{
	"openai": strings.Repeat(sse(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"token "},"finish_reason":null}],"usage":null}`), 200) +
		sse(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":200,"total_tokens":208}}`, `[DONE]`),
	"anthropic": sse("message_start\t"+`{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":25,"output_tokens":1}}}`) +
		strings.Repeat(sse("content_block_delta\t"+`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"token "}}`), 200) +
		sse("message_delta\t"+`{"type":"message_delta","usage":{"output_tokens":200}}`, "message_stop\t"+`{"type":"message_stop"}`),
}

// BenchmarkScanStream: the token scanner against charge json's path
// scanner on the same streams, written in 512-byte chunks.
func BenchmarkScanStream(b *testing.B) {
	total := mustPaths(b, "usage.total_tokens")
	for _, name := range []string{"openai", "anthropic"} {
		body := []byte(benchStreams[name])
		write := func(w func([]byte)) {
			for p := body; len(p) > 0; p = p[min(512, len(p)):] {
				w(p[:min(512, len(p))])
			}
		}
		b.Run(name+"/tokens", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			var s Scanner
			for b.Loop() {
				s.StartTokens("text/event-stream", "")
				write(s.Write)
				if _, r := s.Tokens(); r != OK {
					b.Fatal(r)
				}
			}
		})
		b.Run(name+"/json_path", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			var s Scanner
			for b.Loop() {
				s.Start(total, "text/event-stream", "")
				write(s.Write)
				s.Total()
			}
		})
	}
}
