package llmreq

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Whatever the body, Parse never panics; a valid JSON object it parses
// into a body that WithUsage keeps valid JSON, asking for usage.
func FuzzParseAndWithUsage(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"stream":true,"stream_options":{"include_usage":false}}`,
		`{"stream": true, "stream_options": {}}`,
		`{"contents":[{"parts":[{"text":"a\"b\\"}]}],"generationConfig":{"maxOutputTokens":5}}`,
		`{"a":[[[{"b":[1,2,{"c":"d"}]}]]],"stream":true}`,
		`{}`, `[]`, `{"a":`, `"x"`, `{"a":"\u00e9"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		q := Parse(b, "/v1/chat/completions")
		if !q.Parsed || !json.Valid(b) || !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")) {
			return
		}
		if q.Prompt < 0 || q.Prompt > int64(len(b)) {
			t.Fatalf("prompt of %d bytes in a body of %d", q.Prompt, len(b))
		}
		if !q.WantsUsage() {
			return
		}
		out := q.WithUsage(b)
		if out == nil {
			return // stream_options is not an object: left alone
		}
		if !json.Valid(out) || !Parse(out, "/").IncludeUsage {
			t.Fatalf("WithUsage(%s) = %s: not valid JSON asking for usage", b, out)
		}
	})
}

// Whatever the stream and however it is cut, Strip never panics, and a
// stream with no data event that Strip changes passes byte for byte.
func FuzzStrip(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n"), uint8(3))
	f.Add([]byte("data: {\"usage\":null,\"choices\":[{}]}\r\n\r\n"), uint8(1))
	f.Add([]byte("event: x\ndata: {}\n\n: c\n\n"), uint8(7))
	f.Fuzz(func(t *testing.T, s []byte, n uint8) {
		step := int(n%16) + 1
		var out bytes.Buffer
		var st Strip
		emit := func(b []byte) error { out.Write(b); return nil }
		for i := 0; i < len(s); i += step {
			_ = st.Write(s[i:min(i+step, len(s))], emit)
		}
		_ = st.End(emit)
		if !bytes.Contains(s, []byte("data:")) && !bytes.Equal(out.Bytes(), s) {
			t.Fatalf("a stream without data events changed: %q became %q", s, out.Bytes())
		}
		if out.Len() > len(s) {
			t.Fatalf("Strip added bytes: %q became %q", s, out.Bytes())
		}
	})
}
