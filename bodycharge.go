package ratelimit

import (
	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/internal/usage"
)

// Charges from the response body (charge json, charge tokens;
// docs/configuration.md, "Charges from the response body"): what a zone
// reads from the body and why a charge falls back. The body passes through
// as it is written, every flush kept, and each zone that charges from it
// scans the bytes on their way with its own usage.Scanner (finish.go's
// response), in memory bounded whatever the body's size.

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
