package llmupstream

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

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
		{"/api/chat", `{}`, "", "application/x-ndjson"},
		{"/api/generate", `{"stream":false}`, "", "application/json"},
	} {
		req, _ := http.NewRequest("POST", s.URL+c.path, strings.NewReader(c.body))
		u.SetHeaders(req.Header)
		req.Header.Set("X-Final-Event", c.final)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != c.contentType {
			t.Fatalf("%s %s: %d %s, want 200 %s", c.path, c.body, resp.StatusCode, ct, c.contentType)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		docs := 0
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if c.contentType == "text/event-stream" {
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				line = data
			}
			if line == "" {
				continue
			}
			if !json.Valid([]byte(line)) {
				t.Errorf("%s %s: not JSON: %s", c.path, c.body, line)
			}
			docs++
		}
		resp.Body.Close()
		if docs == 0 {
			t.Errorf("%s %s: no JSON document", c.path, c.body)
		}
	}
	if n := len(s.Requests()); n != 10 {
		t.Errorf("%d requests kept, want 10", n)
	}
}
