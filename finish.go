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

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/internal/usage"
)

// The after-response step: a request whose tickets do something once its
// response is known (give a slot back, with an adaptive zone's latency
// sample; charge a post-charged zone; settle an estimate) is served through
// a response, which records what they need on its way (nothing buffered:
// streaming, flushing and hijacking pass through); finish then ends each
// ticket by its kind. A request with no such ticket is served as it is.

// response is the writer next writes through when a ticket finishes with
// the response: the status, when the headers came, and the body's usage
// for the zones that charge from it (read on for a while after its client
// left, drain below).
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
	// client is the request's own context, drained the bytes read since,
	// and cancel ends next's context, which the client's leaving does not.
	client  context.Context
	drained int
	cancel  context.CancelFunc
	unwatch func() bool
	// paths and scans are by ticket, paths nil for a zone that does not
	// charge from the body. The response keeps no reference to the
	// request's tickets, which would move them from the stack to the heap
	// on every request.
	paths []*bodyCharge
	scans []usage.Scanner
}

// responses recycles responses: one per request would be an allocation on
// the path of every request that holds a slot.
var responses = sync.Pool{New: func() any { return new(response) }}

// responseFor is the response a request with these tickets is served
// through, nil when none finishes with the response, and the request next
// is given.
func (h *Handler) responseFor(w http.ResponseWriter, r *http.Request, verdicts []verdict) (*response, *http.Request) {
	after := false
	for i := range verdicts {
		after = after || verdicts[i].Holds() || verdicts[i].Owner.costs.postCharged()
	}
	if !after {
		return nil, r
	}
	rw := responses.Get().(*response)
	paths, scans := rw.paths[:0], rw.scans[:0]
	if h.bodyCharged {
		for i := range verdicts {
			paths = append(paths, verdicts[i].Owner.costs.body)
		}
		scans = slices.Grow(scans, len(verdicts))[:len(verdicts)]
		// The usage chunk that include_usage asked for is not the
		// client's: only a body-charged zone adds it.
		w = stripUsage(w, r)
	}
	*rw = response{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		start: monotime.Now(), paths: paths, scans: scans}
	if h.bodyCharged {
		// The usage comes at the body's end: a client that leaves before
		// it must not end the upstream's response, or it would pay only
		// the estimate. next's context outlives the client's by at most
		// drainFor; Write reads on at most drainBytes.
		ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		rw.client, rw.cancel = r.Context(), cancel
		rw.unwatch = context.AfterFunc(r.Context(), func() { time.AfterFunc(drainFor, cancel) })
		r = r.WithContext(ctx)
	}
	return rw, r
}

// How far a body-charged response is read after its client left, so that
// the usage at its end is charged: up to drainBytes more of the body, for
// up to drainFor. Past either, the upstream's response is ended and the
// estimate (or the zone's cost) stays charged (client_gone).
const (
	drainBytes = 4 << 20
	drainFor   = 10 * time.Second
)

// finish ends each ticket of a request once next returned or panicked
// (reverse_proxy panics with http.ErrAbortHandler when the upstream or the
// client breaks off a response it has begun; the response is finished all
// the same, and the panic goes on): post-charged zones charge what the
// response costs them or settle their estimate, then slots are given back,
// an adaptive zone's with the upstream's latency (from next's call to the
// response's headers, or to next's return when it wrote none) as a sample;
// none when the client left (its latency says nothing of the upstream's).
// Its failed: a 5xx, including a proxy error or timeout.
func (h *Handler) finish(rw *response, r *http.Request, repl *caddy.Replacer, verdicts []verdict) {
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
	for i := range verdicts {
		v := &verdicts[i]
		if z := v.Owner; z.costs.postCharged() {
			cost, ok := h.responseCost(rw, r, repl, i, v, status, err, now)
			rw.learnOutput(r, i, v, status)
			if !ok {
				continue
			}
			if z.costs.estimate && cancel == nil {
				// A refund outlives the request's context (the client may
				// have left), bounded by the store's budget.
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
	// Back to the pool only when nothing can hold it any more: a handler
	// that kept the writer (a hijacked connection's) would then write to
	// the next request's.
	*rw = response{paths: rw.paths[:0], scans: rw.scans[:0]}
	responses.Put(rw)
}

// WriteHeader records the status, the last 1xx until a final one; a
// second final status is dropped, as Caddy's response recorder drops it.
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
		// The client left: the bytes are only scanned, within bounds.
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

// errDrained ends a body read past drainBytes after its client left.
var errDrained = errors.New("rate_limit: client gone, the response's body read on as far as it is bounded")

// ReadFrom copies through Write, so that the scanners see the bytes.
func (rw *response) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{rw}, r)
}
