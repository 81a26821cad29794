package ratelimit

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/config"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	// Where mholt/caddy-ratelimit puts it, so a Caddyfile needs no `order`.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens, which
// package config reads; the syntax is in docs/configuration.md and
// docs/distributed.md. A subdirective may appear once per block (zone and
// match excepted); every error names the file and line.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	c, err := config.ParseDirective(d)
	if err != nil {
		return err
	}
	h.RateLimits, h.Distributed, h.Persist = c.RateLimits, c.Distributed, c.Persist
	h.Headers, h.StatusCode, h.Jitter, h.SweepInterval = c.Headers, c.StatusCode, c.Jitter, c.SweepInterval
	h.LogKey, h.DisableMetrics, h.DryRun = c.LogKey, c.DisableMetrics, c.DryRun
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
