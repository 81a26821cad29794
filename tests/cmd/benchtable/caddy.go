package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// caddyProcess is a Caddy built from the working tree, running as a
// subprocess on free loopback ports with its HOME and XDG directories in a
// temporary directory.
type caddyProcess struct {
	cmd       *exec.Cmd
	addr      string // the site, 127.0.0.1:port
	adminAddr string
	logPath   string
	exited    chan error
}

// buildCaddy builds cmd/tally-caddy into dir and returns the binary's path.
func buildCaddy(testsDir, dir string) (string, error) {
	bin := filepath.Join(dir, "caddy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/tally-caddy")
	cmd.Dir = testsDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/tally-caddy: %v\n%s", err, out)
	}
	return bin, nil
}

// defaultBaselineRef is the commit before runtime overrides: tally as it was
// when a zone had no override set to look at.
const defaultBaselineRef = "f44cfb2"

// buildBaselineCaddy builds cmd/tally-caddy as it was at o.baselineRef into
// e.dir and returns the binary and the commit's short hash. The commit's tree
// is exported with git archive (the repository's worktrees and refs stay as
// they are) and built with buildCaddy, as the working tree is; the export is
// removed once built.
func buildBaselineCaddy(o options, e *env) (bin, commit string, err error) {
	fail := func(format string, args ...any) (string, string, error) {
		return "", "", fmt.Errorf("-baseline-ref %s: "+format, append([]any{o.baselineRef}, args...)...)
	}
	top, err := gitOutput(o.rootDir, "rev-parse", "--show-toplevel")
	if err != nil {
		return fail("%s is not in a git checkout: %v", o.rootDir, err)
	}
	commit, err = gitOutput(top, "rev-parse", "--verify", "--quiet", "--short=12", o.baselineRef+"^{commit}")
	if err != nil {
		return fail("no such commit in %s (in a shallow clone: git fetch --unshallow): %v", top, err)
	}
	rel, err := filepath.Rel(top, o.rootDir)
	if err != nil {
		return fail("%v", err)
	}
	src := filepath.Join(e.dir, "baseline-src")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return fail("%v", err)
	}
	defer os.RemoveAll(src)
	tarball := filepath.Join(e.dir, "baseline.tar")
	if _, err := gitOutput(top, "archive", "--format=tar", "-o", tarball, commit); err != nil {
		return fail("git archive: %v", err)
	}
	defer os.Remove(tarball)
	if out, err := exec.Command("tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		return fail("tar -x: %v: %s", err, out)
	}
	binDir := filepath.Join(e.dir, "baseline-bin")
	if err := os.MkdirAll(binDir, 0o700); err != nil {
		return fail("%v", err)
	}
	progressf("building the baseline Caddy from %s (commit %s)", o.baselineRef, commit)
	start := time.Now()
	if bin, err = buildCaddy(filepath.Join(src, rel, "tests"), binDir); err != nil {
		return fail("commit %s: %v", commit, err)
	}
	progressf("built the baseline Caddy in %v", time.Since(start).Round(100*time.Millisecond))
	return bin, commit, nil
}

// gitOutput runs git in dir and returns its trimmed standard output, or an
// error with its standard error.
func gitOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%v: %s", err, msg)
		}
		return "", fmt.Errorf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// freeLoopbackAddr returns 127.0.0.1:port for a port that was free a moment
// ago.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startCaddy runs bin with a Caddyfile made of the global options and the
// given site routes (the body of one http:// site block), and waits until
// both the site and the admin endpoint answer.
func startCaddy(bin, dir, routes string) (*caddyProcess, error) {
	return startCaddyFile(bin, dir, func(addr, adminAddr, runtimeLog string) string {
		return fmt.Sprintf(`{
	admin %s
	auto_https off
	persist_config off
	log {
		output file %s
	}
}

http://%s {
%s
}
`, adminAddr, runtimeLog, addr, routes)
	})
}

// startCaddyFile runs bin with the Caddyfile caddyfile returns for free
// loopback addresses (an http:// site at addr, which must answer, and the
// admin endpoint) and the runtime log's path, and waits until both answer.
func startCaddyFile(bin, dir string, caddyfile func(addr, adminAddr, runtimeLog string) string) (*caddyProcess, error) {
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	adminAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"home", "config", "data"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, err
		}
	}
	config := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(config, []byte(caddyfile(addr, adminAddr, filepath.Join(dir, "caddy-runtime.log"))), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "caddy.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()

	cmd := exec.Command(bin, "run", "--config", config, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(),
		"HOME="+filepath.Join(dir, "home"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &caddyProcess{cmd: cmd, addr: addr, adminAddr: adminAddr, logPath: logPath, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-p.exited:
			return nil, fmt.Errorf("caddy exited while starting (%v): %s", err, p.logTail())
		default:
		}
		if p.answers() {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("caddy did not answer within 30s: %s", p.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *caddyProcess) answers() bool {
	c := http.Client{Timeout: time.Second}
	for _, url := range []string{"http://" + p.adminAddr + "/config/", "http://" + p.addr + "/"} {
		resp, err := c.Get(url)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return true
}

// cpuProfile fetches a CPU profile of the given length from Caddy's admin
// endpoint into path.
func (p *caddyProcess) cpuProfile(ctx context.Context, seconds int, path string) error {
	url := "http://" + p.adminAddr + "/debug/pprof/profile?seconds=" + strconv.Itoa(seconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// memStats reads Go's memory statistics of the Caddy process from its admin
// endpoint (/debug/vars, expvar's memstats).
func (p *caddyProcess) memStats() (runtime.MemStats, error) {
	var vars struct{ Memstats runtime.MemStats }
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.adminAddr + "/debug/vars")
	if err != nil {
		return vars.Memstats, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return vars.Memstats, fmt.Errorf("/debug/vars: %s", resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&vars)
	return vars.Memstats, err
}

// stop asks Caddy to stop through its admin endpoint and kills its process
// group when it has not exited within five seconds.
func (p *caddyProcess) stop() {
	c := http.Client{Timeout: 2 * time.Second}
	if resp, err := c.Post("http://"+p.adminAddr+"/stop", "", nil); err == nil {
		resp.Body.Close()
	}
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

func (p *caddyProcess) logTail() string {
	data, _ := os.ReadFile(p.logPath)
	return lastLines(data, 10)
}

// cpuTime is the CPU time (user + system) Caddy's process has used so far,
// read from /proc: with other work on the machine, CPU per request is a
// steadier measure of the server's cost than requests per second.
func (p *caddyProcess) cpuTime() (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: state is field 3, utime 14 and stime 15.
	_, rest, ok := strings.Cut(string(data), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat %q", data)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected /proc stat %q", data)
	}
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}
