package tests

// Prometheus metrics, scraped from Caddy's admin endpoint /metrics.

import (
	"strings"
	"testing"
	"time"
)

func requestsTotal(t *testing.T, samples []metricSample, zone, decision string) float64 {
	t.Helper()
	v, ok := metricValue(samples, "caddy_rate_limit_requests_total", map[string]string{"zone": zone, "decision": decision})
	if !ok {
		t.Fatalf("no caddy_rate_limit_requests_total{zone=%q,decision=%q} in /metrics", zone, decision)
	}
	return v
}

const metricsSite = `http:// {
	rate_limit {
		zone z {
			key {http.request.header.X-API-Key}
			events 5
			window 1h
		}
	}
	respond "ok"
}
`

func TestMetricsCountDecisionsByZone(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", metricsSite)
	const secret = "sk-live-4f9a1c"
	if got := countStatuses(c.Send(7, withKey(secret))); got[200] != 5 || got[429] != 2 {
		t.Fatalf("7 requests at events 5: %v", got)
	}
	samples := c.scrape()
	if got := requestsTotal(t, samples, "z", "allowed"); got != 5 {
		t.Errorf("allowed = %v, want 5", got)
	}
	if got := requestsTotal(t, samples, "z", "denied"); got != 2 {
		t.Errorf("denied = %v, want 2", got)
	}
	if v, ok := metricValue(samples, "caddy_rate_limit_keys", map[string]string{"zone": "z"}); !ok || v != 1 {
		t.Errorf("caddy_rate_limit_keys{zone=\"z\"} = %v (present %v), want 1", v, ok)
	}
	for _, s := range samples {
		if !strings.HasPrefix(s.name, "caddy_rate_limit_") {
			continue
		}
		for k, v := range s.labels {
			if strings.Contains(v, secret) {
				t.Errorf("%s has the rate limit key in its label %s=%q", s.name, k, v)
			}
			if k != "zone" && k != "decision" && k != "policy" && k != "le" {
				t.Errorf("%s has an unexpected label %s=%q: metrics are labelled by zone only", s.name, k, v)
			}
		}
	}
}

func TestMetricsCountDryRunDenials(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", strings.Replace(metricsSite, "window 1h", "window 1h\n\t\t\tdry_run", 1))
	if got := countStatuses(c.Send(7, withKey("alice"))); got[200] != 7 {
		t.Fatalf("7 requests in dry run: %v, want all 200", got)
	}
	samples := c.scrape()
	allowed, dry := requestsTotal(t, samples, "z", "allowed"), requestsTotal(t, samples, "z", "dry_run_denied")
	if allowed != 5 || dry != 2 {
		t.Errorf("allowed %v dry_run_denied %v, want 5, 2", allowed, dry)
	}
	// Only series that can move: a dry-run zone never denies, and a local
	// zone has no store to fail or wait for.
	for _, s := range samples {
		if s.labels["zone"] != "z" {
			continue
		}
		if s.labels["decision"] == "denied" || strings.Contains(s.name, "store_") || strings.Contains(s.name, "fail_policy") {
			t.Errorf("series that cannot move in a local dry-run zone: %s%v", s.name, s.labels)
		}
	}
}

func TestDisableMetricsLeavesTheHandlerUncounted(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", `http:// {
	route /counted {
		rate_limit {
			zone counted {
				key {client_ip}
				events 2
				window 1h
			}
		}
	}
	route /quiet {
		rate_limit {
			zone quiet {
				key {client_ip}
				events 2
				window 1h
			}
			disable_metrics
		}
	}
	respond "ok"
}
`)
	if got := countStatuses(c.Send(3, request{Path: "/counted"})); got[429] != 1 {
		t.Fatalf("/counted: %v", got)
	}
	if got := countStatuses(c.Send(3, request{Path: "/quiet"})); got[429] != 1 {
		t.Fatalf("/quiet: %v, want it limited all the same", got)
	}
	samples := c.scrape()
	if got := requestsTotal(t, samples, "counted", "allowed"); got != 2 {
		t.Errorf("zone counted allowed = %v, want 2", got)
	}
	for _, s := range samples {
		if s.name == "caddy_rate_limit_requests_total" && s.labels["zone"] == "quiet" {
			t.Errorf("disable_metrics handler counted: %s%v %v", s.name, s.labels, s.value)
		}
	}
}

func TestMetricsSurviveAReload(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", metricsSite)
	c.Send(7, withKey("alice"))
	load(t, c, "metrics", strings.Replace(metricsSite, `respond "ok"`, `respond "ok again"`, 1))
	waitFor(t, 5*time.Second, "the reloaded config to serve", func() bool {
		return c.Do(withKey("bob")).Body == "ok again"
	})
	// bob: 1 allowed above; alice is still blocked after the reload.
	if got := countStatuses(c.Send(3, withKey("alice"))); got[429] != 3 {
		t.Fatalf("alice after reload: %v, want 3×429", got)
	}
	samples := c.scrape()
	if got := requestsTotal(t, samples, "z", "allowed"); got != 6 {
		t.Errorf("allowed after reload = %v, want 6 (5 before, 1 after): counts restarted or were lost", got)
	}
	if got := requestsTotal(t, samples, "z", "denied"); got != 5 {
		t.Errorf("denied after reload = %v, want 5 (2 before, 3 after)", got)
	}
	for _, bad := range []string{"duplicate metrics collector", "registering metrics"} {
		if strings.Contains(c.Output(), bad) {
			t.Errorf("Caddy logged %q during the reload", bad)
		}
	}
}
