package tests

// The harness for a real redis-server: one process per test on a free
// loopback port, stopped, paused or killed on demand; the TTL invariant;
// script calls counted from INFO commandstats.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a real redis-server process on a free loopback port, owned
// by one test and killed when it ends.
type redisServer struct {
	t    testing.TB
	Port int
	Addr string
	dir  string
	args []string
	cmd  *exec.Cmd
	// exited is closed when cmd's process has ended.
	exited chan struct{}
}

// errPortTaken: the port freePort gave was taken (by another test's server,
// or as a client connection's local port) before redis-server bound it.
var errPortTaken = errors.New("port taken before redis-server bound it")

// startRedis starts a redis-server with persistence off. Extra arguments are
// passed through (e.g. "--cluster-enabled", "yes").
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed: run `make test`, which installs it (apt-get install redis-server): %v", err)
	}
	dir := t.TempDir()
	r := &redisServer{t: t, dir: dir}
	t.Cleanup(r.Kill)
	for attempt := 1; ; attempt++ {
		r.Port = freePort(t)
		r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port))
		r.args = append([]string{"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--enable-debug-command", "yes"}, extra...)
		err := r.start()
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatal(err)
		}
	}
	_ = path
	return r
}

// Start (re)starts the server on its port and waits until it answers PING.
func (r *redisServer) Start() {
	r.t.Helper()
	if err := r.start(); err != nil {
		r.t.Fatal(err)
	}
}

// start starts the server and waits until it answers PING; a server that
// exits first fails at once, with its log (errPortTaken if its port was
// taken), rather than after the timeout.
func (r *redisServer) start() error {
	logPath := filepath.Join(r.dir, fmt.Sprintf("redis-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("redis-server", r.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.cmd, r.exited = cmd, exited
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		select {
		case <-exited:
			r.cmd = nil
			out, _ := os.ReadFile(logPath)
			if bytes.Contains(out, []byte("Address already in use")) {
				return fmt.Errorf("redis-server on %s: %w", r.Addr, errPortTaken)
			}
			return fmt.Errorf("redis-server on %s exited before answering PING:\n%s", r.Addr, out)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after 10s waiting for redis-server to answer PING on %s", r.Addr)
		}
	}
	return nil
}

// Kill stops the server for good (SIGKILL), as a crash would.
func (r *redisServer) Kill() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT)
	_ = r.cmd.Process.Kill()
	if r.exited != nil {
		<-r.exited // start's goroutine waits for the process
	} else {
		_ = r.cmd.Wait() // started elsewhere (the TLS server)
	}
	r.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open, nothing answers.
func (r *redisServer) Pause() { _ = r.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (r *redisServer) Resume() { _ = r.cmd.Process.Signal(syscall.SIGCONT) }

// Client returns a go-redis client for the server, closed with the test.
func (r *redisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// requireEveryKeyExpires scans every key of the server and fails the test for
// any without a TTL: the invariant that every key tally writes expires. It
// returns the keys, and fails when there are fewer than minKeys (so that an
// empty server cannot pass).
func (r *redisServer) requireEveryKeyExpires(t testing.TB, minKeys int) []string {
	t.Helper()
	ctx := context.Background()
	c := r.Client()
	var keys []string
	iter := c.Scan(ctx, 0, "*", 100).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(keys) < minKeys {
		t.Fatalf("Redis holds %d keys, want at least %d: %v", len(keys), minKeys, keys)
	}
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// PTTL -1: no expiry, the invariant broken. -2 (or 0): the key
		// expired between SCAN and PTTL, which short TTLs do on a loaded
		// machine.
		if ttl == -1 {
			t.Errorf("Redis key %q has no TTL (PTTL %v): every key tally writes must expire", k, ttl)
		}
	}
	return keys
}

// scriptStats is the Redis CPU spent in scripts since the last CONFIG
// RESETSTAT, and the number of script calls: the usec and calls of
// cmdstat_evalsha and cmdstat_eval.
func scriptStats(rdb *redis.Client) (usec, calls int64, err error) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			name, v, _ := strings.Cut(field, "=")
			if name != "usec" && name != "calls" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("commandstats %q: %w", line, err)
			}
			if name == "usec" {
				usec += n
			} else {
				calls += n
			}
		}
	}
	return usec, calls, nil
}

// evalCalls is how many scripts Redis has run (EVALSHA and EVAL).
func evalCalls(t *testing.T, rs *redisServer) int64 {
	t.Helper()
	_, calls, err := scriptStats(rs.Client())
	if err != nil {
		t.Fatal(err)
	}
	return calls
}

// logEveryCommand has rs log every command in its slow log from now on,
// the earlier entries dropped, so that scriptsLogged can read them.
func logEveryCommand(t testing.TB, rs *redisServer) {
	t.Helper()
	ctx := context.Background()
	for _, cmd := range [][]any{{"config", "set", "slowlog-log-slower-than", "0"}, {"config", "set", "slowlog-max-len", "100000"}, {"slowlog", "reset"}} {
		if err := rs.Client().Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptsLogged is the script calls (EVALSHA, EVAL) in rs's slow log whose
// arguments contain about, each as one line; a script's own commands are
// logged too, and left out.
func scriptsLogged(t testing.TB, rs *redisServer, about string) []string {
	t.Helper()
	log, err := rs.Client().SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	for _, e := range log {
		if line := strings.Join(e.Args, " "); strings.HasPrefix(strings.ToLower(line), "eval") && strings.Contains(line, about) {
			calls = append(calls, line)
		}
	}
	return calls
}
