package ratelimit

import (
	"context"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// A rate_limit_status naming a zone that no rate_limit handler defines is
// refused at load, the error naming the directive's Caddyfile line, which
// the adapter writes into its JSON.
func TestStatusCaddyfileUnknownZoneNamesItsLine(t *testing.T) {
	const site = `http:// {
	handle /rate_limit {
		rate_limit_status api_key nope
	}
	respond "ok"
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), map[string]any{"filename": "Testfile"})
	if want := `{"handler":"rate_limit_status","source":"Testfile:3","zones":["api_key","nope"]}`; err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("adapted to %s, %v; want %s in it", out, err, want)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	s := StatusHandler{Zones: []string{"nope"}, Source: "Testfile:3"}
	if err := s.Provision(ctx); err == nil || !strings.HasPrefix(err.Error(), "Testfile:3: rate_limit_status nope: ") {
		t.Errorf("Provision: %v; want the error to start with the line", err)
	}
}
