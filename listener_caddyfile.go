package ratelimit

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tally/ratelimit/zones"
)

// UnmarshalCaddyfile sets up the listener wrapper from Caddyfile tokens, in
// the global option servers { listener_wrappers { ... } }, before tls and
// after proxy_protocol when there is one. The syntax is in
// docs/connections.md: the handler's zone grammar, where what needs a
// request (match, cost, count, charge, placeholders in limits) or Redis
// (fail_policy, lease, distributed) is refused with its line.
func (w *ListenerWrapper) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the wrapper's name
	err := subdirectives(d, nil, "", func(sub string) error {
		switch sub {
		case "zone":
			_, _, err := parseZone(d, &w.RateLimits, "listener wrapper", remoteIPPlaceholder, (*Zone).connectionProblem)
			return err
		case "deny_while":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.Err("deny_while needs the name of an HTTP zone, e.g. deny_while login_ip")
			}
			for _, name := range args {
				if !zones.ValidName(name) {
					return d.Errf("deny_while: zone name %q is invalid: use letters, digits, '_' and '-' only", name)
				}
			}
			w.DenyWhile = append(w.DenyWhile, args...)
			return nil
		case "log_key":
			return noArgs(d, &w.LogKey)
		case "dry_run":
			return noArgs(d, &w.DryRun)
		case "distributed":
			return d.Err("connection zones are local to this instance: remove distributed (a distributed HTTP zone's denials reach deny_while through its deny cache)")
		case "headers", "status", "jitter":
			return d.Errf("%s shapes HTTP responses, and a refused connection gets none (it is reset): remove it", sub)
		}
		return d.Errf("unknown subdirective %q: expected zone, deny_while, log_key or dry_run", sub)
	}, "zone", "deny_while")
	if err != nil {
		return err
	}
	if len(w.RateLimits) == 0 && len(w.DenyWhile) == 0 {
		return d.Err("listener wrapper rate_limit needs a zone or a deny_while: zone <name> { key {remote_ip}; events 20; window 1s }")
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*ListenerWrapper)(nil)
