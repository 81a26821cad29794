package ratelimit

import (
	"cmp"
	"net/http"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/internal/usage"
)

// Charges from the response body (charge json, charge tokens;
// docs/configuration.md, "Charges from the response body"): the body
// passes through as it is written, every flush kept, and each zone that
// charges from it scans the bytes on their way with its own usage.Scanner,
// in memory bounded whatever the body's size.

// bodyCharge is what a zone charges from the response body: the sum of
// paths (charge json), or else its token usage, counted (charge tokens)
// or priced by its model (charge usd, when prices is set).
type bodyCharge struct {
	paths  *usage.Paths
	tokens tokenCount
	prices *usage.Prices
}

// tokenCount is which tokens charge tokens counts.
type tokenCount uint8

const (
	tokensTotal tokenCount = iota
	tokensInput
	tokensOutput
)

func parseTokenCount(s string) (tokenCount, error) {
	switch s {
	case "input":
		return tokensInput, nil
	case "output":
		return tokensOutput, nil
	}
	return tokensTotal, config.CheckTokenCount(s)
}

// of is the count of t.
func (c tokenCount) of(t usage.Tokens) int64 {
	switch c {
	case tokensInput:
		return t.Input
	case tokensOutput:
		return t.Output
	}
	return t.Total()
}

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
	return append([]string{reasonClientGone, reasonUpstreamError, reasonNoPrice}, usage.Reasons()...)
}

// startScans readies the scanners once the headers are final: when the
// status is written (or the body's first byte, or its end). The headers are
// read then, before the writers outside this one see them: an encode
// handler outside (route { encode; rate_limit; ... }) sets
// Content-Encoding later, on bytes this writer saw plain; one inside (the
// default directive order) has set it on the bytes it hands this writer.
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

// bodyTotal is what the response charges ticket i, v: the sum of its
// zone's paths, its token count, or its tokens priced by the model (the
// response's, else the request's), the format read counted; or, when the
// body did not carry them (or no price fits the model, or the upstream
// failed, or the client left before the body's end), the ticket's cost
// (the estimate taken before, or the zone's literal cost), counted and
// logged (sampled) by reason.
func (rw *response) bodyTotal(r *http.Request, i int, v *verdict, status int, err error, now int64) int64 {
	rw.startScans()
	var n int64
	var why usage.Reason
	var format usage.Format
	reason := ""
	switch b := rw.paths[i]; {
	case b.paths != nil:
		n, why = rw.scans[i].Total()
	case b.prices != nil:
		var t usage.Tokens
		t, why = rw.scans[i].Tokens()
		if t.Model == "" {
			t.Model = requestModel(r) // the request's, read with its body
		}
		if why == usage.OK {
			var priced bool
			if n, priced = b.prices.Cost(t.Model, t.Input, t.CachedInput, t.Output); !priced {
				reason = reasonNoPrice
			}
		}
		format = t.Format
	default:
		var t usage.Tokens
		t, why = rw.scans[i].Tokens()
		n, format = b.tokens.of(t), t.Format
	}
	if c := v.Owner.metrics.tokenCharges; c != nil && why == usage.OK && reason == "" && err == nil && status < 500 {
		add(c[format], 1)
	}
	return rw.charged(r, v, status, err, now, n, cmp.Or(reason, why.String()))
}

// charged is n, what ticket v's response costs by its body, when reason
// is usage.OK's and the response ended well; else the ticket's cost,
// counted and logged (sampled) by reason.
func (rw *response) charged(r *http.Request, v *verdict, status int, err error, now, n int64, reason string) int64 {
	switch {
	case reason == usage.OK.String() && err == nil && status < 500:
		return n
	case rw.failed || r.Context().Err() != nil:
		reason = reasonClientGone
	case err != nil || status >= 500:
		// An upstream that failed may have cut the body short: a total
		// read from it may be a stream's placeholder (Anthropic's
		// message_start carries output_tokens 1), so a 5xx never charges
		// from its body.
		reason = reasonUpstreamError
	}
	z := v.Owner
	add(z.metrics.chargeFallbacks[reason], 1)
	if c := z.logs.chargeFallback.Check(z.logger, now, zapcore.WarnLevel, "response carried no usable usage to charge; the estimate (or the zone's cost) stays charged"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.String("reason", reason), zap.Int("status", status), zap.Int64("cost", v.Cost))
	}
	return v.Cost
}
