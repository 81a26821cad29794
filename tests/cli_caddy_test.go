package tests

// `caddy rate-limit`, the CLI the module registers, run as a separate process
// against a running Caddy's admin API.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// cliRun is what one `caddy rate-limit` run printed and its exit code.
type cliRun struct {
	stdout, stderr string
	code           int
}

// rateLimitCLI runs `caddy rate-limit args...` pointed at c's admin API.
func rateLimitCLI(t *testing.T, c *caddyInstance, args ...string) cliRun {
	t.Helper()
	return runCLI(t, c, append(args, "--address", "127.0.0.1:"+strconv.Itoa(c.AdminPort))...)
}

// runCLI runs `caddy rate-limit args...` as is.
func runCLI(t *testing.T, c *caddyInstance, args ...string) cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBinary(t), append([]string{"rate-limit"}, args...)...)
	cmd.Dir = c.Dir
	cmd.Env = c.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	run := cliRun{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		run.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("caddy rate-limit %s: %v", strings.Join(args, " "), err)
	}
	return run
}

// ok fails the test unless the run succeeded, and returns its output lines.
func (r cliRun) ok(t *testing.T, what string) []string {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("%s: exit %d, stderr %q, stdout %q", what, r.code, r.stderr, r.stdout)
	}
	return strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
}

// row returns the fields of the first line starting with first.
func row(lines []string, first string) []string {
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && f[0] == first {
			return f
		}
	}
	return nil
}

func TestCLIListsZones(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	c.Send(1, withKey("alice"))
	lines := rateLimitCLI(t, c, "zones").ok(t, "zones")
	if got := strings.Join(row(lines, "ZONE"), " "); got != "ZONE LIMIT BURST MODE FAIL POLICY KEYS REDIS" {
		t.Errorf("header %q", got)
	}
	if got := strings.Join(row(lines, "api"), " "); got != "api 3/1h 3 local local 1 -" {
		t.Errorf("zone api shown as %q, want 3/1h, burst 3, local, 1 key, no Redis\n%s", got, strings.Join(lines, "\n"))
	}
	if got := strings.Join(row(lines, "login"), " "); got != "login 5/1m (dry run) 2 local closed 0 -" {
		t.Errorf("zone login shown as %q\n%s", got, strings.Join(lines, "\n"))
	}

	// --json is the admin API's answer.
	var zones []adminZone
	if err := json.Unmarshal([]byte(rateLimitCLI(t, c, "zones", "--json").stdout), &zones); err != nil || len(zones) != 2 ||
		zones[0].Name != "api" || zones[0].Events != 3 || zones[0].LocalKeys != 1 || zones[1].FailPolicy != "closed" {
		t.Errorf("zones --json: %+v (%v)", zones, err)
	}

	// Without --address, the address comes from the config file (loading
	// it logs to stderr, as every Caddy command that reads a config does).
	r := runCLI(t, c, "zones", "--config", filepath.Join(c.Dir, "Caddyfile"), "--adapter", "caddyfile")
	if r.code != 0 || row(strings.Split(r.stdout, "\n"), "api") == nil {
		t.Errorf("zones --config: exit %d, no zone api in\n%s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

func TestCLIShowsAndResetsAKey(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	if got := c.Send(4, withKey("team a/1")); got[2] != 200 || got[3] != 429 {
		t.Fatalf("team a/1: %v, want 3 allowed then denied", got)
	}
	c.Send(1, withKey("bob"))

	out := rateLimitCLI(t, c, "key", "api", "team a/1").ok(t, "key api 'team a/1'")[0]
	const limited = `zone api, key "team a/1": LIMITED, 0 remaining, may send again in `
	retry, reset, found := strings.Cut(strings.TrimPrefix(out, limited), ", full again in ")
	if !strings.HasPrefix(out, limited) || !found {
		t.Fatalf("key of a blocked key: %q, want %q...", out, limited)
	}
	// One request per 20 minutes, 3 used: the next in 20m, full in 1h.
	if d, err := time.ParseDuration(retry); err != nil || d < 19*time.Minute+50*time.Second || d > 20*time.Minute {
		t.Errorf("retry time %q in %q, want about 20m", retry, out)
	}
	if d, err := time.ParseDuration(reset); err != nil || d < 59*time.Minute+50*time.Second || d > time.Hour {
		t.Errorf("reset time %q in %q, want about 1h", reset, out)
	}

	out = rateLimitCLI(t, c, "key", "api", "bob").ok(t, "key api bob")[0]
	if !strings.HasPrefix(out, `zone api, key "bob": not limited, 2 remaining, full again in `) {
		t.Errorf("key of a used key: %q", out)
	}
	out = rateLimitCLI(t, c, "key", "api", "carol").ok(t, "key api carol")[0]
	if out != `zone api, key "carol": not tracked (no state: its next request has the full limit, 3)` {
		t.Errorf("key of an unused key: %q", out)
	}
	var k adminKey
	if err := json.Unmarshal([]byte(rateLimitCLI(t, c, "key", "api", "bob", "--json").stdout), &k); err != nil ||
		k.Zone != "api" || k.Key != "bob" || k.Remaining != 2 {
		t.Errorf("key --json: %+v (%v)", k, err)
	}

	out = rateLimitCLI(t, c, "reset", "api", "team a/1").ok(t, "reset")[0]
	if out != `zone api, key "team a/1": reset to its full limit` {
		t.Errorf("reset: %q", out)
	}
	if got := c.Send(1, withKey("team a/1")); got[0] != 200 {
		t.Errorf("team a/1 after reset: %v, want 200", got)
	}
	// Resetting a key that is not tracked resets nothing: an error, so
	// that a key given wrong (not as the zone keys it) is not taken for
	// reset.
	if r := rateLimitCLI(t, c, "reset", "api", "carol"); r.code != 1 || !strings.Contains(r.stderr, "key not tracked, nothing to reset") || r.stdout != "" {
		t.Errorf("reset of an unused key: exit %d, stderr %q, stdout %q; want exit 1 and not tracked", r.code, r.stderr, r.stdout)
	}
}

func TestCLITopShowsTheHeavyKeys(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, topSite)
	lines := rateLimitCLI(t, c, "top", "api").ok(t, "top of a quiet zone")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "zone api: 0 denials on this instance since ") || lines[1] != "no key was denied" {
		t.Errorf("top of a quiet zone:\n%s", strings.Join(lines, "\n"))
	}

	denied := floodSkewed(t, c, 1000)
	lines = rateLimitCLI(t, c, "top", "api", "-n", "5").ok(t, "top -n 5")
	if len(lines) != 7 || row(lines, "KEY") == nil {
		t.Fatalf("top -n 5: want a summary, a header and 5 keys:\n%s", strings.Join(lines, "\n"))
	}
	if want := "zone api: " + strconv.Itoa(sum(denied)) + " denials on this instance since "; !strings.HasPrefix(lines[0], want) {
		t.Errorf("summary %q, want %q...", lines[0], want)
	}
	if f := strings.Fields(lines[2]); len(f) < 5 || f[0] != `"heavy-0"` || f[1] != strconv.FormatUint(denied["heavy-0"], 10) ||
		f[2] != "LIMITED" || f[3] != "for" {
		t.Errorf("first key %q, want heavy-0 with its %d denials, LIMITED", lines[2], denied["heavy-0"])
	}
	for i := 1; i < 5; i++ {
		if row(lines, `"heavy-`+strconv.Itoa(i)+`"`) == nil {
			t.Errorf("heavy-%d missing:\n%s", i, strings.Join(lines, "\n"))
		}
	}

	var top adminTop
	if err := json.Unmarshal([]byte(rateLimitCLI(t, c, "top", "api", "-n", "2", "--json").stdout), &top); err != nil ||
		len(top.Keys) != 2 || top.Keys[0].Key != "heavy-0" {
		t.Errorf("top --json: %+v (%v)", top, err)
	}
}

func sum(m map[string]uint64) int {
	n := 0
	for _, v := range m {
		n += int(v)
	}
	return n
}

func TestCLIErrors(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	for _, args := range [][]string{
		{"key", "nope", "alice"},
		{"top", "nope"},
		{"reset", "nope", "alice"},
		{"bans", "nope"},
		{"override", "list", "nope"},
		{"override", "set", "nope", "o", "--key", "alice", "--deny"},
		{"override", "rm", "nope", "o"},
	} {
		r := rateLimitCLI(t, c, args...)
		if want := `unknown zone "nope": the running config has zones api, login`; r.code != 1 || !strings.Contains(r.stderr, want) || r.stdout != "" {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want exit 1 and %q", args, r.code, r.stderr, r.stdout, want)
		}
	}
	if r := rateLimitCLI(t, c, "top", "api", "-n", "0"); r.code != 1 || !strings.Contains(r.stderr, "-n 0: want a positive number") {
		t.Errorf("top -n 0: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := rateLimitCLI(t, c, "key", "api"); r.code != 1 || !strings.Contains(r.stderr, "accepts 2 arg(s)") {
		t.Errorf("key with one argument: exit %d, stderr %q", r.code, r.stderr)
	}

	// Nothing listens on this port: a clear error, quickly, for every
	// subcommand.
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	for _, args := range [][]string{{"zones"}, {"key", "api", "alice"}, {"top", "api"}, {"reset", "api", "alice"}} {
		r := runCLI(t, c, append(args, "--address", addr)...)
		if want := "cannot reach Caddy's admin API at " + addr; r.code != 1 || !strings.Contains(r.stderr, want) || r.stdout != "" {
			t.Errorf("%v against %s: exit %d, stderr %q; want exit 1 and %q", args, addr, r.code, r.stderr, want)
		}
	}
}

// With --address once per instance, top adds up the instances' lists and
// reset resets the key on each: what a fleet in local mode (or a flood spread
// by a load balancer) needs.
func TestCLITopAndResetAcrossInstances(t *testing.T) {
	t.Parallel()
	a, b := startCaddy(t, topSite), startCaddy(t, topSite)
	deniedA := floodSkewed(t, a, 1000)
	b.SendConcurrently(300, 4, withKey("heavy-1"), nil)
	b.SendConcurrently(100, 4, withKey("heavy-0"), nil)
	addrs := []string{"--address", "127.0.0.1:" + strconv.Itoa(a.AdminPort), "--address", "127.0.0.1:" + strconv.Itoa(b.AdminPort)}

	lines := runCLI(t, a, append([]string{"top", "api", "-n", "3"}, addrs...)...).ok(t, "top across two instances")
	if want := "zone api: " + strconv.Itoa(sum(deniedA)+299+99) + " denials on 2 instances since "; len(lines) != 5 || !strings.HasPrefix(lines[0], want) {
		t.Fatalf("top across two instances, want %q, a header and 3 keys:\n%s", want, strings.Join(lines, "\n"))
	}
	wantRows := []string{
		`"heavy-0" ` + strconv.FormatUint(deniedA["heavy-0"]+99, 10) + " LIMITED for",
		`"heavy-1" ` + strconv.FormatUint(deniedA["heavy-1"]+299, 10) + " LIMITED for",
		`"heavy-2" ` + strconv.FormatUint(deniedA["heavy-2"], 10) + " LIMITED for",
	}
	for i, want := range wantRows {
		if got := strings.Join(strings.Fields(lines[2+i]), " "); !strings.HasPrefix(got, want) {
			t.Errorf("row %d: %q, want %q...", i+1, got, want)
		}
	}
	var top adminTop
	if err := json.Unmarshal([]byte(runCLI(t, a, append([]string{"top", "api", "--json"}, addrs...)...).stdout), &top); err != nil ||
		top.View != "merged" || len(top.Keys) < 5 || top.Keys[0].Key != "heavy-0" || top.Keys[0].Denials != deniedA["heavy-0"]+99 {
		t.Errorf("top --json across two instances: %+v (%v)", top, err)
	}

	out := runCLI(t, a, append([]string{"reset", "api", "heavy-1"}, addrs...)...).ok(t, "reset across two instances")[0]
	if out != `zone api, key "heavy-1": reset to its full limit on 2 instances` {
		t.Errorf("reset across two instances: %q", out)
	}
	for _, c := range []*caddyInstance{a, b} {
		if got := c.Send(1, withKey("heavy-1")); got[0] != 200 {
			t.Errorf("heavy-1 on %s after the reset: %v, want 200", c.URL, got)
		}
	}
	if r := runCLI(t, a, append([]string{"zones"}, addrs...)...); r.code != 1 || !strings.Contains(r.stderr, "give --address once") {
		t.Errorf("zones with two addresses: exit %d, stderr %q", r.code, r.stderr)
	}
	// A change reaches one instance: several addresses are refused, not
	// quietly narrowed to the first.
	for _, args := range [][]string{{"override", "set", "api", "vip", "--key", "vip", "--exempt"}, {"override", "rm", "api", "vip"}} {
		if r := runCLI(t, a, append(args, addrs...)...); r.code != 1 || !strings.Contains(r.stderr, "give --address once") {
			t.Errorf("%s with two addresses: exit %d, stderr %q", strings.Join(args[:2], " "), r.code, r.stderr)
		}
	}
	if status, body := a.adminDo(http.MethodGet, "/rate_limit/zones/api/overrides/vip"); status != http.StatusNotFound {
		t.Errorf("override set with two addresses set it anyway: %d %s", status, body)
	}
}

// hostileKeys are keys any client can choose (here in a query string,
// ?k=%1B%5D0%3BPWNED%07): printed raw to a terminal they set the window
// title, clear the screen and recolour it, reverse or isolate the rest of
// the line, move the cursor back over it, or forge a row of their own.
var hostileKeys = []string{
	"\x1b]0;PWNED\x07",
	"evil\nfake\t999999\tok",
	"\u202egnp.exe",
	"\x1b[2J\x1b[31mred",
	"\u2066isolate\u2069\u200f",
	"\r\x08\x08over",
}

// queryKeySite keys zone q by the query's k, or else the X-K header: a
// client puts any bytes in either (percent-escapes, obs-text).
const queryKeySite = `http:// {
	rate_limit {
		zone q {
			key {http.request.uri.query.k}{http.request.header.X-K}
			events 1
			window 1h
		}
	}
	respond "ok"
}
`

// terminalSafe fails the test when out holds anything a terminal acts on:
// a control character other than the newline, a bidi or other format
// character, bytes that are not UTF-8.
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s: the output is not UTF-8: %q", what, out)
		return
	}
	for _, r := range out {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Bidi_Control, r)) {
			t.Errorf("%s: %U reaches the terminal raw: %q", what, r, out)
			return
		}
	}
}

// denyTwice sends two requests of key (in the query) and wants the second
// denied, so that the key is in the zone's top list.
func denyTwice(t *testing.T, c *caddyInstance, r request) {
	t.Helper()
	if got := c.Send(2, r); got[0] != 200 || got[1] != 429 {
		t.Fatalf("%+v: %v, want 200 then 429", r, got)
	}
}

func TestCLIPrintsHostileKeysQuotedOneRowEach(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, queryKeySite)
	keys := append(slices.Clone(hostileKeys), "\xff\xfe")
	for _, k := range keys {
		denyTwice(t, c, request{Path: "/?k=" + url.QueryEscape(k)})
	}

	r := rateLimitCLI(t, c, "top", "q")
	terminalSafe(t, "top q", r.stdout)
	lines := r.ok(t, "top q")
	if len(lines) != 2+len(keys) {
		t.Fatalf("top q: %d lines, want a summary, a header and one row per key (%d):\n%s", len(lines), len(keys), r.stdout)
	}
	for _, k := range keys {
		want := strconv.Quote(k)
		if !utf8.ValidString(k) {
			want += " (--base64 " + base64.StdEncoding.EncodeToString([]byte(k)) + ")"
		}
		var rows []string
		for _, l := range lines[2:] {
			if rest, ok := strings.CutPrefix(l, want+" "); ok {
				rows = append(rows, strings.Join(strings.Fields(rest), " "))
			}
		}
		if len(rows) != 1 || !strings.HasPrefix(rows[0], "1 LIMITED for ") {
			t.Errorf("key %q: rows %q, want one row %s with 1 denial, LIMITED:\n%s", k, rows, want, r.stdout)
		}

		r := rateLimitCLI(t, c, "key", "q", k)
		terminalSafe(t, "key q "+strconv.Quote(k), r.stdout)
		if out := r.ok(t, "key"); len(out) != 1 || !strings.HasPrefix(out[0], "zone q, key "+want+": LIMITED, 0 remaining") {
			t.Errorf("key q %q: %q, want one line: zone q, key %s: LIMITED, ...", k, out, want)
		}
	}

	// The JSON for scripts is terminal-safe too (JSON escapes controls, the
	// CLI the bidi and format characters), and reads back as the keys.
	r = rateLimitCLI(t, c, "top", "q", "--json")
	terminalSafe(t, "top q --json", r.stdout)
	var top adminTop
	if err := json.Unmarshal([]byte(r.stdout), &top); err != nil || len(top.Keys) != len(keys) {
		t.Fatalf("top q --json: %v, %d keys:\n%s", err, len(top.Keys), r.stdout)
	}
	got := map[string]bool{}
	for _, k := range top.Keys {
		got[k.raw(t)] = true
	}
	for _, k := range keys {
		if !got[k] {
			t.Errorf("top q --json lost key %q: %+v", k, top.Keys)
		}
	}

	for _, k := range hostileKeys[:2] {
		r := rateLimitCLI(t, c, "reset", "q", k)
		terminalSafe(t, "reset q "+strconv.Quote(k), r.stdout)
		if out := r.ok(t, "reset"); len(out) != 1 || out[0] != "zone q, key "+strconv.Quote(k)+": reset to its full limit" {
			t.Errorf("reset q %q: %q", k, out)
		}
	}
}

// A key that is not UTF-8, which JSON cannot carry as it is, is shown by top
// with its bytes in base64, and key, reset and the admin API take it back:
// the key top shows is the key that is limited and that a reset frees.
func TestKeyThatIsNotUTF8IsReadAndResetAsTopShowsIt(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, queryKeySite)
	fromQuery, fromHeader := "\xfb\xef\xbe", "\xc3\x28" // base64 ++++ (which a query turns into spaces) and wyg=
	denyTwice(t, c, request{Path: "/?k=%FB%EF%BE"})
	denyTwice(t, c, request{Header: map[string]string{"X-K": fromHeader}})

	var top adminTop
	if out := rateLimitCLI(t, c, "top", "q", "--json"); json.Unmarshal([]byte(out.stdout), &top) != nil || len(top.Keys) != 2 {
		t.Fatalf("top --json: %+v, want the two keys:\n%s", top, out.stdout)
	}
	shown := map[string]string{} // raw key -> key_base64
	for _, k := range top.Keys {
		if k.KeyBase64 == "" || !utf8.ValidString(k.Key) {
			t.Errorf("top --json: %+v, want the text and key_base64 of a key that is not UTF-8", k)
		}
		shown[k.raw(t)] = k.KeyBase64
	}
	lines := rateLimitCLI(t, c, "top", "q").ok(t, "top")
	for _, key := range []string{fromQuery, fromHeader} {
		b64, ok := shown[key]
		if !ok {
			t.Fatalf("top --json does not show %q: %+v", key, top.Keys)
		}
		want := strconv.Quote(key) + " (--base64 " + b64 + ")"
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, want+" ") }) {
			t.Errorf("top does not show %s:\n%s", want, strings.Join(lines, "\n"))
		}

		out := rateLimitCLI(t, c, "key", "q", "--base64", b64).ok(t, "key --base64")[0]
		if !strings.HasPrefix(out, "zone q, key "+want+": LIMITED, 0 remaining, may send again in ") {
			t.Errorf("key q --base64 %s: %q, want LIMITED", b64, out)
		}
		// The admin API takes it as ?key_base64=, escaped or not.
		for _, q := range []string{url.QueryEscape(b64), b64} {
			var k struct {
				adminKey
				KeyBase64 string `json:"key_base64"`
			}
			c.adminJSON("/rate_limit/zones/q/keys?key_base64="+q, &k)
			if k.KeyBase64 != b64 || k.RetryAfter < 3000 {
				t.Errorf("GET ...?key_base64=%s: %+v, want key_base64 %s and about an hour to wait", q, k, b64)
			}
		}

		if out := rateLimitCLI(t, c, "reset", "q", "--base64", b64).ok(t, "reset --base64")[0]; out != "zone q, key "+want+": reset to its full limit" {
			t.Errorf("reset q --base64 %s: %q", b64, out)
		}
		if status, body := c.adminDo(http.MethodGet, "/rate_limit/zones/q/keys?key_base64="+url.QueryEscape(b64)); status != http.StatusNotFound {
			t.Errorf("GET %q after its reset: %d %s, want 404: no state", key, status, body)
		}
	}
	if got := c.Send(1, request{Path: "/?k=%FB%EF%BE"}); got[0] != 200 {
		t.Errorf("the query key after its reset: %v, want 200", got)
	}
	if got := c.Send(1, request{Header: map[string]string{"X-K": fromHeader}}); got[0] != 200 {
		t.Errorf("the header key after its reset: %v, want 200", got)
	}
	if r := rateLimitCLI(t, c, "key", "q", "--base64", "not base64!"); r.code != 1 || !strings.Contains(r.stderr, "--base64 not base64!: not standard base64") {
		t.Errorf("key --base64 with a bad value: exit %d, stderr %q", r.code, r.stderr)
	}
}

// reset across instances prints each instance's outcome and fails when one
// failed, though it reset the others; top and reset count an instance given
// twice once.
func TestCLIResetReportsEachInstanceAndTopCountsEachOnce(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	up := "127.0.0.1:" + strconv.Itoa(c.AdminPort)
	down := "127.0.0.1:" + strconv.Itoa(freePort(t))
	if got := c.Send(5, withKey("alice")); got[2] != 200 || got[3] != 429 || got[4] != 429 {
		t.Fatalf("alice: %v, want 3 allowed then 2 denied", got)
	}

	r := runCLI(t, c, "reset", "api", "alice", "--address", up, "--address", down)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 1 || !strings.Contains(r.stderr, "the reset failed on 1 of 2 instances ("+down+")") || len(lines) != 3 ||
		lines[0] != `zone api, key "alice": reset to its full limit on 1 of 2 instances` ||
		lines[1] != "  "+up+": reset" || !strings.HasPrefix(lines[2], "  "+down+": FAILED: cannot reach Caddy's admin API") {
		t.Fatalf("reset on a live and a dead instance: exit %d, stdout:\n%s\nstderr %q; want each instance's outcome and exit 1", r.code, r.stdout, r.stderr)
	}
	if got := c.Send(1, withKey("alice")); got[0] != 200 {
		t.Errorf("alice after the reset on the live instance: %v, want 200", got)
	}
	// Tracked nowhere: nothing was reset, an error.
	if r := runCLI(t, c, "reset", "api", "nobody", "--address", up, "--address", down); r.code != 1 || !strings.Contains(r.stdout, "  "+up+": not tracked") {
		t.Errorf("reset of a key no instance tracks: exit %d, stdout %q", r.code, r.stdout)
	}

	once := rateLimitCLI(t, c, "top", "api").ok(t, "top api")[0]
	twice := runCLI(t, c, "top", "api", "--address", up, "--address", up).ok(t, "top with one address twice")[0]
	if !strings.HasPrefix(once, "zone api: 2 denials on this instance") || twice != once {
		t.Errorf("top with the same --address twice: %q, want what top with it once says: %q (2 denials)", twice, once)
	}
}
