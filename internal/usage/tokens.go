package usage

// Format is the LLM API whose usage a response carried.
type Format uint8

// The formats a TokenScanner reads (docs/configuration.md, "charge tokens").
const (
	FormatNone      Format = iota
	OpenAIChat             // OpenAI Chat Completions (and compatible servers): usage.prompt_tokens, completion_tokens
	OpenAIResponses        // OpenAI Responses: usage.input_tokens, output_tokens
	Anthropic              // Anthropic Messages: message_start's and message_delta's usage
	Gemini                 // Google Gemini: usageMetadata
	Ollama                 // Ollama's native API: prompt_eval_count, eval_count
)

var formats = [...]string{"none", "openai_chat", "openai_responses", "anthropic", "gemini", "ollama"}

func (f Format) String() string { return formats[f] }

// Formats are the formats' names, the metric label values.
func Formats() []string { return formats[:] }

// Tokens is one response's token usage.
type Tokens struct {
	Input       int64  // every input token, cached ones included
	CachedInput int64  // the part of Input read from a prompt cache
	Output      int64  // every output token, reasoning included
	Model       string // the response's model ("" if none), at most MaxModel bytes kept
	Format      Format
}

// MaxModel is the most of a model's name a TokenScanner keeps.
const MaxModel = 256

// Total is every token, input and output.
func (t Tokens) Total() int64 { return satAdd(t.Input, t.Output) }

// TokenScanner reads one response body's token usage, in whichever format
// it comes. Its zero value is not ready: call Start with the response's
// headers first.
type TokenScanner struct {
	s Scanner
}

// Start readies s for a body with these headers.
func (s *TokenScanner) Start(contentType, contentEncoding string) {}

// Write scans the next bytes of the body.
func (s *TokenScanner) Write(b []byte) {}

// Result is the body's usage once it has ended, or why there is none.
func (s *TokenScanner) Result() (Tokens, Reason) { return Tokens{}, NoUsage }
