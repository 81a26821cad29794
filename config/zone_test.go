package config

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// warnings provisions zone z as a handler with the given store would and
// returns the WARN lines it logged about it.
func warnings(t *testing.T, zc Zone, distributed bool) []string {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	zc.Warn("z", distributed, zap.New(core))
	var out []string
	for _, e := range logs.All() {
		out = append(out, e.Message)
	}
	return out
}

func TestFailPolicyWithoutDistributedIsWarnedAbout(t *testing.T) {
	rate := Zone{Key: "{client_ip}", MaxEvents: 5, Window: caddy.Duration(time.Minute)}
	for _, tc := range []struct {
		policy      string
		distributed bool
		warned      bool
	}{
		{"closed", false, true},
		{"open", false, true},
		{"local", false, false},
		{"", false, false},
		{"closed", true, false},
		{"open", true, false},
	} {
		zc := rate
		zc.FailPolicy = tc.policy
		got := warnings(t, zc, tc.distributed)
		warned := len(got) == 1 && strings.Contains(got[0], "fail_policy has no effect without distributed")
		if warned != tc.warned || len(got) > 1 {
			t.Errorf("fail_policy %q, distributed %v: warnings %q, want warned %v", tc.policy, tc.distributed, got, tc.warned)
		}
	}
}

func TestKeyWithoutPlaceholderIsWarnedAboutUnlessStatic(t *testing.T) {
	for _, tc := range []struct {
		key, want string // want: "" = no warning
	}{
		{"{client_ip}", ""},
		{"{http.request.header.X-API-Key}", ""},
		{"user-{http.request.header.X-User}", ""},
		{"static", ""},
		{"client_ip", "did you mean key {client_ip}?"},
		{"http.request.header.X-API-Key", "did you mean key {http.request.header.X-API-Key}?"},
		{"every one", "write the placeholder in braces"},
		{`\{client_ip}`, "write the placeholder in braces"},
		{"{}", "write the placeholder in braces"},
	} {
		zc := Zone{Key: tc.key, MaxEvents: 5, Window: caddy.Duration(time.Minute)}
		got := warnings(t, zc, false)
		switch {
		case tc.want == "" && len(got) != 0:
			t.Errorf("key %q: warnings %q, want none", tc.key, got)
		case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], "key has no placeholder: every request shares one bucket") ||
			!strings.Contains(got[0], tc.want) || !strings.Contains(got[0], "write key static")):
			t.Errorf("key %q: warnings %q, want one saying %q and the opt-out", tc.key, got, tc.want)
		}
	}
}

func TestKeyTemplateOfPlaceholdersOnlyCanBeEmpty(t *testing.T) {
	for tpl, want := range map[string]bool{
		"{client_ip}":              true,
		"{a}{b}":                   true,
		"user-{http.auth.user.id}": false,
		"{a}:{b}":                  false,
		"static":                   false,
		"":                         false,
	} {
		if got := CanBeEmpty(tpl); got != want {
			t.Errorf("CanBeEmpty(%q) = %v, want %v", tpl, got, want)
		}
	}
}

func TestTemplatesReadingAuthPlaceholdersAreWarnedAbout(t *testing.T) {
	minute := caddy.Duration(time.Minute)
	for _, tc := range []struct {
		name string
		zone Zone
		want string // the setting named; "" = no warning
	}{
		{"key", Zone{Key: "{http.auth.user.id}", MaxEvents: 5, Window: minute}, "key"},
		{"key with text", Zone{Key: "user:{http.auth.user.id}", MaxEvents: 5, Window: minute}, "key"},
		{"plan", Zone{Key: "{client_ip}", MaxEvents: 5, MaxEventsPlaceholder: "{http.auth.user.plan_rpm}", Window: minute}, "events"},
		{"cost", Zone{Key: "{client_ip}", MaxEvents: 5, Window: minute, CostPlaceholder: "{http.auth.user.cost}"}, "cost"},
		{"quota", Zone{Key: "{client_ip}", Quota: &Quota{LimitPlaceholder: "{http.auth.user.quota}"}}, "quota"},
		{"no auth", Zone{Key: "{http.request.header.X-API-Key}", MaxEvents: 5, MaxEventsPlaceholder: "{plan_rpm}", Window: minute}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			tc.zone.Warn("z", false, zap.New(core))
			got := logs.FilterMessageSnippet("a zone reads a placeholder that authentication sets").All()
			switch {
			case tc.want == "" && len(got) != 0:
				t.Fatalf("warned: %v", got)
			case tc.want != "" && len(got) != 1:
				t.Fatalf("%d warnings, want 1", len(got))
			case tc.want != "":
				msg := got[0].Message
				if got[0].ContextMap()["setting"] != tc.want || !strings.Contains(msg, "route { basic_auth … rate_limit … }") || !strings.Contains(msg, "order rate_limit after basic_auth") {
					t.Errorf("warning %q %v, want setting %s and both fixes", msg, got[0].ContextMap(), tc.want)
				}
			}
		})
	}
}
