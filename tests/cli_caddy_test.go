package tests

// `caddy rate-limit`, the CLI the module registers, run as a separate process
// against a running Caddy's admin API.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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
	if out != `zone api, key "carol": not limited, 3 of 3 remaining (no state: full limit)` {
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
	// Resetting a key with no state is not an error: it has its full limit.
	rateLimitCLI(t, c, "reset", "api", "carol").ok(t, "reset of an unused key")
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
	if f := strings.Fields(lines[2]); len(f) < 5 || f[0] != "heavy-0" || f[1] != strconv.FormatUint(denied["heavy-0"], 10) ||
		f[2] != "LIMITED" || f[3] != "for" {
		t.Errorf("first key %q, want heavy-0 with its %d denials, LIMITED", lines[2], denied["heavy-0"])
	}
	for i := 1; i < 5; i++ {
		if row(lines, "heavy-"+strconv.Itoa(i)) == nil {
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
		"heavy-0 " + strconv.FormatUint(deniedA["heavy-0"]+99, 10) + " LIMITED for",
		"heavy-1 " + strconv.FormatUint(deniedA["heavy-1"]+299, 10) + " LIMITED for",
		"heavy-2 " + strconv.FormatUint(deniedA["heavy-2"], 10) + " LIMITED for",
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
}
