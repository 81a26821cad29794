package listener

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/zones"
)

// UnmarshalCaddyfile sets up the listener wrapper from Caddyfile tokens, in
// the global option servers { listener_wrappers { ... } }, before tls and
// after proxy_protocol when there is one. The syntax is in
// docs/connections.md: the handler's zone grammar, where what needs a
// request (match, cost, count, charge, placeholders in limits) or Redis
// (fail_policy, lease, distributed) is refused with its line.
func (w *Wrapper) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the wrapper's name
	err := config.Subdirectives(d, nil, "", func(sub string) error {
		switch sub {
		case "zone":
			return parseZone(d, &w.RateLimits)
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
			return config.NoArgs(d, &w.LogKey)
		case "dry_run":
			return config.NoArgs(d, &w.DryRun)
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

// request ends the refusal of a setting that reads the request.
const request = "reads the request, which a connection has not sent yet"

// refused are the handler's zone settings a connection zone cannot have,
// and why, with the fix.
var refused = map[string]string{
	"match":       "match " + request + ": remove it, or put the zone in the rate_limit handler (a server of its own limits connections to its address only)",
	"cost":        "a connection costs 1: remove cost",
	"count":       "count weighs responses, which a connection does not have: put the zone in the rate_limit handler",
	"charge":      "charge weighs responses, which a connection does not have: put the zone in the rate_limit handler",
	"fail_policy": "connection zones are local to this instance, with no Redis to fail: remove fail_policy",
	"lease":       "connection zones are local to this instance, with no Redis to hold slots: remove lease",
	"scope":       "scope: a connection zone is local to the instance (no Redis on the accept path): remove scope",
	"ban":         "connection zones do not ban: put ban in an HTTP zone and name it in deny_while, which refuses a banned key's connections",
	"quota":       "a calendar quota counts requests: put the zone in the rate_limit handler (deny_while <zone> refuses connections while it denies)",
	"adaptive":    "adaptive follows an upstream's latency, which connections do not have: put the zone in the rate_limit handler",
	"priority":    "adaptive follows an upstream's latency, which connections do not have: put the zone in the rate_limit handler",
	"status":      "status shapes HTTP responses, and a refused connection gets none (it is reset): remove it",
	"delay":       "a connection is accepted or reset at once, never kept waiting: remove delay",
	"queue":       "a connection is accepted or reset at once, never kept waiting: remove queue",
}

// parseZone reads one zone block, whose `zone` token d is on, into the
// wrapper's zones, whose names it must not repeat; what the zone cannot
// have is refused with its line.
func parseZone(d *caddyfile.Dispenser, into *map[string]*Zone) error {
	name, err := config.ZoneName(d, *into, "listener wrapper")
	if err != nil {
		return err
	}
	z := new(Zone)
	lines := map[string]int{}
	zoneLine := d.Line()
	err = config.Subdirectives(d, nil, "", func(sub string) (err error) {
		lines[sub] = d.Line()
		switch {
		case refused[sub] != "":
			err = d.Err(refused[sub])
		case lines["concurrency"] > 0 && lines["events"]+lines["window"]+lines["burst"] > 0:
			err = d.Err("concurrency replaces events, window and burst: remove them, or put the rate limit in a zone of its own")
		case limits[sub] != "" && strings.HasPrefix(nextArg(d), "{"):
			err = d.Errf("%s %s %s: %s", sub, nextArg(d), request, limits[sub])
		case sub == "key":
			if z.Key, err = config.OneArg(d); err == nil {
				if p := z.keyProblem(); p != nil {
					err = d.Err(p.Error())
				}
			}
		case sub == "events":
			z.MaxEvents, err = config.IntArg[int64](d, 1, zones.MaxEvents)
		case sub == "window":
			z.Window, err = config.DurationArg(d)
		case sub == "burst":
			z.Burst, err = config.IntArg[int64](d, 1, zones.MaxEvents)
		case sub == "concurrency":
			z.Concurrency, err = config.IntArg[int64](d, 1, zones.MaxConcurrency)
		case sub == "ipv4_prefix":
			z.IPv4Prefix, err = config.IntArg(d, 1, 32)
		case sub == "ipv6_prefix":
			z.IPv6Prefix, err = config.IntArg(d, 1, 128)
		case sub == "max_keys":
			z.MaxKeys, err = config.IntArg[int64](d, 1, zones.MaxMaxKeys)
		case sub == "dry_run":
			err = config.NoArgs(d, &z.DryRun)
		default:
			err = d.Errf("unknown subdirective %q: expected key, events, window, burst, concurrency, ipv4_prefix, ipv6_prefix, max_keys or dry_run", sub)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("zone %s: %w", name, err)
	}
	switch {
	case z.Key == "":
		return d.Errf("zone %s: key is missing: add e.g. key %s", name, remoteIPPlaceholder)
	case z.Concurrency > 0:
	case z.MaxEvents == 0:
		return d.Errf("zone %s: events is missing: add e.g. events 20", name)
	case z.Window == 0:
		return d.Errf("zone %s: window is missing: add e.g. window 1m", name)
	}
	// What provisioning would refuse, refused here with the line at fault.
	if setting, err := z.config(name, false).Check(); err != nil && z.Concurrency == 0 {
		return fmt.Errorf("zone %s: %w, at %s:%d", name, err, d.File(), cmp.Or(lines[setting], zoneLine))
	}
	if *into == nil {
		*into = make(map[string]*Zone)
	}
	(*into)[name] = z
	return nil
}

// limits are the settings whose value is a limit, which a placeholder (the
// handler's `events {plan} 60`) cannot give, and what to write instead.
var limits = map[string]string{
	"events": "write a number", "window": "write a duration", "burst": "write a number", "concurrency": "write a number",
	"ipv4_prefix": "write a number", "ipv6_prefix": "write a number", "max_keys": "write a number",
}

// nextArg is the argument after the setting d is on, "" if none; d stays
// on the setting.
func nextArg(d *caddyfile.Dispenser) string {
	if !d.NextArg() {
		return ""
	}
	defer d.Prev()
	return d.Val()
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Wrapper)(nil)
