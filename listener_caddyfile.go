package ratelimit

import (
	"fmt"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tally/ratelimit/zones"
)

// UnmarshalCaddyfile sets up the listener wrapper from Caddyfile tokens, in
// the global option servers { listener_wrappers { ... } }. Syntax:
//
//	rate_limit {
//	    zone <name> {                 # new connections per client
//	        key    {remote_ip}        # the client's address (or the PROXY
//	                                  # protocol's source); a template of
//	                                  # {remote_ip} and text
//	        events <n>
//	        window <duration>
//	        burst  <n>                # default: events
//	        ipv4_prefix <bits>
//	        ipv6_prefix <bits>
//	        max_keys <n>              # default: 1000000
//	        dry_run
//	    }
//	    zone <name> {                 # connections open at once per client
//	        key         {remote_ip}
//	        concurrency <n>
//	        ipv4_prefix, ipv6_prefix, max_keys, dry_run as above
//	    }
//	    deny_while <http zone>...     # refuse new connections while a rate_limit
//	                                  # handler's zone denies (or bans) the
//	                                  # client's address
//	    log_key
//	    dry_run
//	}
//
// It goes before tls, and after proxy_protocol when there is one:
//
//	listener_wrappers {
//	    proxy_protocol { ... }
//	    rate_limit { ... }
//	    tls
//	}
//
// The zone grammar is the handler's; what needs a request (match, cost,
// count, charge, placeholders in limits) or Redis (fail_policy, lease,
// distributed) is refused with its line.
func (w *ListenerWrapper) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the wrapper's name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		sub := d.Val()
		if sub != "zone" && sub != "deny_while" {
			if seen[sub] {
				return d.Errf("%s is given twice: keep one", sub)
			}
			seen[sub] = true
		}
		var err error
		switch sub {
		case "zone":
			err = w.unmarshalZone(d)
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
		case "log_key":
			err = noArgs(d, &w.LogKey)
		case "dry_run":
			err = noArgs(d, &w.DryRun)
		case "distributed":
			err = d.Err("connection zones are local to this instance: remove distributed (a distributed HTTP zone's denials reach deny_while through its deny cache)")
		case "headers", "status", "jitter":
			err = d.Errf("%s shapes HTTP responses, and a refused connection gets none (it is reset): remove it", sub)
		default:
			err = d.Errf("unknown subdirective %q: expected zone, deny_while, log_key or dry_run", sub)
		}
		if err != nil {
			return err
		}
	}
	if len(w.RateLimits) == 0 && len(w.DenyWhile) == 0 {
		return d.Err("listener wrapper rate_limit needs a zone or a deny_while: zone <name> { key {remote_ip}; events 20; window 1s }")
	}
	return nil
}

// unmarshalZone reads a zone block with the handler's parser, then refuses,
// at its line, what a connection zone cannot have.
func (w *ListenerWrapper) unmarshalZone(d *caddyfile.Dispenser) error {
	zoneLine := d.Line()
	name, z, lines, err := parseZone(d, w.RateLimits, "listener wrapper", remoteIPPlaceholder)
	if err != nil {
		return err
	}
	if setting, err := z.connectionProblem(); err != nil {
		line, ok := lines[setting]
		if !ok {
			line = zoneLine
		}
		return fmt.Errorf("zone %s: %w, at %s:%d", name, err, d.File(), line)
	}
	if w.RateLimits == nil {
		w.RateLimits = make(map[string]*Zone)
	}
	w.RateLimits[name] = z
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*ListenerWrapper)(nil)
