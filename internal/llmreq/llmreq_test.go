package llmreq

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/caddy-tally/ratelimit/internal/usage"
)

func TestParseReadsEachAPIsFields(t *testing.T) {
	for _, c := range []struct {
		name, path, body string
		want             Request
	}{
		{"openai chat", "/v1/chat/completions",
			`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hello world!"}],"max_completion_tokens":50,"stream":true}`,
			Request{Model: "gpt-4.1-mini", Prompt: 4 + 12, MaxOutput: 50, Stream: true}},
		{"openai legacy max_tokens, include_usage", "/v1/chat/completions",
			`{"model":"m","messages":[],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
			Request{Model: "m", MaxOutput: 7, Stream: true, IncludeUsage: true}},
		{"responses", "/v1/responses", `{"model":"o4","input":"abcdefgh","instructions":"xy","max_output_tokens":3}`,
			Request{Model: "o4", Prompt: 10, MaxOutput: 3}},
		{"anthropic", "/v1/messages",
			`{"model":"claude-sonnet-4","system":"be brief","max_tokens":1024,"messages":[{"role":"user","content":[{"type":"text","text":"hi \"you\""}]}]}`,
			Request{Model: "claude-sonnet-4", Prompt: 8 + 4 + 4 + 10, MaxOutput: 1024}},
		{"gemini", "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
			`{"contents":[{"parts":[{"text":"abcd"}]}],"generationConfig":{"temperature":0.5,"maxOutputTokens":99}}`,
			Request{Model: "gemini-2.5-flash", Prompt: 4, MaxOutput: 99}},
		{"ollama", "/api/generate", `{"model":"llama3","prompt":"why?","options":{"num_predict":-1}}`,
			Request{Model: "llama3", Prompt: 4, MaxOutput: -1}},
		{"ollama limit", "/api/chat", `{"model":"llama3","messages":[],"options":{"num_predict":42}}`,
			Request{Model: "llama3", MaxOutput: 42}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Parse([]byte(c.body), c.path)
			c.want.Parsed = true
			got.soStart, got.soEnd = 0, 0
			if got != c.want {
				t.Fatalf("Parse = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestParseRejectsWhatIsNotOneObject(t *testing.T) {
	for _, b := range []string{``, `[]`, `{"model":"m"`, `{"model":"m"} {}`, `{"a":[1,2}`, `{"a":"x}`, `{"a" 1}`,
		`{"a":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`} {
		if q := Parse([]byte(b), "/"); q.Parsed || q.MaxOutput != -1 {
			t.Errorf("Parse(%.40q) = %+v, want not parsed", b, q)
		}
	}
}

func TestInputIsThePromptsBytesDividedByFourRoundedUp(t *testing.T) {
	for prompt, want := range map[int64]int64{0: 0, 1: 1, 4: 1, 5: 2, 4000: 1000} {
		if got := (&Request{Prompt: prompt}).Input(); got != want {
			t.Errorf("Input of %d bytes = %d, want %d", prompt, got, want)
		}
	}
}

// A body read over the bound, chunked or in small reads, reaches the
// reader byte for byte, and only a whole body within the bound is returned
// as whole.
func TestReadReplaysEveryByte(t *testing.T) {
	for _, size := range []int{0, 10, 64 << 10, MaxBody, MaxBody + 1, 3 * MaxBody} {
		for _, known := range []bool{true, false} {
			body := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
			r := httptest.NewRequest("POST", "/", iotest.HalfReader(bytes.NewReader(body)))
			r.ContentLength = -1
			if known {
				r.ContentLength = int64(size)
			}
			got, whole := Read(r)
			if wantWhole := size <= MaxBody && (size > 0 || !known); whole != wantWhole && size > 0 {
				t.Errorf("size %d (length known %v): whole = %v, want %v", size, known, whole, wantWhole)
			}
			if whole && !bytes.Equal(got, body) {
				t.Errorf("size %d: the bytes read are not the body", size)
			}
			all, err := io.ReadAll(r.Body)
			if err != nil || !bytes.Equal(all, body) {
				t.Fatalf("size %d (length known %v): the replayed body differs (%d bytes, %v)", size, known, len(all), err)
			}
		}
	}
}

func TestReadErrorReachesTheUpstreamAfterTheBytesRead(t *testing.T) {
	boom := errors.New("boom")
	r := httptest.NewRequest("POST", "/", io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)))
	r.ContentLength = -1
	if _, whole := Read(r); whole {
		t.Fatal("a body whose read failed is whole")
	}
	all, err := io.ReadAll(r.Body)
	if string(all) != "abc" || !errors.Is(err, boom) {
		t.Fatalf("replayed %q, %v; want abc, boom", all, err)
	}
}

func TestWithUsageAddsTheMemberAndNothingElse(t *testing.T) {
	for body, want := range map[string]string{
		`{"stream":true}`:                     `{"stream":true,"stream_options":{"include_usage":true}}`,
		"{\"stream\":true}\n":                 "{\"stream\":true,\"stream_options\":{\"include_usage\":true}}\n",
		`{"stream":true,"stream_options":{}}`: `{"stream":true,"stream_options":{"include_usage":true}}`,
		`{"stream":true,"stream_options":{"include_obfuscation":false}}`:          `{"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}}`,
		`{"stream_options": {"include_usage": false}, "stream": true}`:            `{"stream_options": {"include_usage": true}, "stream": true}`,
		`{"messages":[{"content":"}"}], "stream" : true , "stream_options":null}`: `{"messages":[{"content":"}"}], "stream" : true , "stream_options":{"include_usage":true}}`,
		`{"stream":true,"stream_options":[]}`:                                     ``,
	} {
		q := Parse([]byte(body), "/v1/chat/completions")
		if !q.WantsUsage() {
			t.Fatalf("%s: WantsUsage false", body)
		}
		got := q.WithUsage([]byte(body))
		if string(got) != want {
			t.Errorf("WithUsage(%s) = %s, want %s", body, got, want)
		}
		if got != nil {
			if p := Parse(got, "/"); !p.IncludeUsage || !json.Valid(got) {
				t.Errorf("WithUsage(%s) = %s: not valid, or asks for no usage", body, got)
			}
		}
	}
	for _, body := range []string{`{"stream":false}`, `{"messages":[]}`, `{"stream":true,"stream_options":{"include_usage":true}}`} {
		if q := Parse([]byte(body), "/"); q.WantsUsage() {
			t.Errorf("%s: WantsUsage true", body)
		}
	}
}

func TestSetBodyFixesTheLength(t *testing.T) {
	r := httptest.NewRequest("POST", "/", strings.NewReader("x"))
	r.TransferEncoding = []string{"chunked"}
	SetBody(r, []byte("hello"))
	b, _ := io.ReadAll(r.Body)
	if string(b) != "hello" || r.ContentLength != 5 || r.Header.Get("Content-Length") != "5" || r.TransferEncoding != nil {
		t.Fatalf("body %q, length %d, header %q, te %v", b, r.ContentLength, r.Header.Get("Content-Length"), r.TransferEncoding)
	}
}

// strip runs the stream s through a Strip in pieces of n bytes.
func strip(t *testing.T, s string, n int) string {
	t.Helper()
	var out bytes.Buffer
	var st Strip
	emit := func(b []byte) error { out.Write(b); return nil }
	for i := 0; i < len(s); i += n {
		if err := st.Write([]byte(s[i:min(i+n, len(s))]), emit); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.End(emit); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestStripRemovesWhatAskingForUsageAdded(t *testing.T) {
	asked := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		"data: {\"usage\":null,\"id\":\"c1\",\"choices\":[{\"delta\":{}}]}\r\n\r\n" +
		"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n" +
		"data: [DONE]\n\n"
	want := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{}}]}\r\n\r\n" +
		"data: [DONE]\n\n"
	for _, n := range []int{1, 2, 7, 1 << 20} {
		if got := strip(t, asked, n); got != want {
			t.Fatalf("pieces of %d: got\n%q\nwant\n%q", n, got, want)
		}
	}
	// vLLM's usage chunk: choices null, or none.
	for _, ev := range []string{`data: {"choices":null,"usage":{"total_tokens":1}}` + "\n\n", `data: {"usage":{"total_tokens":1}}` + "\n\n"} {
		if got := strip(t, ev, 3); got != "" {
			t.Errorf("%q passed as %q", ev, got)
		}
	}
}

func TestStripPassesOtherStreamsByteForByte(t *testing.T) {
	long := "data: {\"choices\":[],\"usage\":{\"x\":\"" + strings.Repeat("y", 2*usage.MaxEvent) + "\"}}\n\n"
	for _, s := range []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n",
		"data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"total_tokens\":4}}\n\n",
		": comment\n\ndata: not json\n\n",
		long,
		"data: {\"choices\":[],\"usage\":null", // cut short
	} {
		for _, n := range []int{1, 5, 4096} {
			if got := strip(t, s, n); got != s {
				t.Fatalf("pieces of %d: %.60q came out as %.60q", n, s, got)
			}
		}
	}
}

func TestOutputsLearnsTheP95PerModelInBoundedMemory(t *testing.T) {
	var o Outputs
	if _, ok := o.P95("m"); ok {
		t.Fatal("a p95 with nothing seen")
	}
	for i := range 100 {
		o.Observe("m", int64(10+i%20)) // 10..29
		o.Observe("big", 1000)
	}
	p, _ := o.P95("m")
	if p < 28 || p > 36 {
		t.Fatalf("p95 of 10..29 = %d", p)
	}
	if p, _ := o.P95("big"); p < 1000 || p > 1190 {
		t.Fatalf("p95 of 1000s = %d", p)
	}
	if p, _ := o.P95("unseen"); p < 1000 {
		t.Fatalf("an unseen model's p95 is not the zone's: %d", p)
	}
	// Hostile names: the table stays bounded and the models seen often stay.
	for i := range 10 * maxModels {
		o.Observe(strings.Repeat("x", i%300)+string(rune('a'+i%26)), 5)
	}
	if len(o.models) > maxModels {
		t.Fatalf("%d models kept", len(o.models))
	}
	for m := range o.models {
		if len(m) > usage.MaxModel {
			t.Fatalf("a model name of %d bytes kept", len(m))
		}
	}
	if _, ok := o.models["big"]; !ok {
		t.Fatal("a model seen 100 times was evicted by names seen once")
	}
	// Decay: the recent responses take over.
	for range 4 * halfLife {
		o.Observe("m", 2000)
	}
	if p, _ := o.P95("m"); p < 2000 {
		t.Fatalf("p95 after a shift to 2000 = %d", p)
	}
}

func TestOutputsIsSafeForConcurrentUse(t *testing.T) {
	var o Outputs
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 500 {
				o.Observe(string(rune('a'+(g+i)%80)), int64(i))
				o.P95(string(rune('a' + i%80)))
			}
		})
	}
	wg.Wait()
	if len(o.models) > maxModels {
		t.Fatalf("%d models kept", len(o.models))
	}
}
