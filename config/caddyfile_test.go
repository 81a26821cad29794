package config

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func parse(t *testing.T, input string) (*Directive, error) {
	t.Helper()
	return ParseDirective(caddyfile.NewTestDispenser(input))
}

func TestCaddyfileFullSyntax(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 100
			window 1m
			burst 10
			match {
				path /api/*
			}
			match {
				host api.example.com
			}
			ipv4_prefix 24
			ipv6_prefix 64
			fail_policy closed
			max_keys 5000
			dry_run
		}
		zone login {
			key {client_ip}
			events 5
			window 1m
		}
		distributed {
			redis redis://127.0.0.1:6379 redis://127.0.0.1:6380
			mode strict
			timeout 50ms
			key_prefix myapp:
		}
		headers ietf
		status 503
		jitter 0.25
		sweep_interval 30s
		log_key
		disable_metrics
		dry_run
	}`)
	if err != nil {
		t.Fatal(err)
	}
	api := h.RateLimits["api"]
	if api == nil || h.RateLimits["login"] == nil {
		t.Fatalf("zones = %v", h.RateLimits)
	}
	if api.Key != "{http.request.header.X-API-Key}" || api.MaxEvents != 100 || time.Duration(api.Window) != time.Minute ||
		api.Burst != 10 || len(api.MatcherSetsRaw) != 2 || api.IPv4Prefix != 24 || api.IPv6Prefix != 64 ||
		api.FailPolicy != "closed" || api.MaxKeys != 5000 || !api.DryRun {
		t.Errorf("zone api = %+v", api)
	}
	d := h.Distributed
	if d == nil || len(d.Redis.Addresses) != 2 || d.Mode != "strict" || time.Duration(d.Timeout) != 50*time.Millisecond || d.KeyPrefix != "myapp:" {
		t.Errorf("distributed = %+v", d)
	}
	if h.Headers != "ietf" || h.StatusCode != 503 || h.Jitter != 0.25 || time.Duration(h.SweepInterval) != 30*time.Second ||
		!h.LogKey || !h.DisableMetrics || !h.DryRun {
		t.Errorf("handler = %+v", h)
	}
}

func TestCaddyfilePlaceholderLimitsWithFallbacks(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone per_customer {
			key    {http.request.header.X-API-Key}
			events {plan_rpm} 60
			window {plan_window} 1m
			burst  {plan_burst}
		}
		zone literal_burst_fallback {
			key    {client_ip}
			events 10
			window 1s
			burst  {plan_burst} 5
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["per_customer"]
	if z.MaxEventsPlaceholder != "{plan_rpm}" || z.MaxEvents != 60 || z.WindowPlaceholder != "{plan_window}" ||
		time.Duration(z.Window) != time.Minute || z.BurstPlaceholder != "{plan_burst}" || z.Burst != 0 {
		t.Errorf("zone per_customer = %+v", z)
	}
	if z := h.RateLimits["literal_burst_fallback"]; z.BurstPlaceholder != "{plan_burst}" || z.Burst != 5 {
		t.Errorf("zone literal_burst_fallback = %+v", z)
	}
}

// A plan a client could set is bounded on the setting's line: at_most for
// events and burst, at_least for window, after the fallback.
func TestCaddyfilePlaceholderLimitsWithBounds(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone bounded {
			key    {http.request.header.X-API-Key}
			events {http.request.header.X-Events} 60 at_most 6000
			window {http.request.header.X-Window} 1m at_least 1s
			burst  {http.request.header.X-Burst} 10 at_most 100
		}
		zone burst_bound_only {
			key    {client_ip}
			events 10
			window 1s
			burst  {plan_burst} at_most 20
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["bounded"]
	if z.MaxEvents != 60 || z.MaxEventsAtMost != 6000 || time.Duration(z.Window) != time.Minute || time.Duration(z.WindowAtLeast) != time.Second ||
		z.Burst != 10 || z.BurstAtMost != 100 || z.MaxEventsPlaceholder != "{http.request.header.X-Events}" {
		t.Errorf("zone bounded = %+v", z)
	}
	if z := h.RateLimits["burst_bound_only"]; z.BurstPlaceholder != "{plan_burst}" || z.Burst != 0 || z.BurstAtMost != 20 {
		t.Errorf("zone burst_bound_only = %+v", z)
	}
}

func TestCaddyfileCostCountAndCharge(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone failed_logins {
			key    {client_ip}
			events 5
			window 15m
			count {
				status 401 4xx
				header X-Login-Failed *
			}
		}
		zone one_line {
			key    {client_ip}
			events 5
			window 15m
			count status 403
		}
		zone tokens {
			key    {http.request.header.Authorization}
			events 100000
			window 1m
			charge {http.response.header.X-Tokens-Used} 500
		}
		zone search {
			key    {client_ip}
			events 600
			window 1m
			cost   {http.request.header.X-Search-Cost} 2
		}
		zone heavy {
			key    {client_ip}
			events 600
			window 1m
			cost   10
		}
		zone llm {
			key    {http.request.header.Authorization}
			events 100000
			window 1h
			cost   {http.request.header.X-Max-Tokens} 1000 at_least 1
			charge json usage.input_tokens + usage.output_tokens
		}
		zone llm_total {
			key    {http.request.header.Authorization}
			events 100000
			window 1h
			charge tokens
		}
		zone llm_output {
			key    {http.request.header.Authorization}
			events 100000
			window 1h
			charge tokens output
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	fl := h.RateLimits["failed_logins"].Count
	if fl == nil || len(fl.StatusCode) != 2 || fl.StatusCode[0] != 401 || fl.StatusCode[1] != 4 || fl.Headers.Get("X-Login-Failed") != "*" || len(fl.Headers) != 1 {
		t.Errorf("count of failed_logins = %+v", fl)
	}
	if c := h.RateLimits["one_line"].Count; c == nil || len(c.StatusCode) != 1 || c.StatusCode[0] != 403 {
		t.Errorf("count of one_line = %+v", c)
	}
	if z := h.RateLimits["tokens"]; z.Charge != "{http.response.header.X-Tokens-Used}" || z.Cost != 500 {
		t.Errorf("zone tokens = %+v", z)
	}
	if z := h.RateLimits["search"]; z.CostPlaceholder != "{http.request.header.X-Search-Cost}" || z.Cost != 2 {
		t.Errorf("zone search = %+v", z)
	}
	if z := h.RateLimits["heavy"]; z.CostPlaceholder != "" || z.Cost != 10 {
		t.Errorf("zone heavy = %+v", z)
	}
	if z := h.RateLimits["llm"]; !slices.Equal(z.ChargeJSON, []string{"usage.input_tokens", "usage.output_tokens"}) ||
		z.CostPlaceholder != "{http.request.header.X-Max-Tokens}" || z.Cost != 1000 || z.Charge != "" {
		t.Errorf("zone llm = %+v", z)
	}
	if a, b := h.RateLimits["llm_total"].ChargeTokens, h.RateLimits["llm_output"].ChargeTokens; a != "total" || b != "output" {
		t.Errorf("charge tokens: %q and %q, want total and output", a, b)
	}
}

func TestCaddyfileRedisBlock(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone z {
			key {client_ip}
			events 1
			window 1s
		}
		distributed {
			redis {
				addresses 10.0.0.1:26379 10.0.0.2:26379
				username tally
				password {env.REDIS_PASSWORD}
				db 2
				sentinel_master mymaster
				tls
			}
			read_interval 200ms
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	r := h.Distributed.Redis
	if len(r.Addresses) != 2 || r.Username != "tally" || r.Password != "{env.REDIS_PASSWORD}" || r.DB != 2 ||
		r.SentinelMaster != "mymaster" || !r.TLS {
		t.Errorf("redis = %+v", r)
	}
	if time.Duration(h.Distributed.ReadInterval) != 200*time.Millisecond || h.Distributed.SyncInterval != 0 {
		t.Errorf("read_interval 200ms: read_interval %v, sync_interval %v", h.Distributed.ReadInterval, h.Distributed.SyncInterval)
	}
}

// mholt/caddy-ratelimit's read_interval and write_interval load in either
// mode, as its configs carry them whatever the mode: in async mode the
// larger is the sync interval unless sync_interval is given, in strict mode
// they are ignored (and logged), while tally's own sync_interval is refused
// there with its line.
func TestMholtIntervalsAreTheAsyncSyncIntervalAndIgnoredInStrictMode(t *testing.T) {
	for _, tc := range []struct {
		name, block string
		want        time.Duration
		ignored     bool
	}{
		{"strict", "read_interval 200ms\n\t\twrite_interval 300ms", 0, true},
		{"async", "mode async\n\t\tread_interval 200ms\n\t\twrite_interval 300ms", 300 * time.Millisecond, false},
		{"async, sync_interval wins", "mode async\n\t\tread_interval 200ms\n\t\tsync_interval 50ms", 50 * time.Millisecond, false},
		{"async, default", "mode async", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parse(t, "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n\t\tevents 1\n\t\twindow 1s\n\t}\n\tdistributed {\n\t\tredis 127.0.0.1:6379\n\t\t"+tc.block+"\n\t}\n}")
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.InfoLevel)
			got, err := h.Distributed.syncInterval(zap.New(core))
			if err != nil || got != tc.want {
				t.Errorf("sync interval %v (%v), want %v", got, err, tc.want)
			}
			if n := logs.FilterMessageSnippet("have no effect in strict mode").Len(); (n == 1) != tc.ignored {
				t.Errorf("%d lines saying the intervals are ignored, want ignored=%v", n, tc.ignored)
			}
		})
	}
	if _, err := parse(t, "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n\t\tevents 1\n\t\twindow 1s\n\t}\n\tdistributed {\n\t\tredis 127.0.0.1:6379\n\t\tread_interval 1s\n\t\tread_interval 2s\n\t}\n}"); err == nil ||
		!strings.Contains(err.Error(), "read_interval is given twice") {
		t.Errorf("read_interval twice: %v", err)
	}
}

func TestCaddyfileErrorsNameTheLineAndTheFix(t *testing.T) {
	zone := func(body string) string {
		return "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n" + body + "\n\t}\n}"
	}
	tests := []struct {
		name, input string
		line        int
		want        string
	}{
		{"unknown subdirective", zone("\t\tevents 1\n\t\twindow 1s\n\t\tlimit 5"), 6, `zone z: unknown subdirective "limit"`},
		{"repeated subdirective", zone("\t\tevents 1\n\t\tevents 2\n\t\twindow 1s"), 5, "zone z: events is given twice"},
		{"bad number", zone("\t\tevents ten\n\t\twindow 1s"), 4, `zone z: events must be a whole number from 1`},
		{"zero events", zone("\t\tevents 0\n\t\twindow 1s"), 4, `zone z: events must be a whole number from 1`},
		{"bad duration", zone("\t\tevents 1\n\t\twindow soon"), 5, `zone z: window must be a positive duration such as 500ms, 10s, 1m or 1h, not "soon"`},
		{"missing events", zone("\t\twindow 1s"), 5, "events is missing: add e.g. events 100"},
		{"missing window", zone("\t\tevents 1"), 5, "window is missing: add e.g. window 1m"},
		{"bad fail policy", zone("\t\tevents 1\n\t\twindow 1s\n\t\tfail_policy maybe"), 6, "zone z: fail_policy must be one of open, closed, local"},
		{"invalid zone name", "rate_limit {\n\tzone a.b {\n\t\tkey x\n\t}\n}", 2, `zone name "a.b" is invalid`},
		{"no zone", "rate_limit {\n\theaders both\n}", 3, "at least one zone"},
		{"unknown handler subdirective", "rate_limit {\n\tzones x\n}", 2, `unknown subdirective "zones"`},
		{"bad headers mode", "rate_limit {\n\theaders some\n}", 2, "headers must be one of both, ietf, legacy, off"},
		{"bad jitter", "rate_limit {\n\tjitter 2\n}", 2, "jitter must be a fraction between 0 and 1"},
		{"distributed without redis", "rate_limit {\n\tdistributed {\n\t\tread_interval 1s\n\t}\n}", 4, "distributed needs Redis"},
		{"bad mode", "rate_limit {\n\tdistributed {\n\t\tmode eventually\n\t}\n}", 3, "mode must be one of strict, async"},
		{"flag with value", "rate_limit {\n\tlog_key yes\n}", 2, "log_key takes no value"},
		{"placeholder events without fallback", zone("\t\tevents {plan_rpm}\n\t\twindow 1s"), 4, "events {plan_rpm} needs a fallback for requests where it is empty or invalid: events {plan_rpm} 60"},
		{"placeholder window without fallback", zone("\t\tevents 1\n\t\twindow {plan_window}"), 5, "window {plan_window} 1m"},
		{"bad fallback", zone("\t\tevents {plan_rpm} many\n\t\twindow 1s"), 4, `events must be a whole number from 1`},
		{"two placeholders", zone("\t\tevents {a}{b} 5\n\t\twindow 1s"), 4, "events takes a number or one placeholder"},
		{"bound on a literal", zone("\t\tevents 60 at_most 100\n\t\twindow 1s"), 4, "events at_most bounds the values of a placeholder"},
		{"cost bound on a literal", zone("\t\tevents 60\n\t\twindow 1s\n\t\tcost 2 at_least 1"), 6, "cost at_least and at_most bound the values of a placeholder"},
		{"cost fallback beyond its bound", zone("\t\tevents 60\n\t\twindow 1s\n\t\tcost {http.request.header.X-Cost} 5 at_most 4"), 6, "outside at_least and at_most"},
		{"cost bounds crossed", zone("\t\tevents 60\n\t\twindow 1s\n\t\tcost {http.request.header.X-Cost} at_least 5 at_most 4"), 6, "at_least 5 is more than at_most 4"},
		{"cost bound twice", zone("\t\tevents 60\n\t\twindow 1s\n\t\tcost {http.request.header.X-Cost} at_most 5 at_most 4"), 6, "cost at_most is given twice"},
		{"bound without a value", zone("\t\tevents {p} 60 at_most\n\t\twindow 1s"), 4, "events {p} takes a fallback and, optionally, at_most and a bound: events {p} 60 at_most <bound>"},
		{"bound without a fallback", zone("\t\tevents {p} at_most 100\n\t\twindow 1s"), 4, "events {p} needs a fallback"},
		{"bad bound", zone("\t\tevents {p} 60 at_most lots\n\t\twindow 1s"), 4, `events at_most must be a whole number from 1 to 1099511627776, not "lots"`},
		{"fallback over the bound", zone("\t\tevents {p} 60 at_most 30\n\t\twindow 1s"), 4, "events at_most 30 is less than the fallback 60"},
		{"window bound over the fallback", zone("\t\tevents 1\n\t\twindow {p} 1m at_least 2m"), 5, "window at_least 2m0s is longer than the fallback 1m0s"},
		{"window bound of the wrong kind", zone("\t\tevents 1\n\t\twindow {p} 1m at_most 2m"), 5, "window {p} takes a fallback and, optionally, at_least and a bound"},
		{"burst fallback over the bound", zone("\t\tevents 10\n\t\twindow 1s\n\t\tburst {p} 8 at_most 5"), 6, "burst at_most 5 is less than the fallback 8"},
		{"zero cost", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcost 0"), 6, "cost must be a whole number from 1"},
		{"empty count", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcount {\n\t\t}"), 7, "count needs response matchers"},
		{"unknown response matcher", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcount {\n\t\t\tpath /x\n\t\t}"), 7, "unrecognized response matcher path"},
		{"charge without placeholder", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge 5"), 6, "charge takes a placeholder read after the response"},
		{"charge json without a path", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json"), 6, "charge json takes dot paths of the response's JSON joined by +"},
		{"charge json paths without +", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json a.b c.d"), 6, `charge json: "c.d" where + was expected`},
		{"charge json ending in +", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json a.b +"), 6, "charge json takes dot paths"},
		{"charge json empty key", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json usage..total"), 6, `path "usage..total" has an empty key`},
		{"charge json choices[0].usage.total_tokens", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json choices[0].usage.total_tokens"), 6, `path "choices[0].usage.total_tokens" can never match: only dot paths of object keys`},
		{"charge json usage.*", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json usage.*"), 6, `path "usage.*" can never match: only dot paths of object keys`},
		{"charge json $.usage.total_tokens", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json $.usage.total_tokens"), 6, `path "$.usage.total_tokens" can never match: only dot paths of object keys`},
		{"charge tokens of a kind there is not", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge tokens cached"), 6, `charge tokens: "cached": count input, output or total tokens`},
		{"charge tokens twice over", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge tokens input output"), 6, `charge tokens takes one of input, output or total (total if left out), not "input output"`},
		{"charge json {http.vars.tokens}", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcharge json {http.vars.tokens}"), 6, `path "{http.vars.tokens}" can never match: only dot paths of object keys`},
		{"ban in a concurrency zone", zone("\t\tconcurrency 4\n\t\tban 1h"), 5, "zone z: ban is for rate zones: a concurrency zone's denials end as requests finish"},
		{"ban in a quota zone", zone("\t\tban 1h\n\t\tquota 100 per day"), 4, "zone z: ban is for rate zones: a quota zone's denial already lasts until its period ends"},
		{"ban without a duration", zone("\t\tevents 5\n\t\twindow 1s\n\t\tban"), 6, "ban takes a duration and optionally the longest escalated ban: ban 1h, or ban 10m 24h"},
		{"ban max under its first", zone("\t\tevents 5\n\t\twindow 1s\n\t\tban 1h 10m"), 6, "ban 1h 10m: the longest ban is shorter than the first"},
		{"ban of 200 years", zone("\t\tevents 5\n\t\twindow 1s\n\t\tban 1752000h"), 6, "longer than the 100 years"},
		{"delay in a concurrency zone", zone("\t\tconcurrency 4\n\t\tdelay 1s"), 5, "zone z: delay is for rate zones: a concurrency zone's slot frees when a request ends"},
		{"delay in a quota zone", zone("\t\tdelay 1s\n\t\tquota 100 per day"), 4, "zone z: delay is for rate zones: a quota zone's next unit comes at the period's end"},
		{"delay in a post-charged zone", zone("\t\tevents 5\n\t\twindow 1s\n\t\tcount {\n\t\t\tstatus 401\n\t\t}\n\t\tdelay 1s"), 9, "delay is for zones that consume before the request"},
		{"delay of an hour", zone("\t\tevents 5\n\t\twindow 1s\n\t\tdelay 1h"), 6, "delay 1h0m0s is longer than the 1m0s a request may wait for its turn"},
		{"negative delay", zone("\t\tevents 5\n\t\twindow 1s\n\t\tdelay -3s"), 6, "delay must be a positive duration"},
		{"queue without delay", zone("\t\tevents 5\n\t\twindow 1s\n\t\tqueue 10"), 6, "queue bounds the requests waiting for their turn, which only a zone with delay has"},
		{"queue of zero", zone("\t\tevents 5\n\t\twindow 1s\n\t\tdelay 1s\n\t\tqueue 0"), 7, "queue must be a whole number from 1 to 1000000"},
		// Limits whose arithmetic would overflow, at the line at fault.
		{"burst that takes 1000 years to refill", zone("\t\tevents 1\n\t\twindow 8760h\n\t\tburst 1000"), 6,
			"zone z: burst 1000 at one request per 8760h0m0s takes longer to refill than the 100 years"},
		{"burst of 2^40 per 6 minutes", zone("\t\tevents 10\n\t\twindow 1h\n\t\tburst 1099511627776"), 6, "zone z: burst 1099511627776 at one request per 6m0s"},
		{"window of two centuries", zone("\t\tevents 10\n\t\twindow 1752000h"), 5, "zone z: window 1752000h0m0s is longer than the 100 years"},
		{"finer than a microsecond", zone("\t\tevents 1\n\t\twindow 1ns"), 5, "zone z: 1 events per 1ns is more than one per microsecond"},
		{"a million per 999ms", zone("\t\tevents 1000000\n\t\twindow 999ms"), 5, "zone z: 1000000 events per 999ms is more than one per microsecond"},
		// The same limits on every platform, whatever int is.
		{"events over 2^40", zone("\t\tevents 1099511627777\n\t\twindow 8760h"), 4, "zone z: events must be a whole number from 1 to 1099511627776"},
		{"max_keys over 2^40", zone("\t\tevents 1\n\t\twindow 1s\n\t\tmax_keys 1099511627777"), 6, "zone z: max_keys must be a whole number from 1 to 1099511627776"},
		{"concurrency over 2^30", zone("\t\tconcurrency 1073741825"), 4, "zone z: concurrency must be a whole number from 1 to 1073741824"},
		{"jitter NaN", "rate_limit {\n\tjitter NaN\n}", 2, `jitter must be a fraction between 0 and 1 (e.g. jitter 0.2), not "NaN"`},
		{"jitter Inf", "rate_limit {\n\tjitter +Inf\n}", 2, `jitter must be a fraction between 0 and 1`},
		{"redis port 0", "rate_limit {\n\tdistributed {\n\t\tredis 127.0.0.1:0\n\t}\n}", 3, `distributed: redis: address 127.0.0.1:0: port "0" must be a number from 1 to 65535`},
		{"redis URL port 70000", "rate_limit {\n\tdistributed {\n\t\tredis redis://:secret@127.0.0.1:70000\n\t}\n}", 3, `distributed: redis: address redis://***@127.0.0.1:70000: port "70000"`},
		{"redis port in a block", "rate_limit {\n\tdistributed {\n\t\tredis {\n\t\t\taddresses 127.0.0.1:6379 10.0.0.1:99999\n\t\t}\n\t}\n}", 4, `port "99999"`},
		{"redis scheme", "rate_limit {\n\tdistributed {\n\t\tredis http://127.0.0.1:6379\n\t}\n}", 3, `scheme "http" is not supported: use redis:// or rediss://`},
		{"redis without port", "rate_limit {\n\tdistributed {\n\t\tredis 127.0.0.1\n\t}\n}", 3, `address 127.0.0.1 must be host:port`},
		{"key_prefix too long", "rate_limit {\n\tdistributed {\n\t\tredis 127.0.0.1:6379\n\t\tkey_prefix " + strings.Repeat("p", 129) + "\n\t}\n}", 4, "distributed: key_prefix is longer than 128 bytes"},
		{"sync_interval in strict mode", "rate_limit {\n\tdistributed {\n\t\tredis 127.0.0.1:6379\n\t\tsync_interval 50ms\n\t}\n}", 4, "distributed: sync_interval only applies to mode async"},
		{"sentinel_master outside the redis block", "rate_limit {\n\tdistributed {\n\t\tredis 127.0.0.1:26379\n\t\tsentinel_master mymaster\n\t}\n}", 4,
			"distributed: sentinel_master belongs in the redis block: redis { addresses <host:port>...; sentinel_master ... }"},
		{"password outside the redis block", "rate_limit {\n\tdistributed {\n\t\tpassword secret\n\t}\n}", 3, "distributed: password belongs in the redis block"},
		{"distributed subdirective twice", "rate_limit {\n\tdistributed {\n\t\tredis 127.0.0.1:6379\n\t\ttimeout 1s\n\t\ttimeout 2s\n\t}\n}", 5, "distributed: timeout is given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.input)
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.input)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not say %q", msg, tc.want)
			}
			if want := "Testfile:" + strconv.Itoa(tc.line); !strings.Contains(msg, want) {
				t.Errorf("error %q does not name line %d", msg, tc.line)
			}
			if strings.Contains(msg, "distributed: distributed:") || strings.Count(msg, "zone z:") > 1 || strings.Contains(msg, "secret") {
				t.Errorf("error %q repeats its prefix or shows the password", msg)
			}
		})
	}
}

// Limits are 64-bit values on every platform: a Caddyfile that Caddy on a
// 64-bit machine accepts, a 32-bit one (386, arm) accepts the same, with the
// same values (make test runs the unit tests under GOARCH=386 too).
func TestCaddyfileLimitsAre64BitEverywhere(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone big {
			key {client_ip}
			events 1099511627776
			window 876000h
			burst 1099511627776
			cost 1099511627776
			max_keys 1099511627776
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["big"]
	if z.MaxEvents != 1<<40 || z.Burst != 1<<40 || z.Cost != 1<<40 || z.MaxKeys != 1<<40 {
		t.Errorf("parsed events %d, burst %d, cost %d, max_keys %d; want 2^40 each", z.MaxEvents, z.Burst, z.Cost, z.MaxKeys)
	}
	var back Zone
	raw, _ := json.Marshal(z)
	if err := json.Unmarshal(raw, &back); err != nil || back.MaxEvents != 1<<40 || back.MaxKeys != 1<<40 {
		t.Errorf("JSON round trip %s: %+v, %v", raw, back, err)
	}
}

func TestCaddyfileRedisTLSFiles(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone z {
			key {client_ip}
			events 1
			window 1s
		}
		distributed {
			redis {
				addresses rediss://10.0.0.1:6380
				tls_ca /etc/tally/ca.pem
				tls_client /etc/tally/client.pem {env.TALLY_KEY_FILE}
			}
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if r := h.Distributed.Redis; r.TLSCA != "/etc/tally/ca.pem" || r.TLSCert != "/etc/tally/client.pem" || r.TLSKey != "{env.TALLY_KEY_FILE}" {
		t.Errorf("redis = %+v", r)
	}
	_, err = parse(t, `rate_limit {
		zone z {
			key {client_ip}
			events 1
			window 1s
		}
		distributed {
			redis {
				addresses rediss://10.0.0.1:6380
				tls_client /etc/tally/client.pem
			}
		}
	}`)
	if err == nil || !strings.Contains(err.Error(), "tls_client takes a certificate file and its key file") || !strings.Contains(err.Error(), ":10") {
		t.Errorf("tls_client with one file: %v, want the fix and line 10", err)
	}
}

// The syntax, as written: ban <d> and ban <first> <max>.
func TestCaddyfileBan(t *testing.T) {
	h, err := parse(t, `rate_limit { # (rate_limit /login in a site: the matcher is the site's)
	zone failed_logins {
		key {client_ip}
		events 5
		window 15m
		count {
			status 401
		}
		ban 1h              # a key this zone denies is then denied for 1h
	}
	zone scrapers {
		key {client_ip}
		events 100
		window 1m
		ban 10m 24h         # escalating: 10m, 20m, 40m ... at most 24h
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	if z := h.RateLimits["failed_logins"]; z.Ban != caddy.Duration(time.Hour) || z.BanMax != 0 {
		t.Errorf("failed_logins: ban %v %v", z.Ban, z.BanMax)
	}
	if z := h.RateLimits["scrapers"]; z.Ban != caddy.Duration(10*time.Minute) || z.BanMax != caddy.Duration(24*time.Hour) {
		t.Errorf("scrapers: ban %v %v", z.Ban, z.BanMax)
	}
}

// The syntax, as written: delay <d> and queue <n>.
func TestCaddyfileDelay(t *testing.T) {
	h, err := parse(t, `rate_limit { # (rate_limit /api/* in a site: the matcher is the site's)
	zone smooth {
		key {client_ip}
		events 5
		window 1s
		burst 1
		delay 3s            # a request that could pass within 3s waits for its turn
		queue 100           # at most 100 requests of this zone waiting on this instance
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	if z := h.RateLimits["smooth"]; z.Delay != caddy.Duration(3*time.Second) || z.Queue != 100 {
		t.Errorf("smooth: delay %v queue %d", time.Duration(z.Delay), z.Queue)
	}
}

// A number or a duration holds no space, quoted or not: the error for one
// written with spaces says how to write it, and never to quote it (a quoted
// "1 m" is no duration either).
func TestCaddyfileValuesWithSpacesAreToldHowToWriteThem(t *testing.T) {
	zone := func(body string) string {
		return "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n" + body + "\n\t}\n}"
	}
	for _, tc := range []struct{ name, input, want string }{
		{"window 1 m", zone("\t\tevents 1\n\t\twindow 1 m"), "window takes one value, written without spaces: window 1m"},
		{"quoted window", zone("\t\tevents 1\n\t\twindow \"1 m\""), `window must be a positive duration such as 500ms, 10s, 1m or 1h, not "1 m"`},
		{"events 1 000", zone("\t\tevents 1 000\n\t\twindow 1m"), "events takes one value, written without spaces: events 1000"},
		{"delay 3 s", zone("\t\tevents 1\n\t\twindow 1m\n\t\tdelay 3 s"), "delay takes one value, written without spaces: delay 3s"},
		{"fail_policy open closed", zone("\t\tevents 1\n\t\twindow 1m\n\t\tfail_policy open closed"), `fail_policy must be one of open, closed, local, not "open closed"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.input)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "quote") {
				t.Fatalf("error %v, want %q and no advice to quote", err, tc.want)
			}
		})
	}
	// A key template is text: quoting is how it holds a space.
	if _, err := parse(t, "rate_limit {\n\tzone z {\n\t\tkey {a} {b}\n\t\tevents 1\n\t\twindow 1m\n\t}\n}"); err == nil || !strings.Contains(err.Error(), "to use spaces, quote it") {
		t.Errorf("key {a} {b}: %v, want the advice to quote it", err)
	}
	if h, err := parse(t, "rate_limit {\n\tzone z {\n\t\tkey \"{a} {b}\"\n\t\tevents 1\n\t\twindow 1m\n\t}\n}"); err != nil || h.RateLimits["z"].Key != "{a} {b}" {
		t.Errorf(`key "{a} {b}": %v`, err)
	}
}
