package ratelimit

import (
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/internal/usage"
)

// Charges from the response body (charge json; docs/configuration.md,
// "Charges from the response body"): the body passes through as it is
// written, every flush kept, and each zone that charges from it scans the
// bytes on their way with its own usage.Scanner, in memory bounded
// whatever the body's size.

// Why a body charge fell back to the estimate (or the zone's cost), beyond
// the scanner's own reasons: the client left before the usage came, or
// the upstream failed.
const (
	reasonClientGone    = "client_gone"
	reasonUpstreamError = "upstream_error"
)

// chargeFallbackReasons are the reason label's values, each zone's series
// bound at provision.
func chargeFallbackReasons() []string {
	return append([]string{reasonClientGone, reasonUpstreamError}, usage.Reasons()...)
}

// bodyWriter is the response writer of a request whose zones charge from
// its body.
// It keeps no reference to the request's verdicts, which would move them
// from the stack to the heap on every request.
type bodyWriter struct {
	caddyhttp.ResponseRecorder
	paths   []*usage.Paths  // by verdict, nil for zones that do not charge from the body
	scans   []usage.Scanner // by verdict
	started bool            // the scanners saw the response's headers
	failed  bool            // a write to the client failed: it left
}

func newBodyWriter(rec caddyhttp.ResponseRecorder, verdicts []verdict) *bodyWriter {
	w := &bodyWriter{ResponseRecorder: rec, paths: make([]*usage.Paths, len(verdicts)), scans: make([]usage.Scanner, len(verdicts))}
	for i := range verdicts {
		w.paths[i] = verdicts[i].Owner.costs.body
	}
	return w
}

// start readies the scanners once the headers are final: when the status
// is written (or the body's first byte, or its end). The headers are read
// then, before the writers outside this one see them: an encode handler
// outside (route { encode; rate_limit; ... }) sets Content-Encoding later,
// on bytes this writer saw plain; one inside (the default directive order)
// has set it on the bytes it hands this writer.
func (w *bodyWriter) start() {
	w.started = true
	h := w.Header()
	ct, enc := h.Get("Content-Type"), h.Get("Content-Encoding")
	for i, p := range w.paths {
		if p != nil {
			w.scans[i].Start(p, ct, enc)
		}
	}
}

func (w *bodyWriter) WriteHeader(code int) {
	if !w.started && (code < 100 || code > 199) {
		w.start()
	}
	w.ResponseRecorder.WriteHeader(code)
}

func (w *bodyWriter) Write(b []byte) (int, error) {
	if !w.started {
		w.start()
	}
	for i := range w.scans {
		w.scans[i].Write(b)
	}
	n, err := w.ResponseRecorder.Write(b)
	if err != nil {
		w.failed = true
	}
	return n, err
}

// ReadFrom copies through Write, so that the scanners see the bytes.
func (w *bodyWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{w}, r)
}

// Unwrap is for http.ResponseController: flushes and hijacks pass through.
func (w *bodyWriter) Unwrap() http.ResponseWriter { return w.ResponseRecorder }

// total is what the response charges verdict i, v: the sum of its zone's
// paths, or, when the body did not carry them, the verdict's cost (the
// estimate taken before, or the zone's literal cost), counted and logged
// (sampled) by reason.
func (w *bodyWriter) total(r *http.Request, i int, v *verdict, status int, err error, now int64) int64 {
	if !w.started {
		w.start()
	}
	n, why := w.scans[i].Total()
	if why == usage.OK {
		return n
	}
	reason := why.String()
	switch {
	case w.failed || r.Context().Err() != nil:
		reason = reasonClientGone
	case err != nil || status >= 500:
		reason = reasonUpstreamError
	}
	z := v.Owner
	add(z.metrics.chargeFallbacks[reason], 1)
	if c := z.logs.chargeFallback.check(z.logger, now, zapcore.WarnLevel, "response carried no usable usage to charge; the estimate (or the zone's cost) stays charged"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.String("reason", reason), zap.Int("status", status), zap.Int64("cost", v.Cost))
	}
	return v.Cost
}
