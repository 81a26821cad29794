package ratelimit

import "github.com/caddy-tally/ratelimit/internal/usage"

// bodyCharge is what a zone charges from the response body, scanned as it streams
// (finish.go): the paths' sum (charge json), else its token usage, counted
// (charge tokens) or priced by its model (charge usd, prices set).
type bodyCharge struct {
	paths  *usage.Paths
	tokens tokenCount
	prices *usage.Prices
}

// price prices an estimate of tokens as b (tokens or dollars) charges them;
// false: no price.
func (b *bodyCharge) price(model string, input, output int64) (int64, bool) {
	if b.prices != nil {
		return b.prices.Cost(model, input, 0, output)
	}
	return b.tokens.of(usage.Tokens{Input: input, Output: output}), true
}

// tokenCount is which tokens charge tokens counts: input, output, or total
// ("" too).
type tokenCount string

func (c tokenCount) of(t usage.Tokens) int64 {
	switch c {
	case "input":
		return t.Input
	case "output":
		return t.Output
	}
	return t.Total()
}

// Why a body charge fell back, beyond the scanner's own reasons.
const (
	reasonClientGone    = "client_gone"
	reasonUpstreamError = "upstream_error"
)

// chargeFallbackReasons are the reason label's values.
func chargeFallbackReasons() []string {
	return append([]string{reasonClientGone, reasonUpstreamError, reasonNoPrice}, usage.Reasons()...)
}
