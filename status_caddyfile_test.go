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

// At a site's top level, rate_limit_status without a matcher would answer
// every request of the site: adapt refuses it, naming the line and the fix.
// With a path matcher, or inside a handle block, it adapts.
func TestStatusCaddyfileAtTopLevelNeedsAMatcher(t *testing.T) {
	adapt := func(body string) error {
		site := "http:// {\n" + body + "\trate_limit {\n\t\tzone api_key {\n\t\t\tkey {remote_host}\n\t\t\tevents 10\n\t\t\twindow 1m\n\t\t}\n\t}\n\trespond \"ok\"\n}\n"
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), map[string]any{"filename": "Testfile"})
		return err
	}
	err := adapt("\trate_limit_status api_key\n")
	if err == nil || !strings.Contains(err.Error(), "Testfile:2") || !strings.Contains(err.Error(), "answers every request of the site") ||
		!strings.Contains(err.Error(), "rate_limit_status /rate_limit api_key") {
		t.Errorf("top level, no matcher: %v; want refused with its line and the fix", err)
	}
	for _, ok := range []string{
		"\trate_limit_status /rate_limit api_key\n",
		"\t@status path /rate_limit\n\trate_limit_status @status api_key\n",
		"\thandle /rate_limit {\n\t\trate_limit_status api_key\n\t}\n",
		"\troute /rate_limit {\n\t\trate_limit_status api_key\n\t}\n",
	} {
		if err := adapt(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}
