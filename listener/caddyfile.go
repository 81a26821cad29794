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
	settings := config.Settings{
		"zone": func(d *caddyfile.Dispenser) error { return parseZone(d, &w.RateLimits) },
		"deny_while": func(d *caddyfile.Dispenser) error {
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
		},
		"log_key": config.Set(&w.LogKey, config.NoArgs),
		"dry_run": config.Set(&w.DryRun, config.NoArgs),
		"distributed": func(d *caddyfile.Dispenser) error {
			return d.Err("connection zones are local to this instance: remove distributed (a distributed HTTP zone's denials reach deny_while through its deny cache)")
		},
	}
	for _, sub := range []string{"headers", "status", "jitter"} {
		settings[sub] = func(d *caddyfile.Dispenser) error {
			return d.Errf("%s shapes HTTP responses, and a refused connection gets none (it is reset): remove it", sub)
		}
	}
	err := settings.Read(d, "", "unknown subdirective %q: expected zone, deny_while, log_key or dry_run", "zone", "deny_while")
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
	settings := config.Settings{
		"key": func(d *caddyfile.Dispenser) (err error) {
			if z.Key, err = config.OneArg(d); err == nil {
				if p := z.keyProblem(); p != nil {
					err = d.Err(p.Error())
				}
			}
			return err
		},
		"events":      limit("write a number", config.Set(&z.MaxEvents, config.IntIn[int64](1, zones.MaxEvents))),
		"window":      limit("write a duration", config.Set(&z.Window, config.DurationArg)),
		"burst":       limit("write a number", config.Set(&z.Burst, config.IntIn[int64](1, zones.MaxEvents))),
		"concurrency": limit("write a number", config.Set(&z.Concurrency, config.IntIn[int64](1, zones.MaxConcurrency))),
		"ipv4_prefix": limit("write a number", config.Set(&z.IPv4Prefix, config.IntIn(1, 32))),
		"ipv6_prefix": limit("write a number", config.Set(&z.IPv6Prefix, config.IntIn(1, 128))),
		"max_keys":    limit("write a number", config.Set(&z.MaxKeys, config.IntIn[int64](1, zones.MaxMaxKeys))),
		"dry_run":     config.Set(&z.DryRun, config.NoArgs),
	}
	for sub, why := range refused {
		settings[sub] = func(d *caddyfile.Dispenser) error { return d.Err(why) }
	}
	err = config.Subdirectives(d, nil, "", func(sub string) error {
		lines[sub] = d.Line()
		if lines["concurrency"] > 0 && lines["events"]+lines["window"]+lines["burst"] > 0 {
			return d.Err("concurrency replaces events, window and burst: remove them, or put the rate limit in a zone of its own")
		}
		if read := settings[sub]; read != nil {
			return read(d)
		}
		return d.Errf("unknown subdirective %q: expected key, events, window, burst, concurrency, ipv4_prefix, ipv6_prefix, max_keys or dry_run", sub)
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

// limit is read, which reads a limit, refusing a placeholder (the handler's
// `events {plan} 60`), which a connection cannot give: fix says what to
// write instead.
func limit(fix string, read func(*caddyfile.Dispenser) error) func(*caddyfile.Dispenser) error {
	return func(d *caddyfile.Dispenser) error {
		if d.NextArg() {
			arg := d.Val()
			d.Prev()
			if strings.HasPrefix(arg, "{") {
				return d.Errf("%s %s %s: %s", d.Val(), arg, request, fix)
			}
		}
		return read(d)
	}
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Wrapper)(nil)
