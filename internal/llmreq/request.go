// Package llmreq reads an LLM API request's body for the zones that charge its
// tokens or dollars: the model, the prompt's size, the most output it asks for
// (the estimate), and whether an OpenAI chat-completions stream asks for its usage
// (stream_options.include_usage), added when not and stripped from the response
// (strip.go). The body is read once, bounded (MaxBody); the upstream gets it all.
package llmreq

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddy-tally/ratelimit/internal/usage"
)

// MaxBody is the most of a body read: a longer one is not estimated nor edited.
const MaxBody = 1 << 20

// Request is what a request's body says, as far as tally reads it.
type Request struct {
	Parsed bool   // read whole (within MaxBody), one JSON object; else nothing below is set
	Model  string // "model" (Gemini: from the path), at most usage.MaxModel bytes
	Prompt int64  // string bytes (keys aside) in messages, input, contents, prompt, system, instructions
	// MaxOutput is the most output tokens allowed (max_tokens,
	// max_completion_tokens, max_output_tokens,
	// generationConfig.maxOutputTokens, options.num_predict), or -1.
	MaxOutput      int64
	Stream         bool // "stream": true
	IncludeUsage   bool // stream_options.include_usage is true
	soStart, soEnd int  // stream_options' value in the body, [0,0) when absent
}

// Input is the prompt's estimated input tokens: its bytes ÷ 4, rounded up
// (English text).
func (q *Request) Input() int64 { return (q.Prompt + 3) / 4 }

// Read reads at most MaxBody of r's body, replaced by one giving the upstream the
// same bytes (those read, then the rest): the bytes read, and whether they are all.
func Read(r *http.Request) ([]byte, bool) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength > MaxBody {
		return nil, false
	}
	size := MaxBody
	if r.ContentLength >= 0 {
		size = int(r.ContentLength)
	}
	// Room for the body and the read that finds its end.
	var buf bytes.Buffer
	buf.Grow(min(size, 64<<10) + bytes.MinRead)
	body := r.Body
	_, err := buf.ReadFrom(io.LimitReader(body, MaxBody+1))
	b := buf.Bytes()
	switch {
	case err != nil: // the client left, a timeout: the upstream gets the bytes, then the error
		r.Body = replay{io.MultiReader(bytes.NewReader(b), errReader{err}), body}
	case len(b) > MaxBody:
		r.Body = replay{io.MultiReader(bytes.NewReader(b), body), body}
	default:
		r.Body = replay{bytes.NewReader(b), body}
		return b, true
	}
	return b, false
}

// replay is a body read again: the bytes read, then the rest; Close closes
// the original.
type replay struct {
	io.Reader
	io.Closer
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// SetBody makes b r's whole body, its length known.
func SetBody(r *http.Request, b []byte) {
	r.Body = replay{bytes.NewReader(b), r.Body}
	r.ContentLength = int64(len(b))
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
	r.TransferEncoding = nil
}

// Parse reads what tally needs of an LLM request's body, b, sent to path.
func Parse(b []byte, path string) Request {
	q := Request{MaxOutput: -1}
	end := members(b, 0, func(key []byte, vs, ve int) {
		v := b[vs:ve]
		switch string(key) {
		case "model": // a string, escapes kept (model names have none)
			if len(v) >= 2 && v[0] == '"' {
				q.Model = string(v[1 : len(v)-1])
			}
		case "messages", "input", "contents", "prompt", "system", "instructions":
			value(b, vs, &q.Prompt, 0)
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			q.setMax(v)
		case "generationConfig":
			sub(v, "maxOutputTokens", q.setMax)
		case "options":
			sub(v, "num_predict", q.setMax)
		case "stream":
			q.Stream = string(v) == "true"
		case "stream_options":
			q.soStart, q.soEnd = vs, ve
			sub(v, "include_usage", func(v []byte) { q.IncludeUsage = string(v) == "true" })
		}
	})
	if end < 0 || space(b, end) != len(b) {
		return Request{MaxOutput: -1}
	}
	q.Parsed = true
	if i := strings.LastIndex(path, "/models/"); q.Model == "" && i >= 0 {
		// Gemini's model is in its path: …/models/<model>:<method>.
		if m, _, ok := strings.Cut(path[i+len("/models/"):], ":"); ok {
			q.Model = m
		}
	}
	if len(q.Model) > usage.MaxModel {
		q.Model = q.Model[:usage.MaxModel]
	}
	return q
}

// setMax sets MaxOutput from a whole number >= 0 (Ollama's -1 and -2 are none).
func (q *Request) setMax(v []byte) {
	if n, err := strconv.ParseInt(string(v), 10, 64); err == nil && n >= 0 {
		q.MaxOutput = n
	}
}

// sub calls f with the value of the member key of the object v, if any.
func sub(v []byte, key string, f func([]byte)) {
	members(v, 0, func(k []byte, vs, ve int) {
		if string(k) == key {
			f(v[vs:ve])
		}
	})
}

// WantsUsage reports whether q is a stream that does not ask for its usage
// (WithUsage adds it).
func (q *Request) WantsUsage() bool { return q.Parsed && q.Stream && !q.IncludeUsage }

// WithUsage is q's body b with stream_options.include_usage true (a new
// stream_options at the end if none, in place of a null one), every other
// byte as it was; nil if stream_options is neither an object nor null.
func (q *Request) WithUsage(b []byte) []byte {
	const member = `"include_usage":true`
	if q.soEnd == 0 {
		end := bytes.LastIndexByte(b, '}')
		body := bytes.TrimRight(b[:end], " \t\r\n")
		sep := ","
		if body[len(body)-1] == '{' {
			sep = ""
		}
		return concat(b[:end], sep+`"stream_options":{`+member+`}`, b[end:])
	}
	so := b[q.soStart:q.soEnd]
	if string(so) == "null" {
		return concat(b[:q.soStart], `{`+member+`}`, b[q.soEnd:])
	}
	if so[0] != '{' {
		return nil
	}
	vs, ve := -1, 0
	members(so, 0, func(k []byte, s, e int) {
		if string(k) == "include_usage" {
			vs, ve = s, e
		}
	})
	if vs >= 0 { // include_usage is there and not true: made true
		return concat(b[:q.soStart+vs], "true", b[q.soStart+ve:])
	}
	open := q.soStart + 1
	sep := ","
	if so[space(so, 1)] == '}' {
		sep = ""
	}
	return concat(b[:open], member+sep, b[open:])
}

func concat(a []byte, s string, c []byte) []byte {
	out := make([]byte, 0, len(a)+len(s)+len(c))
	return append(append(append(out, a...), s...), c...)
}
