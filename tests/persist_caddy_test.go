package tests

// persist (issue 28): local rate zones that survive a restart of Caddy, with
// the Caddyfile as written.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// persistSite is the example at 3 per hour: events, interval and
// max_age filled in. /slow goes to upstream when one is given.
func persistSite(events int, interval, maxAge, upstream string) string {
	slow := ""
	if upstream != "" {
		// respond comes before reverse_proxy in Caddy's order: /slow
		// needs a route of its own.
		slow = "\thandle /slow {\n\t\treverse_proxy " + upstream + "\n\t}\n"
	}
	return fmt.Sprintf(`http:// {
	rate_limit /login {
		zone login_ip {
			key {client_ip}
			events %d
			window 1h
		}
		persist {
			interval %s        # periodic snapshot; default 30s
			max_age  %s        # a snapshot older than this is ignored
		}
	}
%s	respond "ok"
}
`, events, interval, maxAge, slow)
}

// snapshotFiles are the zone's snapshots in the instance's file storage.
func snapshotFiles(t *testing.T, c *caddyInstance) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(c.Dir, "data", "caddy", "tally", "snapshots", "*", "login_ip-*"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// denyLogin spends 127.0.0.1's three requests and returns the fourth's
// Retry-After in seconds.
func denyLogin(t *testing.T, c *caddyInstance) int {
	t.Helper()
	for i := range 3 {
		if r := c.Do(request{Path: "/login"}); r.Status != http.StatusOK {
			t.Fatalf("request %d: %d, want 200", i+1, r.Status)
		}
	}
	r := c.Do(request{Path: "/login"})
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d, want 429", r.Status)
	}
	return retryAfter(t, r)
}

func retryAfter(t *testing.T, r response) int {
	t.Helper()
	n, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil {
		t.Fatalf("Retry-After %q: %v", r.Header.Get("Retry-After"), err)
	}
	return n
}

// restart starts c again, on the same ports and data directory, with config.
func (c *caddyInstance) restart(config string) {
	c.t.Helper()
	c.stderr = new(lockedBuffer)
	c.Start(config, "caddyfile")
}

// stopWith ends c by how ("stop": `caddy stop`, else a signal) and waits
// for it to exit.
func (c *caddyInstance) stopWith(how string, sig os.Signal) {
	c.t.Helper()
	if how == "stop" {
		cmd := exec.Command(caddyBinary(c.t), "stop", "--address", strings.TrimPrefix(c.AdminURL, "http://"))
		cmd.Env = c.env()
		if out, err := cmd.CombinedOutput(); err != nil {
			c.t.Fatalf("caddy stop: %v\n%s", err, out)
		}
	} else if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
	if !c.Exited(20 * time.Second) {
		c.t.Fatalf("caddy did not exit within 20s of %s", how)
	}
}

// A key denied before `caddy stop` or SIGTERM is denied after the restart
// with the same Retry-After (± 2 s); another key is fresh. The snapshot is
// a file only its owner reads.
func TestPersistedDenialSurvivesStopAndSIGTERM(t *testing.T) {
	for _, how := range []string{"stop", "SIGTERM"} {
		t.Run(how, func(t *testing.T) {
			c := newCaddyInstance(t)
			config := c.Caddyfile("metrics", persistSite(3, "30s", "24h", ""))
			c.Start(config, "caddyfile")
			before := denyLogin(t, c)
			stopped := time.Now()
			c.stopWith(how, syscall.SIGTERM)

			files := snapshotFiles(t, c)
			if len(files) != 1 {
				t.Fatalf("snapshots after %s: %v, want one", how, files)
			}
			if fi, err := os.Stat(files[0]); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("snapshot %s: %v, %v; want mode 0600", files[0], fi.Mode(), err)
			}

			c.restart(config)
			r := c.Do(request{Path: "/login"})
			if r.Status != http.StatusTooManyRequests {
				t.Fatalf("after the restart: %d, want 429", r.Status)
			}
			want := before - int(time.Since(stopped).Seconds())
			if got := retryAfter(t, r); got < want-2 || got > want+2 {
				t.Errorf("Retry-After %d after the restart, want %d ± 2", got, want)
			}
			if r := c.Do(request{Path: "/login", Client: clientFrom(t, "127.0.0.2")}); r.Status != http.StatusOK {
				t.Errorf("another key after the restart: %d, want 200", r.Status)
			}
			if !strings.Contains(c.Output(), "zone restored from its snapshot") {
				t.Errorf("no restore logged:\n%s", tail(c.Output(), 20))
			}
			zone := map[string]string{"zone": "login_ip"}
			if v, ok := metricValue(c.scrape(), "caddy_rate_limit_snapshot_keys_restored_total", zone); !ok || v != 1 {
				t.Errorf("caddy_rate_limit_snapshot_keys_restored_total = %v (%v), want 1", v, ok)
			}
		})
	}
}

// Caddy writes nothing on SIGKILL: the periodic snapshot taken after the
// denial is what keeps the key denied.
func TestPersistedDenialSurvivesSIGKILLAfterOneInterval(t *testing.T) {
	c := newCaddyInstance(t)
	config := c.Caddyfile("", persistSite(3, "1s", "24h", ""))
	c.Start(config, "caddyfile")
	denyLogin(t, c)
	denied := time.Now()
	waitFor(t, 5*time.Second, "a periodic snapshot after the denial", func() bool {
		files := snapshotFiles(t, c)
		if len(files) != 1 {
			return false
		}
		fi, err := os.Stat(files[0])
		return err == nil && fi.ModTime().After(denied)
	})
	c.stopWith("SIGKILL", syscall.SIGKILL)
	c.restart(config)
	if r := c.Do(request{Path: "/login"}); r.Status != http.StatusTooManyRequests {
		t.Fatalf("after SIGKILL and a restart: %d, want 429", r.Status)
	}
}

// A snapshot is not resumed when the zone's limits changed, when it is
// corrupt (a WARN, and Caddy serves) or older than max_age.
func TestPersistedSnapshotIgnoredWhenStale(t *testing.T) {
	cases := []struct {
		name    string
		maxAge  string
		spoil   func(t *testing.T, c *caddyInstance)
		events  int // after the restart
		wantLog string
	}{
		{name: "changed limits", maxAge: "24h", events: 4, spoil: func(*testing.T, *caddyInstance) {}},
		{name: "corrupt", maxAge: "24h", events: 3, wantLog: "snapshot ignored: it is corrupt or truncated", spoil: func(t *testing.T, c *caddyInstance) {
			file := snapshotFiles(t, c)[0]
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "truncated", maxAge: "24h", events: 3, wantLog: "snapshot ignored: it is corrupt or truncated", spoil: func(t *testing.T, c *caddyInstance) {
			file := snapshotFiles(t, c)[0]
			fi, _ := os.Stat(file)
			if err := os.Truncate(file, fi.Size()-3); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "older than max_age", maxAge: "1s", events: 3, wantLog: "snapshot ignored: older than max_age", spoil: func(*testing.T, *caddyInstance) {
			time.Sleep(1500 * time.Millisecond) // the snapshot's age is what is tested
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCaddyInstance(t)
			c.Start(c.Caddyfile("metrics", persistSite(3, "30s", tc.maxAge, "")), "caddyfile")
			denyLogin(t, c)
			c.stopWith("SIGTERM", syscall.SIGTERM)
			if len(snapshotFiles(t, c)) != 1 {
				t.Fatal("no snapshot written")
			}
			tc.spoil(t, c)
			c.restart(c.Caddyfile("metrics", persistSite(tc.events, "30s", tc.maxAge, "")))
			if r := c.Do(request{Path: "/login"}); r.Status != http.StatusOK {
				t.Fatalf("after the restart: %d, want 200 (the snapshot not resumed)", r.Status)
			}
			if strings.Contains(c.Output(), "zone restored from its snapshot") {
				t.Errorf("the snapshot was restored:\n%s", tail(c.Output(), 20))
			}
			if tc.wantLog != "" && !strings.Contains(c.Output(), tc.wantLog) {
				t.Errorf("no %q in the log:\n%s", tc.wantLog, tail(c.Output(), 20))
			}
			want := 0.0 // a snapshot of other limits, or too old, is not a failure
			if strings.Contains(tc.wantLog, "corrupt") {
				want = 1
			}
			if v, _ := metricValue(c.scrape(), "caddy_rate_limit_snapshot_restore_failures_total", map[string]string{"zone": "login_ip"}); v != want {
				t.Errorf("caddy_rate_limit_snapshot_restore_failures_total = %v, want %v", v, want)
			}
		})
	}
}

// The stopping snapshot is written before Caddy waits for the requests in
// flight: with a request held by a slow upstream through SIGTERM, the
// snapshot exists (and Caddy still runs) before the upstream answers.
func TestStoppingSnapshotExistsBeforeCaddyWaitsForRequests(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-release
		_, _ = w.Write([]byte("slow"))
	}))
	defer upstream.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	c := newCaddyInstance(t)
	c.Start(c.Caddyfile("", persistSite(3, "1h", "24h", strings.TrimPrefix(upstream.URL, "http://"))), "caddyfile")
	denyLogin(t, c)
	slow := make(chan response, 1)
	go func() {
		r, _ := c.try(request{Path: "/slow"})
		slow <- r
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow request never reached the upstream")
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the stopping snapshot", func() bool { return len(snapshotFiles(t, c)) == 1 })
	if c.Exited(0) {
		t.Fatal("caddy exited with a request in flight")
	}
	close(release)
	if r := <-slow; r.Status != http.StatusOK || r.Body != "slow" {
		t.Errorf("the request in flight: %d %q, want 200 slow", r.Status, r.Body)
	}
	if !c.Exited(20 * time.Second) {
		t.Fatal("caddy did not exit once the request ended")
	}
}

// `caddy validate` of a config with persist changes nothing: no snapshot,
// no instance id written.
func TestValidateWithPersistWritesNothing(t *testing.T) {
	c := newCaddyInstance(t)
	file := filepath.Join(c.Dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(c.Caddyfile("", persistSite(3, "1s", "24h", ""))), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBinary(t), "validate", "--config", file, "--adapter", "caddyfile")
	cmd.Env = c.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("caddy validate: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "data", "caddy")); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(filepath.Join(c.Dir, "data", "caddy"))
		t.Errorf("caddy validate wrote to the data directory: %v %v", entries, err)
	}
}

// A reload that keeps a zone keeps its live state and reads no snapshot: a
// key reset through the admin API after a snapshot stays reset.
func TestReloadKeepsLiveStateOverTheSnapshot(t *testing.T) {
	c := newCaddyInstance(t)
	c.Start(c.Caddyfile("", persistSite(3, "1s", "24h", "")), "caddyfile")
	denyLogin(t, c)
	denied := time.Now()
	waitFor(t, 5*time.Second, "a periodic snapshot after the denial", func() bool {
		files := snapshotFiles(t, c)
		if len(files) != 1 {
			return false
		}
		fi, err := os.Stat(files[0])
		return err == nil && fi.ModTime().After(denied)
	})
	if status, body := c.adminDo(http.MethodDelete, keyPath("login_ip", "127.0.0.1")); status != http.StatusNoContent {
		t.Fatalf("admin reset: %d %s", status, body)
	}
	load(t, c, "", strings.Replace(persistSite(3, "1s", "24h", ""), `respond "ok"`, `respond "ok again"`, 1))
	if r := c.Do(request{Path: "/login"}); r.Status != http.StatusOK || r.Body != "ok again" {
		t.Fatalf("the reset key after a reload: %d %q, want 200 from the new config", r.Status, r.Body)
	}
}

// A ban survives `caddy stop` and a restart: the key banned for 1h by a
// zone whose own window is 3s is still denied for about an hour, not for
// what its TAT had left (issue 28, bans of issue 24).
func TestPersistedBanSurvivesStop(t *testing.T) {
	c := newCaddyInstance(t)
	config := c.Caddyfile("", `http:// {
	rate_limit /login {
		zone login_ip {
			key {client_ip}
			events 3
			window 3s
			ban 1h
		}
		persist {
			interval 30s
			max_age  24h
		}
	}
	respond "ok"
}
`)
	c.Start(config, "caddyfile")
	if before := denyLogin(t, c); before < 3595 {
		t.Fatalf("Retry-After %d on the denial, want the 1h ban", before)
	}
	banned := time.Now()
	c.stopWith("stop", nil)
	c.restart(config)
	r := c.Do(request{Path: "/login"})
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("after the restart: %d, want 429 (still banned)", r.Status)
	}
	want := 3600 - int(time.Since(banned).Seconds())
	if got := retryAfter(t, r); got < want-5 || got > want+5 {
		t.Errorf("Retry-After %d after the restart, want %d ± 5 (the ban's time left)", got, want)
	}
	if r := c.Do(request{Path: "/login", Client: clientFrom(t, "127.0.0.2")}); r.Status != http.StatusOK {
		t.Errorf("another key after the restart: %d, want 200", r.Status)
	}
}

// A SIGKILL during a snapshot write leaves certmagic's temporary file (a
// name of digits beside the snapshot, as large as it) in the instance's
// snapshot directory; the next start removes it once the config runs,
// instead of leaving one more at every kill. The snapshot itself stays.
func TestStaleSnapshotTempFileIsRemovedAtStart(t *testing.T) {
	c := newCaddyInstance(t)
	config := c.Caddyfile("", persistSite(3, "1s", "24h", ""))
	c.Start(config, "caddyfile")
	denyLogin(t, c)
	waitFor(t, 5*time.Second, "a periodic snapshot", func() bool { return len(snapshotFiles(t, c)) == 1 })
	c.stopWith("SIGKILL", syscall.SIGKILL)

	// What a write killed between create and rename leaves: os.CreateTemp's
	// name, from a write long enough ago that it cannot be in flight.
	snapshot := snapshotFiles(t, c)[0]
	temp := filepath.Join(filepath.Dir(snapshot), "2849571632")
	if err := os.WriteFile(temp, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(temp, old, old); err != nil {
		t.Fatal(err)
	}
	c.restart(config)
	waitFor(t, 10*time.Second, "the interrupted write's temporary file to be removed", func() bool {
		_, err := os.Stat(temp)
		return os.IsNotExist(err)
	})
	if _, err := os.Stat(snapshot); err != nil {
		t.Errorf("the snapshot itself: %v, want it kept", err)
	}
	if r := c.Do(request{Path: "/login"}); r.Status != http.StatusTooManyRequests {
		t.Errorf("after the restart: %d, want 429 (the snapshot restored)", r.Status)
	}
}
