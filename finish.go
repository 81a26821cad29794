package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/internal/usage"
)

// response is the writer next writes through when a ticket finishes with
// the response (a slot given back, a charge, an estimate settled): it
// records the status, when the headers came and, buffering nothing, the
// body's usage for the zones that charge from it.
type response struct {
	caddyhttp.ResponseWriterWrapper
	status   int   // the status written, the last 1xx until a final one
	final    bool  // a final status was written
	start    int64 // monotime: next was called
	at       int64 // monotime: the headers were written (a 1xx aside), 0 if not yet
	returned bool  // next returned (rather than panicked), with err
	err      error
	scanning bool // the scanners saw the response's headers
	failed   bool // a write to the client failed: it left
	// A body-charged response is read on after its client left (drain):
	// client is the request's context, cancel ends next's.
	client  context.Context
	drained int
	cancel  context.CancelFunc
	unwatch func() bool
	// By ticket (paths nil for a zone that does not charge from the body):
	// a reference to the tickets would move them to the heap.
	paths []*bodyCharge
	scans []usage.Scanner
}

var responses = sync.Pool{New: func() any { return new(response) }}

// responseFor is the response a request is served through (nil when no
// ticket finishes with the response) and the request next is given.
func (h *Handler) responseFor(w http.ResponseWriter, r *http.Request, tickets []ticket) (*response, *http.Request) {
	after := false
	for i := range tickets {
		after = after || tickets[i].Holds() || tickets[i].Owner.costs.postCharged()
	}
	if !after {
		return nil, r
	}
	rw := responses.Get().(*response)
	paths, scans := rw.paths[:0], rw.scans[:0]
	if h.bodyCharged {
		for i := range tickets {
			paths = append(paths, tickets[i].Owner.costs.body)
		}
		scans = slices.Grow(scans, len(tickets))[:len(tickets)]
		w = stripUsage(w, r)
	}
	*rw = response{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		start: monotime.Now(), paths: paths, scans: scans}
	if h.bodyCharged {
		// The usage comes at the body's end: a client that leaves before
		// it must not end the upstream's response, or it would pay only
		// the estimate.
		ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		rw.client, rw.cancel = r.Context(), cancel
		rw.unwatch = context.AfterFunc(r.Context(), func() { time.AfterFunc(drainFor, cancel) })
		r = r.WithContext(ctx)
	}
	return rw, r
}

// How far a body-charged response is read after its client left, for the
// usage at its end; past either bound the estimate stays (client_gone).
const (
	drainBytes = 4 << 20
	drainFor   = 10 * time.Second
)

// finish ends each ticket once next returned or panicked (reverse_proxy
// panics with http.ErrAbortHandler on a broken-off response; the panic
// goes on): post-charged zones charge or settle, then slots are given
// back, an adaptive zone's with the upstream's latency (to the headers, or
// to next's return) as a sample, none when the client left; failed: a 5xx.
func (h *Handler) finish(rw *response, r *http.Request, repl *caddy.Replacer, tickets []ticket) {
	err := rw.err
	if !rw.returned {
		err = http.ErrAbortHandler
	}
	status := rw.status
	if !rw.final {
		status = http.StatusOK
		if err != nil {
			status = http.StatusInternalServerError
			var he caddyhttp.HandlerError
			if errors.As(err, &he) && he.StatusCode != 0 {
				status = he.StatusCode
			}
		}
	}
	endStrip(rw.ResponseWriter)
	now := monotime.Now()
	latency := time.Duration(cmp.Or(rw.at, now) - rw.start)
	if r.Context().Err() != nil {
		latency = -1
	}
	ctx, cancel := r.Context(), context.CancelFunc(nil)
	for i := range tickets {
		v := &tickets[i]
		if z := v.Owner; z.costs.postCharged() {
			cost, ok := h.responseCost(rw, r, repl, i, v, status, err, now)
			rw.learnOutput(r, i, v, status)
			if !ok {
				continue
			}
			if z.costs.estimate && cancel == nil {
				// A refund outlives the request's context.
				ctx, cancel = context.WithTimeout(context.WithoutCancel(r.Context()), cmp.Or(h.budget, time.Second))
			}
			if err := v.Charge(ctx, now, cost); err != nil {
				z.chargeFailed(err)
			}
			add(z.metrics.cost, float64(cost))
			add(z.metrics.spend, float64(cost)/usage.MicroPerUSD)
		}
		if v.Holds() {
			v.Finish(now, latency, status >= 500)
		}
	}
	if cancel != nil {
		cancel()
	}
	if rw.cancel != nil {
		rw.unwatch()
		rw.cancel()
	}
	// Pooled only here: a handler that kept the writer (a hijacked
	// connection's) would write to the next request's.
	*rw = response{paths: rw.paths[:0], scans: rw.scans[:0]}
	responses.Put(rw)
}

// WriteHeader drops a second final status, as Caddy's recorder does.
func (rw *response) WriteHeader(code int) {
	if rw.final {
		return
	}
	rw.status = code
	if rw.final = code < 100 || code > 199; rw.final || code == http.StatusSwitchingProtocols {
		rw.at = cmp.Or(rw.at, monotime.Now())
	}
	if rw.final {
		rw.startScans()
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *response) Write(b []byte) (int, error) {
	if !rw.final {
		rw.WriteHeader(http.StatusOK)
	}
	for i := range rw.scans {
		rw.scans[i].Write(b)
	}
	if rw.cancel != nil && (rw.failed || rw.client.Err() != nil) {
		rw.failed = true
		if rw.drained += len(b); rw.drained > drainBytes {
			rw.cancel()
			return 0, errDrained
		}
		return len(b), nil
	}
	n, err := rw.ResponseWriter.Write(b)
	if err != nil {
		rw.failed = true
		if rw.cancel != nil {
			return len(b), nil
		}
	}
	return n, err
}

var errDrained = errors.New("rate_limit: client gone, the response's body read on as far as it is bounded")

func (rw *response) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{rw}, r)
}

// responseCost is what the response costs ticket i, v: 0 when count does
// not match it in an estimating zone (false, not counted, in another); its
// charge placeholder's or body's; else the ticket's cost; at most one burst.
func (h *Handler) responseCost(rw *response, r *http.Request, repl *caddy.Replacer, i int, v *ticket, status int, err error, now int64) (int64, bool) {
	c, cost := &v.Owner.costs, v.Cost
	switch {
	case c.count != nil && !c.count.Match(status, rw.Header()):
		return 0, c.estimate
	case c.chargeVar != "":
		if repl == nil {
			repl = requestReplacer(r)
		}
		cost = v.Owner.readCost(repl, now, c.chargeVar, "charge", v.Cost)
	case c.body != nil:
		cost = rw.bodyTotal(r, i, v, status, err, now)
	}
	if cost > v.Plan.Burst {
		// A wrong (or hostile) usage value denies the key for one
		// window, not for months.
		v.Owner.costClamped(now, cost, v.Plan.Burst, "burst")
		cost = v.Plan.Burst
	}
	return cost, true
}

// startScans readies the scanners once the headers are final, before the
// writers outside this one see them: an encode handler outside sets
// Content-Encoding later, on bytes this writer saw plain; one inside has
// set it on the bytes it hands this writer.
func (rw *response) startScans() {
	if rw.scanning || len(rw.scans) == 0 {
		return
	}
	rw.scanning = true
	h := rw.Header()
	ct, enc := h.Get("Content-Type"), h.Get("Content-Encoding")
	for i, b := range rw.paths {
		switch {
		case b == nil:
			rw.scans[i] = usage.Scanner{}
		case b.paths != nil:
			rw.scans[i].Start(b.paths, ct, enc)
		default:
			rw.scans[i].StartTokens(ct, enc)
		}
	}
}

// bodyTotal is what the response's body charges ticket i, v: its paths'
// sum, its token count, or its tokens priced by model (the response's,
// else the request's); else (charged) the ticket's cost.
func (rw *response) bodyTotal(r *http.Request, i int, v *ticket, status int, err error, now int64) int64 {
	rw.startScans()
	var n int64
	var why usage.Reason
	var format usage.Format
	reason := ""
	if b := rw.paths[i]; b.paths != nil {
		n, why = rw.scans[i].Total()
	} else {
		var t usage.Tokens
		t, why = rw.scans[i].Tokens()
		format = t.Format
		switch {
		case b.prices == nil:
			n = b.tokens.of(t)
		case why == usage.OK:
			var priced bool
			if n, priced = b.prices.Cost(cmp.Or(t.Model, requestModel(r)), t.Input, t.CachedInput, t.Output); !priced {
				reason = reasonNoPrice
			}
		}
	}
	if c := v.Owner.metrics.tokenCharges; c != nil && why == usage.OK && reason == "" && err == nil && status < 500 {
		add(c[format], 1)
	}
	return rw.charged(r, v, status, err, now, n, cmp.Or(reason, why.String()))
}

// charged is n when reason is usage.OK's and the response ended well;
// else the ticket's cost, counted and logged (sampled) by reason.
func (rw *response) charged(r *http.Request, v *ticket, status int, err error, now, n int64, reason string) int64 {
	switch {
	case reason == usage.OK.String() && err == nil && status < 500:
		return n
	case rw.failed || r.Context().Err() != nil:
		reason = reasonClientGone
	case err != nil || status >= 500:
		// A failed upstream's total may be a cut stream's placeholder
		// (Anthropic's message_start has output_tokens 1).
		reason = reasonUpstreamError
	}
	z := v.Owner
	add(z.metrics.chargeFallbacks[reason], 1)
	if c := z.logs.chargeFallback.Check(z.logger, now, zapcore.WarnLevel, "response carried no usable usage to charge; the estimate (or the zone's cost) stays charged"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.String("reason", reason), zap.Int("status", status), zap.Int64("cost", v.Cost))
	}
	return v.Cost
}

// learnOutput records, for an estimating zone, the output tokens of a
// successful response under the model its estimate looks up.
func (rw *response) learnOutput(r *http.Request, i int, v *ticket, status int) {
	l := v.Owner.costs.llm
	if l == nil || !l.estimate || status >= 400 || i >= len(rw.paths) || rw.paths[i] == nil || rw.paths[i].paths != nil {
		return
	}
	if t, why := rw.scans[i].Tokens(); why == usage.OK {
		l.outputs.Observe(cmp.Or(requestModel(r), t.Model), t.Output)
	}
}
