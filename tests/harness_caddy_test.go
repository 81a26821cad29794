package tests

// The harness for tests that run a real Caddy: the binary built from
// ./cmd/tally-caddy (Caddy's standard modules plus tally from the working
// tree), started as a subprocess on free loopback ports, with its own HOME so
// that nothing is written outside the test's temporary directory.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var caddyBuild struct {
	once sync.Once
	dir  string // the temporary directory TestMain made for the binary
	path string
	err  error
}

// caddyBinary builds ./cmd/tally-caddy once per test run and returns its path.
//
// `make test` builds it before the tests start and passes it in
// TALLY_CADDY_BIN, so that no test runs beside the build: a race build of
// Caddy takes both cores for minutes, and the timing-sensitive Redis tests
// must not share the machine with it.
func caddyBinary(t testing.TB) string {
	t.Helper()
	caddyBuild.once.Do(func() {
		if bin := os.Getenv("TALLY_CADDY_BIN"); bin != "" {
			caddyBuild.path = bin
			return
		}
		path := filepath.Join(caddyBuild.dir, "caddy")
		// The Caddy under test is built with the race detector (unless
		// TALLY_CADDY_RACE=0), so the concurrent HTTP tests also check the
		// module's shared state for data races; a race makes Caddy exit 66.
		args := []string{"build", "-o", path}
		if os.Getenv("TALLY_CADDY_RACE") != "0" {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/tally-caddy")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			caddyBuild.err = fmt.Errorf("go build ./cmd/tally-caddy: %v\n%s", err, out)
			return
		}
		caddyBuild.path = path
	})
	if caddyBuild.err != nil {
		t.Fatal(caddyBuild.err)
	}
	return caddyBuild.path
}

// caddyInstance is one Caddy process owned by a test. URL is its HTTP site
// (http://127.0.0.1:<HTTPPort>), AdminURL its admin API.
type caddyInstance struct {
	t         testing.TB
	URL       string
	AdminURL  string
	HTTPPort  int
	AdminPort int
	Dir       string // HOME, XDG dirs, config files and logs

	// httpsPort is only named (https_port), never listened on; Caddy
	// refuses a config whose http:// site would listen on it, so it must
	// not be HTTPPort.
	httpsPort int

	client *http.Client
	cmd    *exec.Cmd
	exited chan struct{}
	stderr *lockedBuffer
}

// lockedBuffer collects a process's output while tests read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newCaddyInstance reserves ports and a directory for a Caddy that is not
// started yet.
func newCaddyInstance(t testing.TB) *caddyInstance {
	t.Helper()
	c := &caddyInstance{
		t:        t,
		HTTPPort: freePort(t),
		Dir:      t.TempDir(),
		stderr:   new(lockedBuffer),
	}
	c.AdminPort = freePort(t)
	c.httpsPort = freePort(t)
	c.URL = "http://127.0.0.1:" + strconv.Itoa(c.HTTPPort)
	c.AdminURL = "http://127.0.0.1:" + strconv.Itoa(c.AdminPort)
	c.client = &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			MaxIdleConnsPerHost: 128,
			DisableCompression:  true,
		},
	}
	t.Cleanup(c.client.CloseIdleConnections)
	return c
}

// globalOptions are the options every test Caddyfile starts with: this
// instance's loopback ports, no HTTPS, nothing persisted. extra is added
// inside the block (e.g. "metrics").
func (c *caddyInstance) globalOptions(extra string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	https_port %d
	default_bind 127.0.0.1
	auto_https off
	persist_config off
%s
}
`, c.AdminPort, c.HTTPPort, c.httpsPort, extra)
}

// Caddyfile returns a whole Caddyfile: the global options, then sites. A
// site address of "http://" listens on this instance's HTTP port.
func (c *caddyInstance) Caddyfile(global, sites string) string {
	return c.globalOptions(global) + "\n" + sites
}

// env is the environment of every Caddy process: HOME and the XDG
// directories inside the instance's directory.
func (c *caddyInstance) env() []string {
	env := []string{
		"HOME=" + c.Dir,
		"XDG_DATA_HOME=" + filepath.Join(c.Dir, "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(c.Dir, "config"),
		"PATH=" + os.Getenv("PATH"),
	}
	return env
}

// startCaddy starts a Caddy whose Caddyfile is the harness's global options
// followed by sites (site blocks; use "http://" as the address).
func startCaddy(t testing.TB, sites string) *caddyInstance {
	t.Helper()
	return startCaddyWith(t, "", sites)
}

// startCaddyWith is startCaddy with extra global options.
func startCaddyWith(t testing.TB, global, sites string) *caddyInstance {
	t.Helper()
	c := newCaddyInstance(t)
	c.Start(c.Caddyfile(global, sites), "caddyfile")
	return c
}

// Start runs `caddy run` with config (adapter "caddyfile", or "" for JSON)
// and waits until both its admin API and its HTTP port answer.
func (c *caddyInstance) Start(config, adapter string) {
	c.t.Helper()
	if err := c.startProcess(config, adapter); err != nil {
		c.t.Fatal(err)
	}
}

// startProcess is Start returning an error, for tests that expect Caddy to
// refuse a config.
func (c *caddyInstance) startProcess(config, adapter string) error {
	c.t.Helper()
	name := "caddy.json"
	if adapter == "caddyfile" {
		name = "Caddyfile"
	}
	file := filepath.Join(c.Dir, name)
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		c.t.Fatal(err)
	}
	args := []string{"run", "--config", file}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	cmd := exec.Command(caddyBinary(c.t), args...)
	cmd.Dir = c.Dir
	cmd.Env = c.env()
	cmd.Stdout = c.stderr
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting caddy: %v", err)
	}
	c.cmd = cmd
	c.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	c.t.Cleanup(func() {
		c.Stop()
		if strings.Contains(c.stderr.String(), "WARNING: DATA RACE") {
			c.t.Errorf("the race detector found a data race in caddy on %s", c.URL)
		}
		if c.t.Failed() {
			c.t.Logf("caddy on %s (admin %s) output:\n%s", c.URL, c.AdminURL, tail(c.stderr.String(), 150))
		}
	})

	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-c.exited:
			return fmt.Errorf("caddy exited before it was ready (%v):\n%s", cmd.ProcessState, tail(c.stderr.String(), 40))
		default:
		}
		if c.ready() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("caddy not ready after 20s:\n%s", tail(c.stderr.String(), 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ready reports whether the admin API serves the config and the HTTP port
// accepts connections. It sends no request to the site, which would count.
func (c *caddyInstance) ready() bool {
	resp, err := c.client.Get(c.AdminURL + "/config/")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.HTTPPort)), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// Stop kills the process and waits for it to exit.
func (c *caddyInstance) Stop() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	select {
	case <-c.exited:
	default:
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// Exited reports whether the process has ended, waiting up to d for it.
func (c *caddyInstance) Exited(d time.Duration) bool {
	select {
	case <-c.exited:
		return true
	case <-time.After(d):
		return false
	}
}

// Output is what Caddy has written so far (its log goes to stderr).
func (c *caddyInstance) Output() string { return c.stderr.String() }

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = append([]string{fmt.Sprintf("... (%d lines before)", len(ls)-lines)}, ls[len(ls)-lines:]...)
	}
	return strings.Join(ls, "\n")
}

// load POSTs a new Caddyfile (global options and sites, as for startCaddy) to
// the admin /load endpoint and fails the test unless Caddy accepts it.
func load(t testing.TB, c *caddyInstance, global, sites string) {
	t.Helper()
	status, body := c.loadCaddyfile(c.Caddyfile(global, sites))
	if status != http.StatusOK {
		t.Fatalf("POST /load: status %d: %s", status, body)
	}
}

// loadCaddyfile POSTs a whole Caddyfile to /load and returns the status and
// the response body.
func (c *caddyInstance) loadCaddyfile(caddyfile string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.AdminURL+"/load", strings.NewReader(caddyfile))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	return c.admin(req)
}

// adminDo sends method path (under AdminURL) and returns the status and body.
func (c *caddyInstance) adminDo(method, path string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.AdminURL+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.admin(req)
}

func (c *caddyInstance) admin(req *http.Request) (int, string) {
	c.t.Helper()
	// A connection of its own: a /load that changes the admin endpoint's
	// settings (its origins come in map order) replaces its server, which
	// closes the idle connections, and a POST sent on one as it closes
	// fails with EOF (Go retries only idempotent requests).
	// A connection accepted as the old server stops is closed unread: EOF
	// before any answer, the request never handled (no "received request"
	// in Caddy's log), so it is sent again.
	req.Close = true
	resp, err := c.client.Do(req)
	for try := 1; err != nil && errors.Is(err, io.EOF) && try < 3; try++ {
		if req.GetBody != nil {
			req.Body, _ = req.GetBody()
		}
		resp, err = c.client.Do(req)
	}
	if err != nil {
		c.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode, string(b)
}

// adminJSON GETs path from the admin API and decodes its JSON into v.
func (c *caddyInstance) adminJSON(path string, v any) {
	c.t.Helper()
	status, body := c.adminDo(http.MethodGet, path)
	if status != http.StatusOK {
		c.t.Fatalf("GET %s: status %d: %s", path, status, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		c.t.Fatalf("GET %s: %v in %s", path, err, body)
	}
}

// adapt runs `caddy adapt` on a whole Caddyfile and returns the JSON, what
// Caddy wrote to stderr, and the error if it exited non-zero.
func adapt(t testing.TB, caddyfile string) (string, string, error) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBinary(t), "adapt", "--config", file, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "PATH=" + os.Getenv("PATH")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// request says what to send: a path and headers.
type request struct {
	Path   string
	Header map[string]string
	// Client, when set, sends the request instead of the instance's
	// client (e.g. one dialing from another loopback address).
	Client *http.Client
}

// response is what came back, with the body read.
type response struct {
	Status  int
	Header  http.Header
	Body    string
	Elapsed time.Duration
}

// Do sends one GET and returns its response; a transport error fails the
// test.
func (c *caddyInstance) Do(r request) response {
	c.t.Helper()
	res, err := c.try(r)
	if err != nil {
		c.t.Fatal(err)
	}
	return res
}

func (c *caddyInstance) try(r request) (response, error) {
	path := r.Path
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequest(http.MethodGet, c.URL+path, nil)
	if err != nil {
		return response{}, err
	}
	for k, v := range r.Header {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	client := c.client
	if r.Client != nil {
		client = r.Client
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("GET %s: %v", req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("GET %s: reading body: %v", req.URL, err)
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Elapsed: time.Since(start)}, nil
}

// statusCounts counts responses by status code.
type statusCounts map[int]int

func (s statusCounts) String() string {
	var b strings.Builder
	for code := 100; code < 600; code++ {
		if n := s[code]; n > 0 {
			fmt.Fprintf(&b, "%d×%d ", n, code)
		}
	}
	return strings.TrimSpace(b.String())
}

// serverErrors is how many 5xx responses were counted.
func (s statusCounts) serverErrors() int {
	n := 0
	for code, k := range s {
		if code >= 500 {
			n += k
		}
	}
	return n
}

// Send sends n requests one after the other and returns the statuses in
// order.
func (c *caddyInstance) Send(n int, r request) []int {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	out := make([]int, 0, n)
	for i := 0; i < n; i++ {
		if time.Now().After(deadline) {
			c.t.Fatalf("sent only %d of %d requests in 60s", i, n)
		}
		out = append(out, c.Do(r).Status)
	}
	return out
}

// SendConcurrently sends n requests from workers goroutines and counts the
// statuses. every, when not nil, sees each response (from any goroutine).
func (c *caddyInstance) SendConcurrently(n, workers int, r request, every func(response)) statusCounts {
	c.t.Helper()
	return sendConcurrently(c.t, n, workers, func(int) (response, error) { return c.try(r) }, every)
}

// sendConcurrently runs n calls of send(i) on workers goroutines, within a
// minute, and counts the statuses. A transport error fails the test.
func sendConcurrently(t testing.TB, n, workers int, send func(i int) (response, error), every func(response)) statusCounts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	jobs := make(chan int)
	var (
		mu     sync.Mutex
		counts = statusCounts{}
		errs   []error
		wg     sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				res, err := send(i)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					counts[res.Status]++
				}
				mu.Unlock()
				if err == nil && every != nil {
					every(res)
				}
			}
		}()
	}
	sent := 0
feed:
	for ; sent < n; sent++ {
		select {
		case jobs <- sent:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if sent < n {
		t.Fatalf("sent only %d of %d requests in 60s", sent, n)
	}
	if len(errs) > 0 {
		t.Fatalf("%d of %d requests failed, first: %v", len(errs), n, errs[0])
	}
	return counts
}

// countStatuses counts a sequence of statuses.
func countStatuses(statuses []int) statusCounts {
	s := statusCounts{}
	for _, code := range statuses {
		s[code]++
	}
	return s
}

// clientFrom returns an HTTP client whose connections come from the loopback
// address ip (any 127.0.0.0/8 address is local).
func clientFrom(t testing.TB, ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: dialer.DialContext, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

// lineOf returns the 1-based number of the first line of text containing
// substr, or fails the test.
func lineOf(t testing.TB, text, substr string) int {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		if strings.Contains(sc.Text(), substr) {
			return n
		}
	}
	t.Fatalf("no line contains %q in:\n%s", substr, text)
	return 0
}

// unescapeJSON undoes the quoting of a message inside Caddy's JSON logs and
// admin errors, so that tests can look for the message as written.
func unescapeJSON(s string) string {
	return strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(s)
}

// adminZone is a zone as GET /rate_limit/zones lists it.
type adminZone struct {
	Name          string  `json:"name"`
	Events        int64   `json:"events"`
	Window        string  `json:"window"`
	WindowSeconds float64 `json:"window_seconds"`
	Burst         int64   `json:"burst"`
	Mode          string  `json:"mode"`
	FailPolicy    string  `json:"fail_policy"`
	DryRun        bool    `json:"dry_run"`
	LocalKeys     int     `json:"local_keys"`
	Store         *struct {
		OK          bool   `json:"ok"`
		Failing     bool   `json:"failing"`
		Instances   int    `json:"instances"`
		LastProblem string `json:"last_problem"`
	} `json:"store"`
}

// adminKey is a key as GET /rate_limit/zones/<zone>/keys/<key> shows it.
type adminKey struct {
	Zone       string  `json:"zone"`
	Key        string  `json:"key"`
	Remaining  int64   `json:"remaining"`
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
	Events     int64   `json:"events"`
	Window     string  `json:"window"`
	Burst      int64   `json:"burst"`
	Source     string  `json:"source"`
	StoredAs   string  `json:"stored_as"`
}

func keyPath(zone, key string) string {
	return "/rate_limit/zones/" + url.PathEscape(zone) + "/keys/" + url.PathEscape(key)
}

// zoneHealthOf is zone as GET /rate_limit/zones lists it now.
func zoneHealthOf(t *testing.T, c *caddyInstance, zone string) adminZone {
	t.Helper()
	var list []adminZone
	c.adminJSON("/rate_limit/zones", &list)
	for _, z := range list {
		if z.Name == zone {
			return z
		}
	}
	t.Fatalf("zone %s not listed by %s", zone, c.AdminURL)
	return adminZone{}
}

func withKey(key string) request { return request{Header: map[string]string{"X-API-Key": key}} }

// metricSample is one sample line of the Prometheus text format.
type metricSample struct {
	name   string
	labels map[string]string
	value  float64
}

var (
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// scrape GETs /metrics from the admin API and parses the samples.
func (c *caddyInstance) scrape() []metricSample {
	c.t.Helper()
	status, body := c.adminDo(http.MethodGet, "/metrics")
	if status != http.StatusOK {
		c.t.Fatalf("GET /metrics: %d %s", status, body)
	}
	var out []metricSample
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			c.t.Fatalf("unparsable /metrics line %q", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			c.t.Fatalf("unparsable value in /metrics line %q", line)
		}
		s := metricSample{name: m[1], labels: map[string]string{}, value: v}
		for _, l := range labelPair.FindAllStringSubmatch(m[2], -1) {
			s.labels[l[1]] = l[2]
		}
		out = append(out, s)
	}
	return out
}

// metricValue finds the sample of name whose labels include want.
func metricValue(samples []metricSample, name string, want map[string]string) (float64, bool) {
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for k, v := range want {
			if s.labels[k] != v {
				continue next
			}
		}
		return s.value, true
	}
	return 0, false
}
