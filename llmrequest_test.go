package ratelimit

import (
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/zones"
)

func TestCaddyfileEstimateRequestAndIncludeUsage(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone tokens {
			key {http.request.header.Authorization}
			quota 1000000 per day
			charge tokens
			estimate request
			include_usage /v1/chat/completions /openai/deployments/gpt/chat/completions
		}
		zone off {
			key {http.request.header.Authorization}
			quota 1000000 per day
			charge tokens
			include_usage off
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["tokens"]
	if z == nil || z.Estimate != "request" || !slices.Equal(z.IncludeUsage, []string{"/v1/chat/completions", "/openai/deployments/gpt/chat/completions"}) {
		t.Fatalf("zone tokens: %+v", z)
	}
	if z := h.RateLimits["off"]; z == nil || !slices.Equal(z.IncludeUsage, []string{"off"}) {
		t.Fatalf("zone off: %+v", z)
	}
	if _, err := parse(t, "rate_limit {\n\tzone z {\n\t\tkey x\n\t\tevents 1\n\t\twindow 1s\n\t\testimate header\n\t}\n}"); err == nil || !strings.Contains(err.Error(), "estimate must be one of request") {
		t.Fatalf("estimate header: %v", err)
	}
}

// The JSON's estimate and include_usage, checked when the zone is
// provisioned: only in a zone that charges tokens or dollars, the one
// estimate is request, not with a cost placeholder, include_usage is off
// alone or paths.
func TestEstimateAndIncludeUsageJSONConfig(t *testing.T) {
	plan := zones.Plan{Burst: 1000}
	for _, c := range []struct {
		zone  Zone
		err   string
		paths []string
	}{
		{Zone{ChargeTokens: "total", Estimate: "request"}, "", []string{"/chat/completions"}},
		{Zone{ChargeTokens: "total", IncludeUsage: []string{"off"}}, "", nil},
		{Zone{ChargeTokens: "total", IncludeUsage: []string{"/a/chat/completions", "/b"}}, "", []string{"/a/chat/completions", "/b"}},
		{Zone{ChargeTokens: "total", Estimate: "guess"}, `zone z: estimate "guess": the one estimate is request`, nil},
		{Zone{ChargeJSON: []string{"usage.total_tokens"}, Estimate: "request"}, "zone z: estimate and include_usage read LLM requests for a zone that charges their tokens or dollars", nil},
		{Zone{IncludeUsage: []string{"off"}}, "zone z: estimate and include_usage read LLM requests", nil},
		{Zone{ChargeTokens: "total", Estimate: "request", CostPlaceholder: "{http.request.header.X-Est}"}, "zone z: the estimate is read from the request's body (estimate request) or from a placeholder", nil},
		{Zone{ChargeTokens: "total", IncludeUsage: []string{"off", "/v1/chat/completions"}}, `zone z: include_usage "off": give off, or the paths`, nil},
		{Zone{ChargeTokens: "total", IncludeUsage: []string{"chat/completions"}}, `zone z: include_usage "chat/completions"`, nil},
	} {
		costs, err := zoneCosts("z", &c.zone, plan, zap.NewNop())
		switch {
		case c.err == "" && (err != nil || costs.llm == nil || costs.estimate != (c.zone.Estimate == "request") || !slices.Equal(costs.llm.usagePaths, c.paths)):
			t.Errorf("%+v: %v, %+v", c.zone, err, costs.llm)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%+v: %v, want %q", c.zone, err, c.err)
		}
	}
}
