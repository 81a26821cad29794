package llmupstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// get posts body to path on s with u's headers and returns the response's
// content type and body, failing unless it is a 200.
func get(t *testing.T, s *Server, path, body, final string, u Usage) (string, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", s.URL+path, strings.NewReader(body))
	u.SetHeaders(req.Header)
	req.Header.Set("X-Final-Event", final)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d, %v", path, body, resp.StatusCode, err)
	}
	return resp.Header.Get("Content-Type"), b
}

// docs are a stream's JSON documents: each event's data or each NDJSON
// line (the [DONE] sentinel aside).
func docs(contentType string, body []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if contentType == "text/event-stream" {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			line = data
		}
		if line != "" {
			out = append(out, line)
		}
	}
	return out
}

// TestEveryBodyIsValidJSON: each endpoint's body, or each event's data and
// each NDJSON line of a stream, parses as JSON (the [DONE] sentinel aside).
func TestEveryBodyIsValidJSON(t *testing.T) {
	s := Start(t)
	u := Usage{Input: 100, Cached: 20, CacheCreation: 10, Output: 40, Reasoning: 5}
	for _, c := range []struct{ path, body, final, contentType string }{
		{"/v1/chat/completions", `{}`, "", "application/json"},
		{"/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true}}`, "", "text/event-stream"},
		{"/v1/responses", `{}`, "", "application/json"},
		{"/v1/responses", `{"stream":true}`, "incomplete", "text/event-stream"},
		{"/v1/messages", `{}`, "", "application/json"},
		{"/v1/messages", `{"stream":true}`, "", "text/event-stream"},
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{}`, "", "application/json"},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", `{}`, "", "text/event-stream"},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent", `{}`, "", "application/json; charset=UTF-8"},
		{"/api/chat", `{}`, "", "application/x-ndjson"},
		{"/api/generate", `{"stream":false}`, "", "application/json"},
	} {
		ct, body := get(t, s, c.path, c.body, c.final, u)
		if ct != c.contentType {
			t.Fatalf("%s %s: %s, want %s", c.path, c.body, ct, c.contentType)
		}
		ds := []string{string(body)}
		if !strings.HasPrefix(ct, "application/json") {
			ds = docs(ct, body)
		}
		for _, d := range ds {
			if !json.Valid([]byte(d)) {
				t.Errorf("%s %s: not JSON: %s", c.path, c.body, d)
			}
		}
		if len(ds) == 0 {
			t.Errorf("%s %s: no JSON document", c.path, c.body)
		}
	}
	if n := len(s.Requests()); n != 11 {
		t.Errorf("%d requests kept, want 11", n)
	}
}

// TestGeminiStreamsTheSameChunksBothWays: without alt=sse the stream is
// one JSON array of the chunks alt=sse sends as events.
func TestGeminiStreamsTheSameChunksBothWays(t *testing.T) {
	s := Start(t)
	u := Usage{Input: 100, Cached: 20, Output: 40, Reasoning: 5}
	path := "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
	ct, events := get(t, s, path+"?alt=sse", `{}`, "", u)
	want := docs(ct, events)
	_, body := get(t, s, path, `{}`, "", u)
	var chunks []json.RawMessage
	if err := json.Unmarshal(body, &chunks); err != nil {
		t.Fatalf("not a JSON array: %v: %s", err, body)
	}
	if len(chunks) != len(want) || len(want) != 3 {
		t.Fatalf("%d chunks, %d events; want 3 each", len(chunks), len(want))
	}
	for i, c := range chunks {
		if string(c) != want[i] {
			t.Errorf("chunk %d: %s, event %s", i, c, want[i])
		}
	}
}
