package usage

import "strings"

// Token usage (charge tokens, charge usd): a Scanner started by StartTokens
// reads the usage of every common LLM API's responses (JSON, server-sent
// events, Ollama's NDJSON) with no path, as a Scanner does. Each document
// that carries a known usage object is read by its format:
//
//   - OpenAI Chat Completions (and compatible): usage.prompt_tokens (cached,
//     prompt_tokens_details.cached_tokens, included), completion_tokens
//     (reasoning included); a stream's usage chunk.
//   - OpenAI Responses: usage.input_tokens (input_tokens_details.cached_tokens
//     included) and output_tokens, at the root or under a stream's final
//     event's response (response.completed, .incomplete, .failed).
//   - Anthropic Messages (type message, message_start or message_delta, or
//     cache_*_input_tokens counts): input is input_tokens +
//     cache_read_input_tokens (the cached part) + cache_creation_input_tokens;
//     each count a document carries sets that count, never adds to it
//     (message_delta's cumulative output_tokens). message_start's output is
//     a placeholder: without a message_delta after it there is no usage.
//   - Gemini: usageMetadata.promptTokenCount + toolUsePromptTokenCount
//     (cachedContentTokenCount cached), candidatesTokenCount +
//     thoughtsTokenCount; modelVersion is the model. Chunks are cumulative,
//     as events (alt=sse) or as a top-level array's elements (its default),
//     only Gemini's of which are read (a cut array keeps those it completed).
//   - Ollama's native API: prompt_eval_count and eval_count.
//
// In a stream the last document with usage gives the result; the model is
// that document's (or the last one a usage document named).

// tokenPaths are the token scanner's paths: text[0] keeps the model (root model or
// modelVersion, or model under a top-level key), text[1] the root's type or object;
// quoted end every count's key: a document with none is not parsed.
var tokenPaths, tokenPath = func(paths ...string) (Paths, map[string]int) {
	p := Paths{tokens: true, quoted: [][]byte{[]byte(`_tokens"`), []byte(`TokenCount"`), []byte(`eval_count"`)}}
	index := make(map[string]int, len(paths))
	for i, path := range paths {
		p.segs = append(p.segs, strings.Split(path, "."))
		index[path] = i
	}
	m := index["model"]
	p.text[0] = 1<<m | 1<<(slots+m) | 1<<index["modelVersion"]
	p.text[1] = 1<<index["type"] | 1<<index["object"]
	return p, index
}(
	"usage.prompt_tokens", "usage.completion_tokens", "usage.prompt_tokens_details.cached_tokens",
	"usage.input_tokens", "usage.output_tokens", "usage.input_tokens_details.cached_tokens",
	"usage.cache_read_input_tokens", "usage.cache_creation_input_tokens",
	"usageMetadata.promptTokenCount", "usageMetadata.candidatesTokenCount", "usageMetadata.thoughtsTokenCount",
	"usageMetadata.cachedContentTokenCount", "usageMetadata.toolUsePromptTokenCount",
	"prompt_eval_count", "eval_count",
	"model", "modelVersion", "type", "object",
)

// tokenState is what a token scanner has read so far.
type tokenState struct {
	format             Format // of the last document with usage
	input, cached, out int64
	anthropic          [4]int64 // input_tokens, cache_read, cache_creation, output_tokens
	anthropicFinal     bool     // a message or message_delta set the output
	model              [MaxModel]byte
	modelLen           int
}

// StartTokens readies s to read the token usage (Tokens) of a body.
func (s *Scanner) StartTokens(contentType, contentEncoding string) {
	s.Start(&tokenPaths, contentType, contentEncoding)
}

// Tokens is the body's token usage once it has ended, or why there is none.
func (s *Scanner) Tokens() (Tokens, Reason) {
	t := &s.tok
	if r := s.end(func() bool { return t.format != FormatNone && (t.format != Anthropic || t.anthropicFinal) }); r != OK {
		return Tokens{}, r
	}
	return Tokens{Input: t.input, CachedInput: t.cached, Output: t.out, Model: string(t.model[:t.modelLen]), Format: t.format}, OK
}

// takeTokens reads the usage of one parsed document, if it carries one.
func (s *Scanner) takeTokens(d *decoder) {
	t := &s.tok
	has := func(path string) bool { _, ok := d.pathValue(tokenPath[path]); return ok }
	v := func(paths ...string) int64 {
		var sum int64
		for _, p := range paths {
			n, _ := d.pathValue(tokenPath[p])
			sum = satAdd(sum, n)
		}
		return sum
	}
	kind := string(d.text[1][:d.textLen[1]]) // not kept: compared only
	anthropic := kind == "message" || kind == "message_start" || kind == "message_delta"
	gemini := has("usageMetadata.promptTokenCount") || has("usageMetadata.candidatesTokenCount")
	switch {
	case d.inList && !gemini:
		return
	case !d.inList && (has("usage.prompt_tokens") || has("usage.completion_tokens")):
		t.format = OpenAIChat
		t.input, t.cached, t.out = v("usage.prompt_tokens"), v("usage.prompt_tokens_details.cached_tokens"), v("usage.completion_tokens")
	case gemini:
		t.format = Gemini
		t.input = v("usageMetadata.promptTokenCount", "usageMetadata.toolUsePromptTokenCount")
		t.cached = v("usageMetadata.cachedContentTokenCount")
		t.out = v("usageMetadata.candidatesTokenCount", "usageMetadata.thoughtsTokenCount")
	case has("eval_count"):
		t.format = Ollama
		t.input, t.cached, t.out = v("prompt_eval_count"), 0, v("eval_count")
	case anthropic || (!strings.HasPrefix(kind, "response") && (has("usage.cache_read_input_tokens") || has("usage.cache_creation_input_tokens"))):
		if t.format != Anthropic {
			t.anthropic, t.anthropicFinal = [4]int64{}, false
		}
		t.format = Anthropic
		for k, p := range [4]string{"usage.input_tokens", "usage.cache_read_input_tokens", "usage.cache_creation_input_tokens", "usage.output_tokens"} {
			if has(p) {
				t.anthropic[k] = v(p)
			}
		}
		t.anthropicFinal = t.anthropicFinal || (kind != "message_start" && has("usage.output_tokens"))
		a := t.anthropic
		t.input, t.cached, t.out = satAdd(satAdd(a[0], a[1]), a[2]), a[1], a[3]
	case has("usage.input_tokens") || has("usage.output_tokens"):
		t.format = OpenAIResponses
		t.input, t.cached, t.out = v("usage.input_tokens"), v("usage.input_tokens_details.cached_tokens"), v("usage.output_tokens")
	default:
		return
	}
	if n := d.textLen[0]; n > 0 {
		t.modelLen = copy(t.model[:], d.text[0][:n])
	}
}

// Format is the LLM API whose usage a response carried.
type Format uint8

// The formats a Scanner started by StartTokens reads.
const (
	FormatNone      Format = iota
	OpenAIChat             // OpenAI Chat Completions (and compatible servers)
	OpenAIResponses        // OpenAI Responses
	Anthropic              // Anthropic Messages
	Gemini                 // Google Gemini
	Ollama                 // Ollama's native API
)

var formats = [...]string{"none", "openai_chat", "openai_responses", "anthropic", "gemini", "ollama"}

func (f Format) String() string { return formats[f] }

// Formats are the formats' names, the metric label values.
func Formats() []string { return formats[:] }

// Tokens is one response's token usage.
type Tokens struct {
	Input       int64  // every input token, cached ones included
	CachedInput int64  // the part of Input read from a prompt cache (priced apart by charge usd)
	Output      int64  // every output token, reasoning included
	Model       string // the response's model ("" if none), at most MaxModel bytes kept, escapes as written
	Format      Format
}

// Total is every token, input and output.
func (t Tokens) Total() int64 { return satAdd(t.Input, t.Output) }
