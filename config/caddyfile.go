package config

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tally/ratelimit/internal/usage"
	"github.com/caddy-tally/ratelimit/zones"
)

// Directive is what the rate_limit directive sets: ratelimit.Handler's
// settings of the same names.
type Directive struct {
	RateLimits     map[string]*Zone
	Distributed    *Distributed
	Headers        string
	StatusCode     int
	Jitter         float64
	SweepInterval  caddy.Duration
	LogKey         bool
	Persist        *Persist
	DisableMetrics bool
	DryRun         bool
}

// ParseDirective reads the rate_limit directive, whose name d is on, and
// its block (the grammar is on ratelimit.Handler's UnmarshalCaddyfile).
// Every error names the file and line.
func ParseDirective(d *caddyfile.Dispenser) (*Directive, error) {
	h := new(Directive)
	d.Next() // the directive name
	// The first scope global zone, named by the error when no global block
	// comes before or after.
	var globalZone string
	var globalLine int
	err := Settings{
		"zone": func(d *caddyfile.Dispenser) error {
			name, lines, err := parseZone(d, &h.RateLimits)
			if err == nil && h.RateLimits[name].Scope == "global" && globalLine == 0 {
				globalZone, globalLine = name, lines["scope"]
			}
			return err
		},
		"distributed": Set(&h.Distributed, unmarshalDistributed),
		"headers":     Set(&h.Headers, oneOf("both", "ietf", "legacy", "off")),
		"status":      Set(&h.StatusCode, IntIn(400, 599)),
		"jitter": func(d *caddyfile.Dispenser) error {
			s, err := OneArg(d)
			if err == nil {
				h.Jitter, err = strconv.ParseFloat(s, 64)
				// Written so that NaN, which compares false with
				// everything, is refused too.
				if err != nil || !(h.Jitter >= 0 && h.Jitter <= 1) {
					err = d.Errf("jitter must be a fraction between 0 and 1 (e.g. jitter 0.2), not %q", s)
				}
			}
			return err
		},
		"sweep_interval":  Set(&h.SweepInterval, DurationArg),
		"persist":         Set(&h.Persist, unmarshalPersist),
		"log_key":         Set(&h.LogKey, NoArgs),
		"disable_metrics": Set(&h.DisableMetrics, NoArgs),
		"dry_run":         Set(&h.DryRun, NoArgs),
	}.Read(d, "", "unknown subdirective %q: expected zone, distributed, persist, headers, status, jitter, sweep_interval, log_key, disable_metrics or dry_run", "zone")
	if err != nil {
		return nil, err
	}
	if len(h.RateLimits) == 0 {
		return nil, d.Err("rate_limit needs at least one zone: zone <name> { key {client_ip}; events 100; window 1m }")
	}
	if globalLine != 0 && (h.Distributed == nil || h.Distributed.Global == nil) {
		return nil, fmt.Errorf("zone %s: scope global needs a global block in distributed: distributed { region <name>; global { redis <url>; regions <name>:<weight>... } }, or remove scope global, at %s:%d", globalZone, d.File(), globalLine)
	}
	return h, nil
}

// unmarshalAdaptive reads adaptive { latency <d>; min <n>; max <n> },
// latency required.
func unmarshalAdaptive(d *caddyfile.Dispenser) (*Adaptive, error) {
	a := new(Adaptive)
	line := d.Line()
	err := Settings{
		"latency": func(d *caddyfile.Dispenser) (err error) {
			if a.Latency, err = DurationArg(d); err == nil && (a.Latency <= 0 || time.Duration(a.Latency) > zones.MaxAdaptiveTarget) {
				err = d.Errf("adaptive latency must be a positive duration of at most %v, the upstream's p90 latency when healthy (e.g. latency 250ms)", zones.MaxAdaptiveTarget)
			}
			return err
		},
		"min": Set(&a.Min, IntIn[int64](1, zones.MaxConcurrency)),
		"max": Set(&a.Max, IntIn[int64](1, zones.MaxConcurrency)),
	}.Read(d, "adaptive: ", "unknown adaptive setting %q: expected latency, min or max")
	switch {
	case err != nil:
		return nil, err
	case a.Latency == 0:
		return nil, fmt.Errorf("adaptive needs a latency target, the upstream's p90 latency when healthy: adaptive { latency 250ms }, at %s:%d", d.File(), line)
	case a.Max != 0 && a.Max < a.Min:
		return nil, fmt.Errorf("adaptive max %d is below min %d: raise max or lower min, at %s:%d", a.Max, a.Min, d.File(), line)
	}
	return a, nil
}

// unmarshalPriority reads priority <placeholder> <class>..., highest class
// first.
func unmarshalPriority(d *caddyfile.Dispenser) (*Priority, error) {
	args := d.RemainingArgs()
	const example = "priority {http.vars.class} signed_in anonymous"
	switch {
	case len(args) < 3:
		return nil, d.Errf("priority needs a placeholder and at least two classes, highest first: %s", example)
	case !hasPlaceholder(args[0]):
		return nil, d.Errf("priority's first argument is the placeholder the class is read from, in braces (%q has none): %s", args[0], example)
	case len(args)-1 > zones.MaxClasses:
		return nil, d.Errf("priority takes at most %d classes", zones.MaxClasses)
	}
	for i, c := range args[1:] {
		if slices.Contains(args[1:i+1], c) {
			return nil, d.Errf("priority class %q is given twice: keep one", c)
		}
	}
	return &Priority{Placeholder: args[0], Classes: args[1:]}, nil
}

// Subdirectives calls f for each subdirective of the block d's token opens,
// refusing an argument left on that token's line and a subdirective given
// twice (twice starts that error) unless it is repeatable, and returns f's
// first error. seen, when not nil, records the subdirectives.
func Subdirectives(d *caddyfile.Dispenser, seen map[string]bool, twice string, f func(sub string) error, repeatable ...string) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	if seen == nil {
		seen = map[string]bool{}
	}
	for nest := d.Nesting(); d.NextBlock(nest); {
		sub := d.Val()
		if seen[sub] && !slices.Contains(repeatable, sub) {
			return d.Errf("%s%s is given twice: keep one", twice, sub)
		}
		seen[sub] = true
		if err := f(sub); err != nil {
			return err
		}
	}
	return nil
}

// Settings are a block's subdirectives' readers, by name: each reads its
// line, d on the subdirective's name.
type Settings map[string]func(d *caddyfile.Dispenser) error

// Read reads the block d's token opens as Subdirectives does, each
// subdirective by its reader; one that has none is the error unknown, a
// format of its name.
func (s Settings) Read(d *caddyfile.Dispenser, twice, unknown string, repeatable ...string) error {
	return Subdirectives(d, nil, twice, func(sub string) error {
		if read := s[sub]; read != nil {
			return read(d)
		}
		return d.Errf(unknown, sub)
	}, repeatable...)
}

// Set is the reader that stores what read reads in dst.
func Set[T any](dst *T, read func(*caddyfile.Dispenser) (T, error)) func(*caddyfile.Dispenser) error {
	return func(d *caddyfile.Dispenser) (err error) {
		*dst, err = read(d)
		return err
	}
}

// IntIn reads a setting whose value is a whole number from lo to hi.
func IntIn[T int | int64](lo, hi T) func(*caddyfile.Dispenser) (T, error) {
	return func(d *caddyfile.Dispenser) (T, error) {
		n, err := int64ArgOf(d, d.Val(), int64(lo), int64(hi))
		return T(n), err
	}
}

// ZoneName reads the name of the zone block whose `zone` token d is on,
// which must not name one of the zones defined before it in the same block
// (in: "handler", "listener wrapper").
func ZoneName[Z any](d *caddyfile.Dispenser, defined map[string]Z, in string) (string, error) {
	if !d.NextArg() {
		return "", d.Err("zone needs a name: zone <name> { ... }")
	}
	name := d.Val()
	if !zones.ValidName(name) {
		return "", d.Errf("zone name %q is invalid: use letters, digits, '_' and '-' only", name)
	}
	if _, dup := defined[name]; dup {
		return "", d.Errf("zone %s is defined twice in this %s: give the second one another name", name, in)
	}
	return name, nil
}

// parseZone reads the zone block whose `zone` token d is on into a new Zone
// of into, the handler's zones. lines says where each subdirective was.
func parseZone(d *caddyfile.Dispenser, into *map[string]*Zone) (name string, lines map[string]int, err error) {
	if name, err = ZoneName(d, *into, "handler"); err != nil {
		return "", nil, err
	}
	z := new(Zone)
	lines = map[string]int{}
	zoneLine := d.Line()
	seen := map[string]bool{}
	settings := Settings{
		"key":    Set(&z.Key, OneArg),
		"events": planInt(true, &z.MaxEventsPlaceholder, &z.MaxEvents, &z.MaxEventsAtMost),
		"window": func(d *caddyfile.Dispenser) error {
			a, err := readPlanArgs(d, true, "at_least")
			switch {
			case err != nil:
				return err
			case a.placeholder == "":
				z.Window, err = DurationArg(d)
				return err
			}
			z.WindowPlaceholder = a.placeholder
			if z.Window, err = ParseDuration(d, "window", a.fallback); err == nil && a.bounds["at_least"] != "" {
				z.WindowAtLeast, err = ParseDuration(d, "window at_least", a.bounds["at_least"])
				if err == nil && z.WindowAtLeast > z.Window {
					err = d.Errf("window at_least %v is longer than the fallback %v: the fallback must be within the bound", time.Duration(z.WindowAtLeast), time.Duration(z.Window))
				}
			}
			return err
		},
		"burst": planInt(false, &z.BurstPlaceholder, &z.Burst, &z.BurstAtMost),
		"cost":  z.readCost,
		"count": func(d *caddyfile.Dispenser) error {
			m := map[string]caddyhttp.ResponseMatcher{}
			if err := caddyhttp.ParseNamedResponseMatcher(d.NewFromNextSegment(), m); err != nil {
				return err
			}
			rm := m["count"]
			z.Count = &rm
			if rm.StatusCode == nil && rm.Headers == nil {
				return d.Err("count needs response matchers, e.g. count { status 401 403 }")
			}
			return nil
		},
		"charge":   z.readCharge,
		"estimate": Set(&z.Estimate, oneOf("request")),
		"include_usage": func(d *caddyfile.Dispenser) error {
			if z.IncludeUsage = d.RemainingArgs(); len(z.IncludeUsage) == 0 {
				return d.Err("include_usage takes off, or the paths (or their ends) of OpenAI chat-completions endpoints, e.g. include_usage /v1/chat/completions")
			}
			return nil
		},
		"match": func(d *caddyfile.Dispenser) error {
			set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
			return err
		},
		"ipv4_prefix": Set(&z.IPv4Prefix, IntIn(1, 32)),
		"ipv6_prefix": Set(&z.IPv6Prefix, IntIn(1, 128)),
		"fail_policy": Set(&z.FailPolicy, oneOf("open", "closed", "local")),
		"max_keys":    Set(&z.MaxKeys, IntIn[int64](1, zones.MaxMaxKeys)),
		"dry_run":     Set(&z.DryRun, NoArgs),
		"scope":       Set(&z.Scope, oneOf("global", "region")),
		"quota":       Set(&z.Quota, unmarshalQuota),
		"ban":         z.readBan,
		"delay": func(d *caddyfile.Dispenser) (err error) {
			if z.Delay, err = DurationArg(d); err == nil && time.Duration(z.Delay) > zones.MaxDelay {
				err = d.Errf("delay %v is longer than the %v a request may wait for its turn: use a shorter delay (a client further away is told Retry-After)", time.Duration(z.Delay), zones.MaxDelay)
			}
			return err
		},
		"queue":       Set(&z.Queue, IntIn[int64](1, zones.MaxQueue)),
		"concurrency": Set(&z.Concurrency, IntIn[int64](1, zones.MaxConcurrency)),
		"adaptive":    Set(&z.Adaptive, unmarshalAdaptive),
		"priority":    Set(&z.Priority, unmarshalPriority),
		"status":      Set(&z.StatusCode, IntIn(400, 599)),
		"challenge":   Set(&z.Challenge, unmarshalChallenge),
		"lease": func(d *caddyfile.Dispenser) (err error) {
			if z.Lease, err = DurationArg(d); err == nil && z.Lease < caddy.Duration(zones.MinLease) {
				err = d.Errf("lease must be at least %v: slots are renewed every lease/3", zones.MinLease)
			}
			return err
		},
	}
	err = Subdirectives(d, seen, "", func(sub string) error {
		lines[sub] = d.Line()
		d, err := usdAmount(d, z, sub, lines) // `<amount> usd`: read in micro-dollars
		if err != nil {
			return err
		}
		switch {
		case sub == "quota" && (seen["events"] || seen["window"] || seen["burst"]),
			(sub == "events" || sub == "window" || sub == "burst") && seen["quota"]:
			return d.Err("a zone has either a quota or a rate: remove events, window and burst, or put the rate in a zone of its own (a rate and a quota for the same key are two zones)")
		case sub == "quota" && (seen["concurrency"] || seen["lease"]),
			(sub == "concurrency" || sub == "lease") && seen["quota"]:
			return d.Err("a zone has either a quota or a concurrency limit: put each in a zone of its own")
		case sub == "adaptive" && (seen["concurrency"] || seen["lease"] || seen["quota"] || seen["events"] || seen["window"] || seen["burst"]),
			(sub == "concurrency" || sub == "lease" || sub == "quota" || sub == "events" || sub == "window" || sub == "burst") && seen["adaptive"]:
			return d.Err("adaptive is a limit of requests in flight that follows the upstream's latency: it replaces concurrency, lease, quota, events, window and burst; remove them, or put that limit in a zone of its own")
		case sub == "concurrency" && (seen["events"] || seen["window"] || seen["burst"]),
			(sub == "events" || sub == "window" || sub == "burst") && seen["concurrency"]:
			return d.Err("concurrency replaces events, window and burst: remove them, or put the rate limit in a zone of its own")
		}
		if read := settings[sub]; read != nil {
			return read(d)
		}
		return d.Errf("unknown subdirective %q: expected key, events, window, burst, quota, cost, count, charge, estimate, include_usage, ban, delay, queue, concurrency, lease, adaptive, priority, status, challenge, scope, match, ipv4_prefix, ipv6_prefix, fail_policy, max_keys or dry_run", sub)
	}, "match")
	if err == nil {
		err = usdUnits(name, d, z, lines)
	}
	if err != nil {
		return "", nil, fmt.Errorf("zone %s: %w", name, err)
	}
	switch {
	case z.Key == "":
		return "", nil, d.Errf("zone %s: key is missing: add e.g. key {client_ip}", name)
	case z.Challenge != nil && (z.Concurrency > 0 || z.Quota != nil || z.Adaptive != nil):
		return "", nil, fmt.Errorf("zone %s: challenge is for rate zones (events, window): a solved challenge's cookie gets a rate of its own; remove challenge, or put it in a rate zone, at %s:%d", name, d.File(), lines["challenge"])
	case seen["priority"] && z.Adaptive == nil:
		return "", nil, fmt.Errorf("zone %s: priority shares an adaptive zone's limit between classes: add adaptive { latency 250ms }, or remove priority, at %s:%d", name, d.File(), lines["priority"])
	case seen["queue"] && !seen["delay"]:
		return "", nil, fmt.Errorf("zone %s: queue bounds the requests waiting for their turn, which only a zone with delay has: add e.g. delay 3s, or remove queue, at %s:%d", name, d.File(), lines["queue"])
	case z.Adaptive != nil && seen["fail_policy"]:
		return "", nil, fmt.Errorf("zone %s: fail_policy does not apply to an adaptive zone: it never asks Redis, so there is no store to fail (its limit is decided on this instance); remove fail_policy, at %s:%d", name, d.File(), lines["fail_policy"])
	case z.Adaptive != nil && (seen["ban"] || seen["cost"] || seen["count"] || seen["charge"] || seen["scope"]):
		var sub string
		for _, s := range []string{"ban", "cost", "count", "charge", "scope"} {
			if seen[s] {
				sub = s
			}
		}
		return "", nil, fmt.Errorf("zone %s: %s does not apply to an adaptive zone, which counts requests in flight on this instance: remove %s, or put it in a zone of its own, at %s:%d", name, sub, sub, d.File(), lines[sub])
	case z.Adaptive != nil:
	case seen["ban"] && (z.Concurrency > 0 || z.Quota != nil):
		kind := "a concurrency zone's denials end as requests finish, not with time"
		if z.Quota != nil {
			kind = "a quota zone's denial already lasts until its period ends"
		}
		return "", nil, fmt.Errorf("zone %s: ban is for rate zones: %s; remove ban (or put a rate zone with ban beside it), at %s:%d", name, kind, d.File(), lines["ban"])
	case seen["delay"] && (z.Concurrency > 0 || z.Quota != nil):
		kind := "a concurrency zone's slot frees when a request ends, at no time known in advance"
		if z.Quota != nil {
			kind = "a quota zone's next unit comes at the period's end"
		}
		return "", nil, fmt.Errorf("zone %s: delay is for rate zones: %s; remove delay (or put a rate zone with delay beside it), at %s:%d", name, kind, d.File(), lines["delay"])
	case seen["delay"] && (z.Count != nil || z.Charge != "" || z.ChargeJSON != nil):
		return "", nil, fmt.Errorf("zone %s: delay is for zones that consume before the request: a post-charged zone (count, charge) only checks then, so there is no turn to wait for; remove delay, or put a rate zone with delay beside it, at %s:%d", name, d.File(), lines["delay"])
	case z.Scope == "global" && (z.Concurrency > 0 || z.Quota != nil):
		return "", nil, fmt.Errorf("zone %s: scope global applies to rate zones (events per window), not to concurrency or quota zones: remove scope global, at %s:%d", name, d.File(), lines["scope"])
	case z.Concurrency == 0 && seen["lease"]:
		return "", nil, d.Errf("zone %s: lease only applies to concurrency zones: add e.g. concurrency 4, or remove lease", name)
	case z.Concurrency > 0 && (seen["cost"] || seen["count"] || seen["charge"]):
		sub := "cost"
		for _, s := range []string{"count", "charge"} {
			if seen[s] {
				sub = s
			}
		}
		return "", nil, fmt.Errorf("zone %s: %s does not apply to a concurrency zone, which counts requests in flight, not their cost: remove %s, or put it in a rate zone (events, window) of its own, at %s:%d", name, sub, sub, d.File(), lines[sub])
	case z.Concurrency > 0:
	case z.Quota != nil:
		if z.Cost > z.Quota.Limit && z.Quota.Limit > 0 && z.Charge == "" && z.Count == nil {
			return "", nil, fmt.Errorf("zone %s: cost %d is more than the quota (%d): such requests could never pass; lower cost or raise the quota, at %s:%d",
				name, z.Cost, z.Quota.Limit, d.File(), lines["cost"])
		}
	case z.MaxEvents == 0:
		return "", nil, d.Errf("zone %s: events is missing: add e.g. events 100 (or a calendar quota: quota 1000 per day)", name)
	case z.Window == 0:
		return "", nil, d.Errf("zone %s: window is missing: add e.g. window 1m", name)
	case z.Cost > cmp.Or(z.Burst, z.MaxEvents):
		return "", nil, fmt.Errorf("zone %s: cost %d is more than the burst (%d): such requests could never pass; lower cost or raise burst, at %s:%d",
			name, z.Cost, cmp.Or(z.Burst, z.MaxEvents), d.File(), lines["cost"])
	case z.Charge != "" && z.ChargeJSON != nil:
		return "", nil, fmt.Errorf("zone %s: charge is read from a placeholder or from the body (charge json), not both: keep one, at %s:%d", name, d.File(), lines["charge"])
	}
	// What provisioning would refuse, refused here with the line at fault.
	if z.Concurrency == 0 && z.Quota == nil && z.Adaptive == nil {
		if setting, err := z.Limits(name).Check(); err != nil {
			return "", nil, fmt.Errorf("zone %s: %w, at %s:%d", name, err, d.File(), cmp.Or(lines[setting], zoneLine))
		}
	}
	if *into == nil {
		*into = make(map[string]*Zone)
	}
	(*into)[name] = z
	return name, lines, nil
}

func unmarshalPersist(d *caddyfile.Dispenser) (*Persist, error) {
	p := new(Persist)
	return p, Settings{
		"interval": func(d *caddyfile.Dispenser) (err error) {
			if p.Interval, err = DurationArg(d); err == nil && time.Duration(p.Interval) < MinPersistInterval {
				err = d.Errf("persist interval must be at least %v, not %v", MinPersistInterval, time.Duration(p.Interval))
			}
			return err
		},
		"max_age": Set(&p.MaxAge, DurationArg),
	}.Read(d, "", "unknown persist subdirective %q: expected interval or max_age")
}

func unmarshalDistributed(d *caddyfile.Dispenser) (*Distributed, error) {
	dist := new(Distributed)
	var syncLine, regionLine int
	settings := Settings{
		"redis": Set(&dist.Redis, unmarshalRedis),
		"mode":  Set(&dist.Mode, oneOf("strict", "async")),
		"sync_interval": func(d *caddyfile.Dispenser) (err error) {
			syncLine = d.Line()
			dist.SyncInterval, err = DurationArg(d)
			return err
		},
		// mholt/caddy-ratelimit's names: see Distributed.ReadInterval.
		"read_interval":  Set(&dist.ReadInterval, DurationArg),
		"write_interval": Set(&dist.WriteInterval, DurationArg),
		// mholt/caddy-ratelimit's clean-up age: every tally key has a TTL
		// instead, so it is accepted and has no effect.
		"purge_age": Set(new(caddy.Duration), DurationArg),
		"timeout":   Set(&dist.Timeout, DurationArg),
		"key_prefix": func(d *caddyfile.Dispenser) (err error) {
			if dist.KeyPrefix, err = OneArg(d); err == nil && len(dist.KeyPrefix) > maxKeyPrefix {
				err = d.Errf("key_prefix is longer than %d bytes: use a shorter one", maxKeyPrefix)
			}
			return err
		},
		"region": func(d *caddyfile.Dispenser) (err error) {
			regionLine = d.Line()
			if dist.Region, err = OneArg(d); err == nil && !zones.ValidName(dist.Region) {
				err = d.Errf("region name %q is invalid: use letters, digits, '_' and '-'", dist.Region)
			}
			return err
		},
		"global": Set(&dist.Global, unmarshalGlobal),
	}
	for _, sub := range []string{"addresses", "username", "password", "db", "sentinel_master", "tls", "tls_ca", "tls_client"} {
		settings[sub] = func(d *caddyfile.Dispenser) error {
			return d.Errf("%s belongs in the redis block: redis { addresses <host:port>...; %s ... }", sub, sub)
		}
	}
	err := settings.Read(d, "", "unknown subdirective %q: expected redis, mode, sync_interval, timeout, key_prefix, region or global")
	if err != nil {
		return nil, fmt.Errorf("distributed: %w", err)
	}
	if dist.Redis == nil {
		return nil, d.Err("distributed needs Redis: tally shares state through Redis, not Caddy's storage; add e.g. redis redis://127.0.0.1:6379")
	}
	if syncLine != 0 && dist.Mode != "async" {
		return nil, fmt.Errorf("distributed: sync_interval only applies to mode async (strict mode asks Redis on every request): remove it or add mode async, at %s:%d", d.File(), syncLine)
	}
	return dist, dist.checkRegion(d, regionLine)
}

// checkRegion refuses a region without a global block, a global block
// without a region, and a region not among the global block's.
func (dist *Distributed) checkRegion(d *caddyfile.Dispenser, regionLine int) error {
	switch {
	case dist.Global == nil && dist.Region != "":
		return fmt.Errorf("distributed: region only applies with a global block: add global { redis <url>; regions %s:1 ... } or remove region, at %s:%d", dist.Region, d.File(), regionLine)
	case dist.Global == nil:
		return nil
	case dist.Region == "":
		return d.Errf("distributed: global needs this region's name: add region <name>, one of the regions of global")
	}
	if _, ok := dist.Global.Regions[dist.Region]; !ok {
		names := slices.Sorted(maps.Keys(dist.Global.Regions))
		return fmt.Errorf("distributed: region %s is not one of global's regions (%s): add it, e.g. regions %s %s:1, or fix its name, at %s:%d",
			dist.Region, strings.Join(names, ", "), strings.Join(names, " "), dist.Region, d.File(), regionLine)
	}
	return nil
}

func unmarshalRedis(d *caddyfile.Dispenser) (*Redis, error) {
	r := &Redis{Addresses: d.RemainingArgs()}
	if len(r.Addresses) > 0 {
		if err := checkAddresses(d, r.Addresses); err != nil {
			return nil, err
		}
		if d.NextBlock(d.Nesting()) {
			return nil, d.Err("redis takes either addresses on its line or a block, not both")
		}
		return r, nil
	}
	err := Settings{
		"addresses": func(d *caddyfile.Dispenser) error {
			if r.Addresses = d.RemainingArgs(); len(r.Addresses) == 0 {
				return d.Err("redis: addresses needs at least one address, e.g. addresses 127.0.0.1:6379")
			}
			return checkAddresses(d, r.Addresses)
		},
		"username":        Set(&r.Username, OneArg),
		"password":        Set(&r.Password, OneArg),
		"db":              Set(&r.DB, IntIn(0, 1<<20)),
		"sentinel_master": Set(&r.SentinelMaster, OneArg),
		"tls":             Set(&r.TLS, NoArgs),
		"tls_ca":          Set(&r.TLSCA, OneArg),
		"tls_client": func(d *caddyfile.Dispenser) error {
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Err("redis: tls_client takes a certificate file and its key file, e.g. tls_client /etc/tally/client.pem /etc/tally/client-key.pem")
			}
			r.TLSCert, r.TLSKey = args[0], args[1]
			return nil
		},
	}.Read(d, "redis: ", "redis: unknown subdirective %q: expected addresses, username, password, db, sentinel_master, tls, tls_ca or tls_client")
	if err != nil {
		return nil, err
	}
	if len(r.Addresses) == 0 {
		return nil, d.Err("redis needs an address: redis redis://127.0.0.1:6379, or addresses inside its block")
	}
	return r, nil
}

// readCharge reads `charge <placeholder> [fallback]`, `charge json <path>
// [+ <path>...]` or `charge tokens [input|output|total]`.
func (z *Zone) readCharge(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) > 0 && args[0] == "usd" {
		for range args[1:] {
			d.Prev()
		}
		return parseChargeUSD(d, z)
	}
	if len(args) > 0 && args[0] == "tokens" {
		switch {
		case len(args) > 2:
			return d.Errf("charge tokens takes one of input, output or total (total if left out), not %q", strings.Join(args[1:], " "))
		case len(args) == 1:
			z.ChargeTokens = "total"
		default:
			z.ChargeTokens = args[1]
		}
		if err := CheckTokenCount(z.ChargeTokens); err != nil {
			return d.Errf("charge tokens: %v", err)
		}
		return nil
	}
	if len(args) == 0 || args[0] != "json" {
		var err error
		switch {
		case len(args) == 0 || !strings.HasPrefix(args[0], "{"):
			return d.Err("charge takes a placeholder read after the response, e.g. charge {http.response.header.X-Tokens-Used}, or paths in the response body, e.g. charge json usage.total_tokens, or an LLM API's token usage: charge tokens [input|output|total]")
		case SinglePlaceholder(args[0]) == "":
			return d.Errf("charge takes a number or one placeholder such as {plan_rpm}, not %q", args[0])
		case len(args) > 2:
			return d.Errf("charge takes one value, written without spaces: charge %s", strings.Join(args[1:], ""))
		case len(args) == 2:
			z.Cost, err = ParseInt64(d, "charge", args[1], 1, zones.MaxEvents)
		}
		z.Charge = args[0]
		return err
	}
	const example = "e.g. charge json usage.total_tokens, or charge json usage.input_tokens + usage.output_tokens"
	paths := args[1:]
	for i, a := range paths {
		switch {
		case i%2 == 1 && a != "+":
			return d.Errf("charge json: %q where + was expected: join paths by + with spaces around it, %s", a, example)
		case i%2 == 0 && a == "+":
			return d.Errf("charge json: + where a path was expected, %s", example)
		case i%2 == 0:
			z.ChargeJSON = append(z.ChargeJSON, a)
		}
	}
	if len(paths)%2 == 0 {
		return d.Errf("charge json takes dot paths of the response's JSON joined by +, %s", example)
	}
	if _, err := usage.ParsePaths(z.ChargeJSON); err != nil {
		return d.Errf("charge json: %v", err)
	}
	return nil
}

// planInt reads events or burst, the setting d is on: a literal into lit,
// or a placeholder, into placeholder, with its fallback (needFallback: a
// required one) into lit and its at_most bound into atMost.
func planInt(needFallback bool, placeholder *string, lit, atMost *int64) func(*caddyfile.Dispenser) error {
	return func(d *caddyfile.Dispenser) error {
		dir := d.Val()
		a, err := readPlanArgs(d, needFallback, "at_most")
		switch {
		case err != nil:
			return err
		case a.placeholder == "":
			*lit, err = int64ArgOf(d, dir, 1, zones.MaxEvents)
			return err
		case a.fallback != "":
			if *lit, err = ParseInt64(d, dir, a.fallback, 1, zones.MaxEvents); err != nil {
				return err
			}
		}
		*placeholder = a.placeholder
		if bound := a.bounds["at_most"]; bound != "" {
			if *atMost, err = ParseInt64(d, dir+" at_most", bound, 1, zones.MaxEvents); err == nil && *atMost < *lit {
				err = d.Errf("%s at_most %d is less than the fallback %d: the fallback must be within the bound", dir, *atMost, *lit)
			}
		}
		return err
	}
}

// planArgs are the arguments of `events`, `window`, `burst` or `cost`
// given a placeholder: `<setting> <placeholder> [<fallback>] [<keyword>
// <bound>]...`.
type planArgs struct {
	placeholder string            // its name; "" when the setting is a literal
	fallback    string            // "" when not given
	bounds      map[string]string // the value after each keyword given
}

// planExamples are each plan setting's example placeholder and fallback,
// for its errors.
var planExamples = map[string][2]string{
	"events": {"{plan_rpm}", "60"}, "burst": {"{plan_rpm}", "60"}, "window": {"{plan_rpm}", "1m"},
	"cost": {"{http.request.header.X-Search-Cost}", "1"},
}

// readPlanArgs reads a plan setting's arguments, the bounds after the
// fallback, in any order, each at most once. For a literal it returns no
// placeholder, the dispenser on the setting's name to read it, and
// refuses keywords (at_most, at_least) with the fix. needFallback: the
// fallback is required.
func readPlanArgs(d *caddyfile.Dispenser, needFallback bool, keywords ...string) (planArgs, error) {
	dir := d.Val()
	args := d.RemainingArgs()
	isKeyword := func(s string) bool { return slices.Contains(keywords, s) }
	named, bounds := strings.Join(keywords, " and "), strings.Join(keywords, " <bound> ")+" <bound>"
	verb, each := "bounds", "and a bound"
	if len(keywords) > 1 {
		verb, each = "bound", "with a bound each"
	}
	if len(args) == 0 || !strings.HasPrefix(args[0], "{") {
		if slices.ContainsFunc(args, isKeyword) {
			return planArgs{}, d.Errf("%s %s %s the values of a placeholder: write %s {plan_value} <fallback> %s, or the literal alone", dir, named, verb, dir, bounds)
		}
		for range args {
			d.Prev()
		}
		return planArgs{}, nil
	}
	a := planArgs{placeholder: args[0], bounds: map[string]string{}}
	if SinglePlaceholder(a.placeholder) == "" {
		return a, d.Errf("%s takes a number or one placeholder such as %s, not %q", dir, planExamples[dir][0], a.placeholder)
	}
	rest := args[1:]
	for n := len(rest); n >= 2 && isKeyword(rest[n-2]); n = len(rest) {
		if _, twice := a.bounds[rest[n-2]]; twice {
			return a, d.Errf("%s %s is given twice: keep one", dir, rest[n-2])
		}
		a.bounds[rest[n-2]], rest = rest[n-1], rest[:n-2]
	}
	fallback := planExamples[dir][1]
	switch {
	case len(rest) > 1 || slices.ContainsFunc(rest, isKeyword):
		return a, d.Errf("%s %s takes a fallback and, optionally, %s %s: %s %s %s %s", dir, a.placeholder, named, each, dir, a.placeholder, fallback, bounds)
	case len(rest) == 1:
		a.fallback = rest[0]
	case needFallback:
		return a, d.Errf("%s %s needs a fallback for requests where it is empty or invalid: %s %s %s", dir, a.placeholder, dir, a.placeholder, fallback)
	}
	return a, nil
}

// readCost reads `cost <n>` or `cost <placeholder> [<fallback n>] [at_least
// <n>] [at_most <n>]`, the fallback within the bounds.
func (z *Zone) readCost(d *caddyfile.Dispenser) error {
	a, err := readPlanArgs(d, false, "at_least", "at_most")
	switch {
	case err != nil:
		return err
	case a.placeholder == "":
		z.Cost, err = int64ArgOf(d, "cost", 1, zones.MaxEvents)
		return err
	case a.fallback != "":
		if z.Cost, err = ParseInt64(d, "cost", a.fallback, 1, zones.MaxEvents); err != nil {
			return err
		}
	}
	z.CostPlaceholder = a.placeholder
	dst := map[string]*int64{"at_least": &z.CostAtLeast, "at_most": &z.CostAtMost}
	for _, kw := range []string{"at_least", "at_most"} { // in this order: the first error is at_least's
		if bound := a.bounds[kw]; bound != "" {
			if *dst[kw], err = ParseInt64(d, "cost "+kw, bound, 1, zones.MaxEvents); err != nil {
				return err
			}
		}
	}
	cost := max(z.Cost, 1)
	switch {
	case z.CostAtLeast != 0 && z.CostAtMost != 0 && z.CostAtLeast > z.CostAtMost:
		return d.Errf("cost at_least %d is more than at_most %d", z.CostAtLeast, z.CostAtMost)
	case z.CostAtLeast > cost || (z.CostAtMost != 0 && z.CostAtMost < cost):
		return d.Errf("cost's fallback %d is outside at_least and at_most: the fallback is what a request costs without a usable value, so it must be within the bounds", cost)
	}
	return nil
}

// checkAddresses refuses, at their line, Redis addresses that cannot work;
// those with placeholders are checked at provision.
func checkAddresses(d *caddyfile.Dispenser, addrs []string) error {
	for _, a := range addrs {
		if err := checkAddress(a); err != nil && !strings.Contains(a, "{") {
			return d.Errf("redis: %v", err)
		}
	}
	return nil
}

// readBan reads ban <first> [<max>].
func (z *Zone) readBan(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return d.Err("ban takes a duration and optionally the longest escalated ban: ban 1h, or ban 10m 24h")
	}
	first, err := ParseDuration(d, "ban", args[0])
	if err != nil {
		return err
	}
	var most caddy.Duration
	if len(args) == 2 {
		if most, err = ParseDuration(d, "ban's longest", args[1]); err != nil {
			return err
		}
		if most < first {
			return d.Errf("ban %s %s: the longest ban is shorter than the first; write ban <first> <max> with max >= first", args[0], args[1])
		}
	}
	if time.Duration(max(first, most)) > zones.MaxBan {
		return d.Errf("ban %s: longer than the 100 years tally can represent", strings.Join(args, " "))
	}
	z.Ban, z.BanMax = first, most
	return nil
}

// OneArg reads the one value of a setting whose value is text (a key
// template, a prefix, a name), which may hold spaces when quoted.
func OneArg(d *caddyfile.Dispenser) (string, error) {
	dir := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s needs a value", dir)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s takes one value; to use spaces, quote it", dir)
	}
	return v, nil
}

// oneWord reads the one value of setting dir when it is a number, a
// duration or a keyword, none of which holds a space, quoted or not: the
// error for "window 1 m" says what to write (window 1m), not to quote it.
func oneWord(d *caddyfile.Dispenser, dir string) (string, error) {
	if !d.NextArg() {
		return "", d.Errf("%s needs a value", dir)
	}
	args := append([]string{d.Val()}, d.RemainingArgs()...)
	if len(args) > 1 {
		return "", d.Errf("%s takes one value, written without spaces: %s %s", dir, dir, strings.Join(args, ""))
	}
	return args[0], nil
}

// oneOf reads a setting whose value is one of allowed.
func oneOf(allowed ...string) func(*caddyfile.Dispenser) (string, error) {
	return func(d *caddyfile.Dispenser) (string, error) {
		dir := d.Val()
		args := d.RemainingArgs()
		if len(args) == 1 && slices.Contains(allowed, args[0]) {
			return args[0], nil
		}
		if len(args) == 0 {
			return "", d.Errf("%s needs a value: one of %s", dir, strings.Join(allowed, ", "))
		}
		return "", d.Errf("%s must be one of %s, not %q", dir, strings.Join(allowed, ", "), strings.Join(args, " "))
	}
}

// int64ArgOf reads the setting dir's next argument as a whole number from
// lo to hi, in 64 bits so that every platform has the same limits.
func int64ArgOf(d *caddyfile.Dispenser, dir string, lo, hi int64) (int64, error) {
	s, err := oneWord(d, dir)
	if err != nil {
		return 0, err
	}
	return ParseInt64(d, dir, s, lo, hi)
}

// ParseInt64 reads s, the value of setting dir, as a whole number from lo
// to hi.
func ParseInt64(d *caddyfile.Dispenser, dir, s string, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, d.Errf("%s must be a whole number from %d to %d, not %q", dir, lo, hi, s)
	}
	return n, nil
}

func DurationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	dir := d.Val()
	s, err := oneWord(d, dir)
	if err != nil {
		return 0, err
	}
	return ParseDuration(d, dir, s)
}

// ParseDuration reads s, the value of setting dir, as a positive duration.
func ParseDuration(d *caddyfile.Dispenser, dir, s string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(s)
	if err != nil || dur <= 0 {
		return 0, d.Errf("%s must be a positive duration such as 500ms, 10s, 1m or 1h, not %q", dir, s)
	}
	return caddy.Duration(dur), nil
}

// NoArgs reads a flag, true, refusing a value after the setting d is on.
func NoArgs(d *caddyfile.Dispenser) (bool, error) {
	if dir := d.Val(); d.NextArg() {
		return false, d.Errf("%s takes no value", dir)
	}
	return true, nil
}
