package ratelimit

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func parse(t *testing.T, input string) (*Handler, error) {
	t.Helper()
	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return &h, err
}

// The handler takes every setting package config read from the directive:
// one left out of UnmarshalCaddyfile's copy would be silently dropped.
func TestCaddyfileSetsEveryHandlerSetting(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone api {
			key {client_ip}
			events 10
			window 1m
		}
		distributed {
			redis 127.0.0.1:6379
		}
		headers ietf
		status 503
		jitter 0.2
		sweep_interval 30s
		persist
		log_key
		disable_metrics
		dry_run
	}`)
	if err != nil {
		t.Fatal(err)
	}
	v := reflect.ValueOf(*h)
	for i := range v.NumField() {
		if f := v.Type().Field(i); f.IsExported() && v.Field(i).IsZero() {
			t.Errorf("%s is not set by the Caddyfile", f.Name)
		}
	}
	if h.Headers != "ietf" || h.StatusCode != 503 || h.Jitter != 0.2 || h.SweepInterval != caddy.Duration(30*time.Second) ||
		len(h.RateLimits) != 1 || h.Distributed.Redis.Addresses[0] != "127.0.0.1:6379" {
		t.Errorf("handler %+v: settings not as written", h)
	}
}

// mholt/caddy-ratelimit users switch by rebuilding: its syntax must parse.
func TestCaddyfileAcceptsMholtSyntax(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone static_example {
			key    static
			events 100
			window 1m
		}
		zone dynamic_example {
			match {
				method GET
			}
			key    {remote_host}
			events 2
			window 5s
		}
		jitter 0.5
		sweep_interval 1m
		log_key
	}`)
	if err != nil {
		t.Fatal(err)
	}
	// Caddy's JSON for it uses mholt's field names.
	b, _ := json.Marshal(h)
	for _, want := range []string{`"rate_limits"`, `"max_events":2`, `"window":5000000000`, `"key":"{remote_host}"`, `"jitter":0.5`, `"log_key":true`, `"match":[`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s lacks %s", b, want)
		}
	}
}
