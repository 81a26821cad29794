package usage

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

func mustPaths(t testing.TB, paths ...string) *Paths {
	t.Helper()
	p, err := ParsePaths(paths)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

// scan runs body through a scanner in chunks of n bytes (0: at once).
func scan(p *Paths, contentType, encoding, body string, n int) (int64, Reason) {
	var s Scanner
	s.Start(p, contentType, encoding)
	if n <= 0 {
		n = len(body) + 1
	}
	for len(body) > 0 {
		k := min(n, len(body))
		s.Write([]byte(body[:k]))
		body = body[k:]
	}
	return s.Total()
}

// scanCase is a body and what its scan must give, at once and in chunks.
type scanCase struct {
	name   string
	p      *Paths
	body   string
	want   int64
	reason Reason
}

func (c scanCase) check(t *testing.T, contentType string, chunks ...int) {
	t.Helper()
	for _, n := range append([]int{0}, chunks...) {
		if got, reason := scan(c.p, contentType, "", c.body, n); got != c.want || reason != c.reason {
			t.Errorf("%s, in chunks of %d: %d, %v; want %d, %v", c.name, n, got, reason, c.want, c.reason)
		}
	}
}

func TestJSONBodies(t *testing.T) {
	total := mustPaths(t, "usage.total_tokens")
	sum := mustPaths(t, "usage.input_tokens", "usage.output_tokens")
	for _, c := range []scanCase{
		{"openai", total, `{"id":"x","choices":[{"message":{"content":"hi \"there\" {"}}],"usage":{"prompt_tokens":12,"completion_tokens":288,"total_tokens":300}}`, 300, OK},
		{"usage first", total, `{"usage":{"total_tokens":7},"choices":[]}`, 7, OK},
		{"whitespace", total, " {\n \"usage\" : {\t\"total_tokens\" :\r\n 42 } } \n", 42, OK},
		{"sum", sum, `{"usage":{"input_tokens":10,"output_tokens":5}}`, 15, OK},
		{"sum with a part missing", sum, `{"usage":{"input_tokens":10}}`, 0, NoUsage},
		{"no usage", total, `{"choices":[]}`, 0, NoUsage},
		{"usage null", total, `{"usage":null}`, 0, NoUsage},
		{"a string is not a count", total, `{"usage":{"total_tokens":"300"}}`, 0, NoUsage},
		{"negative", total, `{"usage":{"total_tokens":-3}}`, 0, NoUsage},
		{"fraction", total, `{"usage":{"total_tokens":3.5}}`, 0, NoUsage},
		{"zero", total, `{"usage":{"total_tokens":0}}`, 0, OK},
		{"below a top-level key", total, `{"type":"response.completed","response":{"usage":{"total_tokens":9}}}`, 9, OK},
		{"two levels down is not the path", total, `{"a":{"b":{"usage":{"total_tokens":9}}}}`, 0, NoUsage},
		{"the root wins, after", total, `{"response":{"usage":{"total_tokens":9}},"usage":{"total_tokens":4}}`, 4, OK},
		{"the root wins, before", total, `{"usage":{"total_tokens":4},"response":{"usage":{"total_tokens":9}}}`, 4, OK},
		{"a top-level key that is the path's first", total, `{"usage":{"usage":{"total_tokens":9}}}`, 9, OK},
		{"inside an array is not the path", total, `{"usage":[{"total_tokens":9}]}`, 0, NoUsage},
		{"a sibling object's key", total, `{"usage":{"x":{"total_tokens":9},"total_tokens":4}}`, 4, OK},
		{"escaped key never matches", total, `{"usage":{"total\u005ftokens":9}}`, 0, NoUsage},
		{"key with escaped quote", total, `{"a\"b":1,"usage":{"total_tokens":5}}`, 5, OK},
		{"huge number saturates", total, `{"usage":{"total_tokens":99999999999999999999999}}`, math.MaxInt64, OK},
		{"truncated", total, `{"usage":{"total_tokens":300}`, 0, Malformed},
		{"broken", total, `{"usage":{"total_tokens":300}},`, 0, Malformed},
		{"mismatched", total, `{"usage":{"total_tokens":300]}`, 0, Malformed},
		{"missing colon", total, `{"usage" {"total_tokens":300}}`, 0, Malformed},
		{"two documents", total, `{"usage":{"total_tokens":3}} {}`, 0, Malformed},
		{"empty", total, ``, 0, Malformed},
		{"top-level number", mustPaths(t, "a"), `5`, 0, NoUsage},
		{"last duplicate wins", total, `{"usage":{"total_tokens":3,"total_tokens":4}}`, 4, OK},
		{"too deep", total, strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), 0, Malformed},
		{"as deep as allowed", total, strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), 0, NoUsage},
	} {
		c.check(t, "application/json; charset=utf-8", 1, 2, 7)
	}
}

func TestContentTypesAndEncodings(t *testing.T) {
	p := mustPaths(t, "usage.total_tokens")
	body := `{"usage":{"total_tokens":3}}`
	for _, c := range []struct {
		ct, enc string
		want    Reason
	}{
		{"application/json", "", OK},
		{"application/problem+json", "", OK},
		{"APPLICATION/JSON", "identity", OK},
		{"application/json", "gzip", Encoded},
		{"text/plain", "", NotJSON},
		{"", "", NotJSON},
	} {
		if _, r := scan(p, c.ct, c.enc, body, 0); r != c.want {
			t.Errorf("%q %q: %v, want %v", c.ct, c.enc, r, c.want)
		}
	}
}

// openAIStream is a chat completion streamed with include_usage: every
// chunk carries "usage": null but the last before [DONE].
func openAIStream(chunks int, total int) string {
	var b strings.Builder
	for i := range chunks {
		fmt.Fprintf(&b, "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}],\"usage\":null}\n\n", i)
	}
	fmt.Fprintf(&b, "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", total-10, total)
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

const anthropicStream = "event: message_start\n" +
	`data: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,"output_tokens":1}}}` + "\n\n" +
	"event: content_block_delta\n" +
	`data: {"type":"content_block_delta","delta":{"text":"Hello"}}` + "\n\n" +
	": a comment\n\n" +
	"event: message_delta\n" +
	`data: {"type":"message_delta","usage":{"output_tokens":10}}` + "\n\n" +
	"event: message_delta\n" +
	`data: {"type":"message_delta","usage":{"output_tokens":15}}` + "\n\n" +
	"event: message_stop\n" +
	`data: {"type":"message_stop"}` + "\n\n"

func TestEventStreams(t *testing.T) {
	total := mustPaths(t, "usage.total_tokens")
	for _, c := range []scanCase{
		{"openai", total, openAIStream(5, 300), 300, OK},
		{"crlf", total, strings.ReplaceAll(openAIStream(3, 300), "\n", "\r\n"), 300, OK},
		{"cr", total, strings.ReplaceAll(openAIStream(3, 300), "\n", "\r"), 300, OK},
		{"bom", total, "\xef\xbb\xbf" + openAIStream(1, 40), 40, OK},
		{"no space after data:", total, "data:{\"usage\":{\"total_tokens\":8}}\n\n", 8, OK},
		{"the last event wins", total, "data: {\"usage\":{\"total_tokens\":8}}\n\ndata: {\"usage\":{\"total_tokens\":9}}\n\n", 9, OK},
		{"data over two lines", total, "data: {\"usage\":\ndata: {\"total_tokens\":8}}\n\n", 8, OK},
		{"data over two CRLF lines", total, "data: {\"usage\":\r\ndata: {\"total_tokens\":8}}\r\n\r\n", 8, OK},
		{"undispatched last event", total, "data: {\"usage\":{\"total_tokens\":8}}\n", 0, NoUsage},
		{"never sends usage", total, "data: {\"usage\":null}\n\ndata: [DONE]\n\n", 0, NoUsage},
		{"broken usage event", total, "data: {\"usage\":{\"total_tokens\":8}\n\n", 0, Malformed},
		{"broken then good", total, "data: {\"usage\":{\"total_tokens\":8}\n\ndata: {\"usage\":{\"total_tokens\":9}}\n\n", 9, OK},
		{"event field is not data", total, "event: {\"usage\":{\"total_tokens\":8}}\n\n", 0, NoUsage},
		{"anthropic, input from message_start", mustPaths(t, "message.usage.input_tokens", "usage.output_tokens"), anthropicStream, 40, OK},
		{"anthropic, input below message in message_start", mustPaths(t, "usage.input_tokens", "usage.output_tokens"), anthropicStream, 40, OK},
		{"oversized event skipped", total, "data: " + strings.Repeat("x", MaxEvent) + "\"total_tokens\"\n\n", 0, TooLarge},
		{"oversized event then usage", total, "data: " + strings.Repeat("x", MaxEvent) + "\n\ndata: {\"usage\":{\"total_tokens\":3}}\n\n", 3, OK},
		{"oversized event's usage", total, "data: {\"text\":\"" + strings.Repeat("x", MaxEvent) + "\",\"usage\":{\"total_tokens\":7}}\n\n", 7, OK},
		{"oversized event's usage on its next data lines", total, "event: response.completed\r\ndata: {\"text\":\"" + strings.Repeat("x", MaxEvent-30) + "\",\r\n: a comment\r\ndata:\"usage\":\r\ndata\r\nid: 1\r\ndata: {\"total_tokens\":7}}\r\n\r\n", 7, OK},
		{"oversized event's usage, then a broken oversized event", total, "data: {\"text\":\"" + strings.Repeat("x", MaxEvent) + "\",\"usage\":{\"total_tokens\":7}}\n\ndata: {\"usage\":{\"total_tokens\":" + strings.Repeat("x", MaxEvent) + "\n\n", 7, OK},
	} {
		c.check(t, "text/event-stream", 1, 3, 100)
	}
}

func TestBoundedMemory(t *testing.T) {
	p := mustPaths(t, "usage.total_tokens")
	var s Scanner
	s.Start(p, "text/event-stream", "")
	chunk := []byte(strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"aaaaaaaaaaaaaaaa\"}}],\"usage\":null}\n\n", 100))
	line := []byte(strings.Repeat("y", 1<<20)) // a 10 MiB line, no newline
	for range 10 {
		s.Write(chunk)
		s.Write(line)
	}
	if cap(s.buf) > MaxEvent+1 {
		t.Fatalf("the event buffer grew to %d bytes, want at most %d", cap(s.buf), MaxEvent+1)
	}
	s.Write([]byte("\n\ndata: {\"usage\":{\"total_tokens\":12}}\n\n"))
	if n, r := s.Total(); n != 12 || r != OK {
		t.Fatalf("after an oversized line: %d, %v; want 12", n, r)
	}
	allocs := testing.AllocsPerRun(100, func() {
		s.Start(p, "text/event-stream", "")
		s.Write(chunk)
	})
	if allocs > 0 {
		t.Errorf("a reused scanner allocates %v times per stream, want 0", allocs)
	}
}

func TestParsePaths(t *testing.T) {
	for _, bad := range [][]string{nil, {""}, {"usage..total"}, {".usage"}, {"a b"}, {`a"b`}, {strings.Repeat("k", maxSegment+1)},
		{"choices[0].usage.total_tokens"}, {"usage.*"}, {"$.usage.total_tokens"}, {"{http.vars.tokens}"},
		{"a", "b", "c", "d", "e", "f", "g", "h", "i"}} {
		if _, err := ParsePaths(bad); err == nil {
			t.Errorf("ParsePaths(%q) accepted", bad)
		}
	}
}

// FuzzJSON checks the decoder against encoding/json: a well-formed document
// whose path holds a whole number is found, any split of its bytes gives
// the same answer, and nothing panics.
func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{"usage":{"total_tokens":300}}`, `{"usage":null}`, `[1,{"a":2}]`, `{"usage":{"total_tokens":1e3}}`, `"x"`, `{"a":"\"}"}`} {
		f.Add(s, 3)
	}
	p := mustPaths(f, "usage.total_tokens")
	f.Fuzz(func(t *testing.T, body string, n int) {
		got, reason := scan(p, "application/json", "", body, 0)
		if split, r := scan(p, "application/json", "", body, n%17); split != got || r != reason {
			t.Fatalf("split in %d: %d, %v; at once %d, %v", n%17, split, r, got, reason)
		}
		var doc any
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		if !json.Valid([]byte(body)) || dec.Decode(&doc) != nil {
			return // the scanner need not refuse every invalid document
		}
		if reason == Malformed && nestingOf(body) <= MaxDepth {
			t.Fatalf("valid JSON %q is malformed to the scanner", body)
		}
		if strings.Contains(body, `\`) {
			return // escaped keys never match; encoding/json decodes them
		}
		want, ok, ambiguous := pathValue(doc)
		if ambiguous {
			return // several top-level keys carry it: the oracle cannot say which is last
		}
		if ok != (reason == OK) || (ok && got != want) {
			t.Fatalf("%q: %d, %v; encoding/json says %d, %v", body, got, reason, want, ok)
		}
	})
}

func nestingOf(s string) int {
	d, most := 0, 0
	for _, c := range s {
		switch c {
		case '{', '[':
			d++
			most = max(most, d)
		case '}', ']':
			d--
		}
	}
	return most
}

// pathValue is usage.total_tokens of doc, from its root or else from below
// one top-level key, when it is a whole number >= 0 written in digits only
// (json.Number keeps how); ambiguous when several top-level keys carry it.
func pathValue(doc any) (v int64, ok, ambiguous bool) {
	m, ok := doc.(map[string]any)
	if !ok {
		return 0, false, false
	}
	if v, ok := totalTokens(m); ok {
		return v, true, false
	}
	// Below a top-level key: the last such key in the document wins, which
	// encoding/json's map cannot tell, so only one may carry it.
	var found []int64
	for _, below := range m {
		if o, ok := below.(map[string]any); ok {
			if v, ok := totalTokens(o); ok {
				found = append(found, v)
			}
		}
	}
	if len(found) == 1 {
		return found[0], true, false
	}
	return 0, false, len(found) > 1
}

// totalTokens is m's usage.total_tokens when it is a whole number >= 0
// written in digits only.
func totalTokens(m map[string]any) (int64, bool) {
	const digits = "0123456789"
	u, ok := m["usage"].(map[string]any)
	if !ok {
		return 0, false
	}
	n, ok := u["total_tokens"].(json.Number)
	if !ok || strings.Trim(string(n), digits) != "" {
		return 0, false
	}
	v, err := n.Int64()
	if err != nil {
		return math.MaxInt64, true // saturated, as the scanner does
	}
	return v, true
}

// FuzzEvents checks that an event stream's answer does not depend on how
// its bytes are split, and that nothing panics.
func FuzzEvents(f *testing.F) {
	f.Add(openAIStream(2, 30), 5)
	f.Add(anthropicStream, 3)
	f.Add("\xef\xbb\xbf"+openAIStream(1, 30), 1)
	f.Add("data: {\"usage\":{\"total_tokens\":8}}\r\n\r\ndata:\n\n", 1)
	p := mustPaths(f, "message.usage.input_tokens", "usage.output_tokens")
	f.Fuzz(func(t *testing.T, body string, n int) {
		got, reason := scan(p, "text/event-stream", "", body, 0)
		if split, r := scan(p, "text/event-stream", "", body, n%23); split != got || r != reason {
			t.Fatalf("split in %d: %d, %v; at once %d, %v", n%23, split, r, got, reason)
		}
	})
}
