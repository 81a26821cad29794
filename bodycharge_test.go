package ratelimit

import (
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/zones"
)

// TestChargeTokensJSONConfig: charge_tokens takes input, output or total,
// alone among the charges.
func TestChargeTokensJSONConfig(t *testing.T) {
	plan := zones.Plan{Burst: 1000}
	for _, c := range []struct {
		zone Zone
		err  string
	}{
		{Zone{ChargeTokens: "output"}, ""},
		{Zone{ChargeTokens: "all"}, `zone z: charge_tokens: "all": count input, output or total tokens`},
		{Zone{ChargeTokens: "total", ChargeJSON: []string{"usage.total_tokens"}}, "zone z: charge_tokens reads the body's token usage: leave out charge and charge_json"},
		{Zone{ChargeTokens: "total", Charge: "{http.vars.n}"}, "zone z: charge_tokens reads the body's token usage: leave out charge and charge_json"},
		{Zone{ChargeTokens: "total", Concurrency: 5}, "zone z: cost, count and charge apply to events/window zones"},
	} {
		costs, err := zoneCosts("z", &c.zone, plan, zap.NewNop())
		switch {
		case c.err == "" && (err != nil || costs.body == nil || costs.body.tokens != "output" || !costs.postCharged()):
			t.Errorf("%+v: %v, %+v", c.zone, err, costs.body)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%+v: %v, want %q", c.zone, err, c.err)
		}
	}
}
