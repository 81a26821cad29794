package tests

// The operator artefacts: the alert rules under alerts/ pass promtool, and
// every query of the Grafana dashboard under dashboards/ and of the rules runs
// and returns series on a real Prometheus scraping a real Caddy with tally.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	dashboardFile = "../dashboards/tally.json"
	rulesFile     = "../alerts/tally.rules.yml"
	rulesTestFile = "../alerts/tally.rules.test.yml"
)

// lookPrometheusTool finds prometheus or promtool, or fails saying how to
// install them.
func lookPrometheusTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: run `make deps` (or `make test`), which installs Debian's prometheus package: %v", name, err)
	}
	return path
}

func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool := lookPrometheusTool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// dashboardQueries reads the dashboard, checks its shape, and returns its
// panels' queries by panel title.
func dashboardQueries(t *testing.T) (dashboard, map[string][]string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	queries := map[string][]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" || p.Type == "text" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: want the ${datasource} variable and at least one query", p.Title)
		}
		for _, tg := range p.Targets {
			queries[p.Title] = append(queries[p.Title], tg.Expr)
		}
	}
	if d.UID == "" || len(queries) < 6 {
		t.Errorf("dashboard %q (uid %q) has %d panels with queries", d.Title, d.UID, len(queries))
	}
	return d, queries
}

// promInstance is a Prometheus process owned by a test.
type promInstance struct {
	t   *testing.T
	URL string
}

// startPrometheus starts Prometheus on a loopback port, scraping Caddy's
// admin /metrics every second and evaluating rulesFile every second, with
// its storage in a temporary directory.
func startPrometheus(t *testing.T, c *caddyInstance) *promInstance {
	t.Helper()
	bin := lookPrometheusTool(t, "prometheus")
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: tally
    metrics_path: /metrics
    static_configs:
      - targets: ['127.0.0.1:%d']
`, rules, c.AdminPort)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	out := new(lockedBuffer)
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port),
		"--web.console.templates="+dir, "--web.console.libraries="+dir)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH")}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus output:\n%s", tail(out.String(), 60))
		}
	})
	p := &promInstance{t: t, URL: "http://127.0.0.1:" + strconv.Itoa(port)}
	waitFor(t, 30*time.Second, "prometheus ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", tail(out.String(), 40))
		default:
		}
		resp, err := http.Get(p.URL + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// api GETs an /api/v1 path and decodes its data; an error status fails the
// test with Prometheus's message.
func (p *promInstance) api(path string, params url.Values, data any) error {
	resp, err := http.Get(p.URL + "/api/v1/" + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %v in %s", path, err, b)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s", r.Error)
	}
	return json.Unmarshal(r.Data, data)
}

// query runs an instant PromQL query and returns how many series it gave.
func (p *promInstance) query(q string) (int, error) {
	var data struct {
		Result []json.RawMessage `json:"result"`
	}
	if err := p.api("query", url.Values{"query": {q}}, &data); err != nil {
		return 0, err
	}
	return len(data.Result), nil
}

// promRule is a rule as /api/v1/rules shows it.
type promRule struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	Type      string `json:"type"`
}

func (p *promInstance) rules() []promRule {
	p.t.Helper()
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.api("rules", nil, &data); err != nil {
		p.t.Fatalf("GET /api/v1/rules: %v", err)
	}
	var out []promRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// grafanaVars replaces the dashboard's variables the way Grafana would with
// "All" zones selected.
var grafanaVars = strings.NewReplacer(`"$zone"`, `".*"`, "$__rate_interval", "1m")

func TestDashboardAndAlertQueriesReturnSeriesFromARealPrometheus(t *testing.T) {
	t.Parallel()
	d, panels := dashboardQueries(t)
	if !slices.ContainsFunc(panels["Zones"], func(q string) bool { return strings.Contains(q, "caddy_rate_limit_overrides") }) {
		t.Error("the dashboard's Zones table does not show the overrides in force")
	}
	r := startRedis(t)
	// One zone of each kind, HTTP and connection, so that every series the
	// dashboard reads exists (tally binds only the series a zone can move).
	e := newEdge(t)
	c := e.caddyInstance
	global := "\tmetrics\n" + e.wrappersOnTLS(`			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 100
					window 1m
				}
				zone conn_open {
					key {remote_ip}
					concurrency 1
				}
			}
			tls`)
	c.Start(c.Caddyfile(global, `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 5
			window 1m
		}
		zone login {
			match {
				path /login
			}
			key {client_ip}
			events 3
			window 1m
			fail_policy closed
		}
		zone search {
			match {
				path /search
			}
			key {client_ip}
			events 100
			window 1m
			cost {http.request.header.X-Search-Cost} 1
		}
		zone tokens {
			match {
				path /tokens
			}
			key {client_ip}
			events 1000
			window 1m
			charge {http.response.header.X-Tokens-Used} 1
		}
		zone plans {
			match {
				path /plan
			}
			key {client_ip}
			events {http.request.header.X-Plan-RPM} 60
			window 1m
		}
		zone uploads {
			match {
				path /upload
			}
			key {client_ip}
			concurrency 2
		}
		zone backend {
			match {
				path /backend
			}
			key {http.request.host}
			adaptive {
				latency 1s
			}
			priority {http.request.header.X-Class} signed_in anonymous
		}
		zone smooth {
			match {
				path /smooth
			}
			key {client_ip}
			events 5
			window 1s
			burst 1
			delay 3s
			queue 1
		}
		zone spend {
			match {
				path /spend
			}
			key {client_ip}
			quota 1 usd per day
			charge usd {
				default input 1 output 2
			}
		}
		distributed {
			redis redis://`+r.Addr+`
			timeout 2s
		}
	}
	header X-Tokens-Used 7
	respond "ok"
}

https://`+e.tlsAddr+` {
	tls `+e.cert+` `+e.key+`
	respond "ok"
}
`), "caddyfile")
	// Allowed and denied decisions, costs, charges, plans and a slot, all
	// through Redis.
	c.Send(8, withKey("alice"))
	c.Send(5, request{Path: "/login"})
	c.Send(2, request{Path: "/search", Header: map[string]string{"X-Search-Cost": "3"}})
	c.Send(2, request{Path: "/tokens"})
	c.Send(2, request{Path: "/plan", Header: map[string]string{"X-Plan-RPM": "10"}})
	c.Send(1, request{Path: "/upload"})
	c.Send(1, request{Path: "/spend"})
	c.Send(2, request{Path: "/backend", Header: map[string]string{"X-Class": "signed_in"}})
	// One request at once, one waiting for its turn, one denied for the
	// full queue (queue 1) while it waits.
	c.SendConcurrently(3, 3, request{Path: "/smooth"}, nil)
	// A connection held open (in flight) and a second one from its address
	// refused by conn_open.
	held := e.conn(t, "127.0.0.1", "")
	if held == nil {
		t.Fatal("the first connection from 127.0.0.1 was refused")
	}
	defer held.Close()
	if e.conn(t, "127.0.0.1", "") != nil {
		t.Fatal("a second connection from 127.0.0.1 was served beside the one conn_open holds")
	}
	p := startPrometheus(t, c)

	// Enough scrapes for rates over a minute, and every rule evaluated.
	waitFor(t, 60*time.Second, "three scrapes of tally's metrics and every rule evaluated", func() bool {
		n, err := p.query(`count_over_time(caddy_rate_limit_requests_total{zone="api",decision="denied"}[1m]) >= 3`)
		if err != nil || n == 0 {
			return false
		}
		for _, rule := range p.rules() {
			if rule.Health != "ok" {
				return false
			}
		}
		return true
	})

	rules := p.rules()
	if len(rules) != 5 {
		t.Fatalf("prometheus loaded %d rules from %s, want 5: %+v", len(rules), rulesFile, rules)
	}
	for _, rule := range rules {
		// An alert's expression returns series only while it fires; with
		// its comparisons made boolean it returns every series it compares,
		// which shows that its metrics, labels and joins are tally's.
		q := strings.ReplaceAll(rule.Query, " > ", " > bool ")
		n, err := p.query(q)
		if err != nil || n == 0 {
			t.Errorf("rule %s: %d series, error %v, from\n%s", rule.Name, n, err, q)
		}
	}
	for title, exprs := range panels {
		for _, e := range exprs {
			q := grafanaVars.Replace(e)
			n, err := p.query(q)
			if err != nil || n == 0 {
				t.Errorf("panel %q: %d series, error %v, from\n%s", title, n, err, q)
			}
		}
	}

	// The zone variable lists the zones, HTTP and connection: Grafana runs
	// label_values(<selector>, zone) as this query.
	var selector string
	for _, v := range d.Templating.List {
		if v.Name == "zone" {
			selector = strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ", zone)")
		}
	}
	var zones []string
	if err := p.api("label/zone/values", url.Values{"match[]": {selector}}, &zones); err != nil ||
		strings.Join(zones, ",") != "api,backend,conn_open,conn_rate,login,plans,search,smooth,spend,tokens,uploads" {
		t.Errorf("label_values(%s, zone) = %v (%v), want every zone", selector, zones, err)
	}
}
