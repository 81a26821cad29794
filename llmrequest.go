package ratelimit

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/internal/llmreq"
)

// llmZone is what a zone that charges LLM tokens or dollars does with the request's
// body (docs/llm.md): `estimate request` estimates the cost; an OpenAI stream not
// asking for its usage is made to (include_usage), the usage stripped from its
// client's. The body is read once, within llmreq.MaxBody; the upstream gets it all.
type llmZone struct {
	estimate   bool
	usagePaths []string       // path suffixes whose streams get include_usage; none: off
	charge     *bodyCharge    // the zone's charge tokens or charge usd, which prices the estimate
	outputs    llmreq.Outputs // the output tokens of the zone's responses, per model
}

// llmZoneOf checks a zone's estimate and include_usage; nil unless b
// charges tokens or dollars.
func llmZoneOf(name string, zc *Zone, b *bodyCharge) (*llmZone, error) {
	price := b != nil && b.paths == nil
	switch {
	case zc.Estimate != "" && zc.Estimate != "request":
		return nil, fmt.Errorf("zone %s: estimate %q: the one estimate is request (estimate request: from the request's body)", name, zc.Estimate)
	case !price && (zc.Estimate != "" || len(zc.IncludeUsage) > 0):
		return nil, fmt.Errorf("zone %s: estimate and include_usage read LLM requests for a zone that charges their tokens or dollars: add charge tokens or charge usd { … }", name)
	case !price:
		return nil, nil
	case zc.Estimate != "" && zc.CostPlaceholder != "":
		return nil, fmt.Errorf("zone %s: the estimate is read from the request's body (estimate request) or from a placeholder (cost {…}), not both: keep one", name)
	}
	l := &llmZone{estimate: zc.Estimate == "request", charge: b}
	if len(zc.IncludeUsage) == 0 {
		l.usagePaths = []string{"/chat/completions"} // OpenAI's, and every compatible server's
	}
	for _, p := range zc.IncludeUsage {
		switch {
		case p == "off" && len(zc.IncludeUsage) == 1:
		case p == "off" || !strings.HasPrefix(p, "/"):
			return nil, fmt.Errorf("zone %s: include_usage %q: give off, or the paths (or their ends, from a /) of OpenAI chat-completions endpoints, e.g. include_usage /v1/chat/completions", name, p)
		default:
			l.usagePaths = append(l.usagePaths, p)
		}
	}
	return l, nil
}

// llmRead is a request's body as the zones read it, kept in its vars.
type llmRead struct {
	q llmreq.Request
	// usage: include_usage was added; strip: a handler's response strips it
	// (the outermost one's, so that every zone's scanner sees the usage).
	usage, strip bool
	body         []byte // nil when not read whole, or once no zone can add include_usage
}

const llmReadVar = "rate_limit.llm_request"

func readLLM(r *http.Request) *llmRead {
	if rd, ok := caddyhttp.GetVar(r.Context(), llmReadVar).(*llmRead); ok {
		return rd
	}
	rd := &llmRead{q: llmreq.Request{MaxOutput: -1}}
	if r.Method == http.MethodPost {
		if b, whole := llmreq.Read(r); whole {
			rd.q = llmreq.Parse(b, r.URL.Path)
			rd.body = b
		}
	}
	caddyhttp.SetVar(r.Context(), llmReadVar, rd)
	return rd
}

// requestModel is the model r's body names ("" if none or not read).
func requestModel(r *http.Request) string {
	if rd, ok := caddyhttp.GetVar(r.Context(), llmReadVar).(*llmRead); ok {
		return rd.q.Model
	}
	return ""
}

// cost is the request's estimate (fallback when unpriced), false when the
// zone does not estimate; a stream whose usage the zone wants is made to
// ask for it.
func (l *llmZone) cost(r *http.Request, fallback int64) (int64, bool) {
	if !l.estimate && !l.wantsUsage(r.URL.Path) && l.charge.prices == nil {
		return 0, false // nothing to read the body for
	}
	rd := readLLM(r)
	if !rd.usage && rd.body != nil && rd.q.WantsUsage() && l.wantsUsage(r.URL.Path) {
		if b := rd.q.WithUsage(rd.body); b != nil {
			llmreq.SetBody(r, b)
			rd.usage = true
		}
	}
	if !l.estimate {
		return 0, false
	}
	if !rd.q.Parsed {
		return fallback, true
	}
	out := rd.q.MaxOutput
	if out < 0 {
		out, _ = l.outputs.P95(rd.q.Model)
	}
	n, ok := l.charge.price(rd.q.Model, rd.q.Input(), out)
	if !ok {
		return fallback, true
	}
	// At least 1, so that a key with nothing left makes no request.
	return max(1, n), true
}

func (l *llmZone) wantsUsage(path string) bool {
	return slices.ContainsFunc(l.usagePaths, func(p string) bool { return strings.HasSuffix(path, p) })
}

// stripUsage wraps w, on the first handler of a request made to ask for its
// usage, to strip it.
func stripUsage(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	rd, ok := caddyhttp.GetVar(r.Context(), llmReadVar).(*llmRead)
	if !ok {
		return w
	}
	if rd.usage || !rd.q.WantsUsage() {
		rd.body = nil // no zone can add include_usage now: not kept for a stream's minutes
	}
	if !rd.usage || rd.strip {
		return w
	}
	rd.strip = true
	return &usageStrip{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// usageStrip strips the usage from a 200 text/event-stream, not encoded;
// all else passes.
type usageStrip struct {
	caddyhttp.ResponseWriterWrapper
	strip     llmreq.Strip
	final, on bool
}

func (s *usageStrip) WriteHeader(code int) {
	if !s.final && (code < 100 || code > 199) {
		s.final = true
		h := s.Header()
		s.on = code == http.StatusOK && strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") && h.Get("Content-Encoding") == ""
		if s.on {
			h.Del("Content-Length")
		}
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *usageStrip) Write(b []byte) (int, error) {
	if !s.final {
		s.WriteHeader(http.StatusOK)
	}
	if !s.on {
		return s.ResponseWriter.Write(b)
	}
	return len(b), s.strip.Write(b, s.emit)
}

func (s *usageStrip) emit(b []byte) error {
	_, err := s.ResponseWriter.Write(b)
	return err
}

func (s *usageStrip) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{s}, r)
}

// endStrip passes on what a stripped stream ended within an event left.
func endStrip(w http.ResponseWriter) {
	if s, ok := w.(*usageStrip); ok && s.on {
		_ = s.strip.End(s.emit)
	}
}
