package listener

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func parseWrapper(input string) (*Wrapper, error) {
	var w Wrapper
	err := w.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return &w, err
}

// The syntax, as written.
func TestListenerCaddyfileSyntax(t *testing.T) {
	w, err := parseWrapper(`rate_limit {
		zone conn_rate {
			key {remote_ip}      # the connection's client address
			ipv6_prefix 64
			events 20
			window 1s
			burst 40
		}
		zone conn_open {
			key {remote_ip}
			concurrency 50       # connections open at once per client
		}
		deny_while login_ip      # refuse connections while that HTTP zone denies or bans the key
	}`)
	if err != nil {
		t.Fatal(err)
	}
	rate, open := w.RateLimits["conn_rate"], w.RateLimits["conn_open"]
	if rate == nil || open == nil || len(w.RateLimits) != 2 {
		t.Fatalf("zones %v", w.RateLimits)
	}
	if rate.Key != "{remote_ip}" || rate.MaxEvents != 20 || rate.Window != caddy.Duration(time.Second) || rate.Burst != 40 || rate.IPv6Prefix != 64 {
		t.Errorf("conn_rate %+v", *rate)
	}
	if open.Key != "{remote_ip}" || open.Concurrency != 50 || open.MaxEvents != 0 {
		t.Errorf("conn_open %+v", *open)
	}
	if len(w.DenyWhile) != 1 || w.DenyWhile[0] != "login_ip" {
		t.Errorf("deny_while %v", w.DenyWhile)
	}

	w, err = parseWrapper("rate_limit {\n\tdeny_while login_ip api_ip\n\tdeny_while ban_ip\n\tlog_key\n\tdry_run\n}")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(w.DenyWhile, ",") != "login_ip,api_ip,ban_ip" || !w.LogKey || !w.DryRun || len(w.RateLimits) != 0 {
		t.Errorf("deny_while alone: %+v", *w)
	}
}

func TestListenerCaddyfileRefusesWhatAConnectionHasNotAndNamesTheLine(t *testing.T) {
	zone := func(body string) string {
		return "rate_limit {\n\tzone c {\n\t\tkey {remote_ip}\n" + body + "\n\t}\n}"
	}
	rate := "\t\tevents 5\n\t\twindow 1s\n"
	tests := []struct {
		name, input string
		line        int
		want        string
	}{
		{"request placeholder in the key", "rate_limit {\n\tzone c {\n\t\tevents 5\n\t\twindow 1s\n\t\tkey {client_ip}\n\t}\n}", 5,
			`zone c: key "{client_ip}": a connection zone's key knows only {remote_ip}`},
		{"header in the key", "rate_limit {\n\tzone c {\n\t\tkey {remote_ip}-{http.request.header.X}\n\t\tevents 5\n\t\twindow 1s\n\t}\n}", 3, "knows only {remote_ip}"},
		{"no key", "rate_limit {\n\tzone c {\n\t\tevents 5\n\t\twindow 1s\n\t}\n}", 5, "zone c: key is missing: add e.g. key {remote_ip}"},
		{"match", zone(rate + "\t\tmatch {\n\t\t\tpath /x\n\t\t}"), 6, "zone c: match reads the request, which a connection has not sent yet"},
		{"events placeholder", zone("\t\tevents {plan} 5\n\t\twindow 1s"), 4, "zone c: events {plan} reads the request"},
		{"window placeholder", zone("\t\tevents 5\n\t\twindow {w} 1s"), 5, "zone c: window {w} reads the request"},
		{"burst placeholder", zone(rate + "\t\tburst {b}"), 6, "zone c: burst {b} reads the request"},
		{"count", zone(rate + "\t\tcount {\n\t\t\tstatus 401\n\t\t}"), 6, "zone c: count weighs responses"},
		{"charge", zone(rate + "\t\tcharge {http.response.header.X}"), 6, "zone c: charge weighs responses"},
		{"cost", zone(rate + "\t\tcost 2"), 6, "zone c: a connection costs 1: remove cost"},
		{"cost placeholder", zone(rate + "\t\tcost {c}"), 6, "zone c: a connection costs 1"},
		{"fail_policy", zone(rate + "\t\tfail_policy open"), 6, "zone c: connection zones are local to this instance, with no Redis to fail: remove fail_policy"},
		{"lease", zone("\t\tconcurrency 5\n\t\tlease 10s"), 5, "zone c: connection zones are local to this instance, with no Redis to hold slots: remove lease"},
		{"distributed", "rate_limit {\n\tdistributed {\n\t\tredis 127.0.0.1:6379\n\t}\n}", 2, "connection zones are local to this instance: remove distributed"},
		{"headers", "rate_limit {\n\theaders off\n}", 2, "headers shapes HTTP responses"},
		{"unknown", "rate_limit {\n\tzones x\n}", 2, `unknown subdirective "zones": expected zone, deny_while, log_key or dry_run`},
		{"nothing to do", "rate_limit {\n\tlog_key\n}", 3, "needs a zone or a deny_while"},
		{"deny_while without a zone", "rate_limit {\n\tdeny_while\n}", 2, "deny_while needs the name of an HTTP zone"},
		{"deny_while bad name", "rate_limit {\n\tdeny_while a.b\n}", 2, `deny_while: zone name "a.b" is invalid`},
		{"the handler's errors too", zone("\t\tevents 5"), 5, "zone c: window is missing"},
		{"zone twice", "rate_limit {\n\tzone c {\n\t\tkey {remote_ip}\n\t\tconcurrency 1\n\t}\n\tzone c {\n\t\tkey {remote_ip}\n\t\tconcurrency 2\n\t}\n}", 6,
			"zone c is defined twice in this listener wrapper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseWrapper(tc.input)
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
			if strings.Count(msg, "zone c:") > 1 {
				t.Errorf("error %q repeats its prefix", msg)
			}
		})
	}
}

// A JSON config has no lines: its key is checked at provision, and a
// setting a connection zone has not is an unknown field.
func TestListenerJSONZoneRefusesRequestSettings(t *testing.T) {
	for _, zc := range []*Zone{
		{MaxEvents: 1, Window: caddy.Duration(time.Second)},
		{Key: "{client_ip}", MaxEvents: 1, Window: caddy.Duration(time.Second)},
		{Key: "{remote_ip}-{http.request.header.X}", Concurrency: 1},
	} {
		if err := zc.keyProblem(); err == nil {
			t.Errorf("%+v accepted", *zc)
		}
	}
	for _, zc := range []*Zone{
		{Key: "{remote_ip}", MaxEvents: 1, Window: caddy.Duration(time.Second), IPv4Prefix: 24, DryRun: true},
		{Key: "all", Concurrency: 100},
		{Key: "edge-{remote_ip}", Concurrency: 1},
	} {
		if err := zc.keyProblem(); err != nil {
			t.Errorf("%+v refused: %v", *zc, err)
		}
	}
	for _, field := range []string{`"cost_placeholder":"{x}"`, `"max_events_at_most":10`, `"fail_policy":"closed"`, `"match":[{"path":["/x"]}]`} {
		var w Wrapper
		raw := `{"rate_limits":{"c":{"key":"{remote_ip}","max_events":1,"window":1000000000,` + field + `}}}`
		if err := caddy.StrictUnmarshalJSON([]byte(raw), &w); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s: error %v, want an unknown field", field, err)
		}
	}
}

func TestListenerPlacement(t *testing.T) {
	tests := []struct {
		wrappers []string
		want     string // "" when accepted
	}{
		{[]string{"rate_limit", "tls"}, ""},
		{[]string{"proxy_protocol", "rate_limit", "tls"}, ""},
		{[]string{"http_redirect", "proxy_protocol", "rate_limit", "tls", "other"}, ""},
		{[]string{"proxy_protocol", "tls"}, ""}, // not this wrapper's list
		{[]string{"rate_limit"}, "needs tls listed after it"},
		{[]string{"proxy_protocol", "rate_limit"}, "needs tls listed after it"},
		{[]string{"proxy_protocol", "tls", "rate_limit"}, "must come before tls"},
		{[]string{"rate_limit", "proxy_protocol", "tls"}, "proxy_protocol must come before rate_limit"},
		{[]string{"rate_limit", "proxy_protocol"}, "proxy_protocol must come before rate_limit"},
		{[]string{"rate_limit", "rate_limit", "tls"}, "listed twice"},
	}
	for _, tc := range tests {
		err := placementProblem(tc.wrappers)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v refused: %v", tc.wrappers, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: error %v, want one saying %q", tc.wrappers, err, tc.want)
		}
	}
}

// A connection has sent no request to count: the listener wrapper refuses
// a quota, at its line.
func TestListenerRefusesAQuotaAtItsLine(t *testing.T) {
	_, err := parseWrapper("rate_limit {\n\tzone conns {\n\t\tkey {remote_ip}\n\t\tquota 100 per day\n\t}\n}")
	if err == nil || !strings.Contains(err.Error(), "a calendar quota counts requests") || !strings.Contains(err.Error(), "Testfile:4") {
		t.Fatalf("error %v, want the quota refused at line 4", err)
	}
}
