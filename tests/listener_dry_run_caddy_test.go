package tests

import (
	"testing"
)

// The wrapper's own dry_run covers its deny_while zones as well as its own:
// while the HTTP zone denies 127.0.0.1, its new connections are served and
// counted as the refusals they would have been, and the HTTP zone itself
// (not in dry run) still answers 429.
func TestWrapperDryRunRefusesNoConnectionThroughDenyWhile(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				deny_while login_ip
				dry_run
			}
			tls`), `	rate_limit {
		zone login_ip {
			key {remote_host}
			events 2
			window 1h
		}
	}
	respond "ok"`)
	c := e.conn(t, "127.0.0.1", "")
	if c == nil {
		t.Fatal("refused before any denial")
	}
	for i, want := range []int{200, 200, 429} {
		if status, _ := get(t, c, "/"); status != want {
			t.Fatalf("request %d: %d, want %d", i+1, status, want)
		}
	}
	c.Close()
	const attempts = 3
	for i := range attempts {
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatalf("new connection %d refused while login_ip denies 127.0.0.1: the wrapper is in dry run", i+1)
		}
		if status, _ := get(t, c, "/"); status != 429 {
			t.Errorf("connection %d: %d, want 429 from the HTTP zone", i+1, status)
		}
		c.Close()
	}
	if n := connectionsTotal(t, e.caddyInstance, "login_ip", "dry_run_denied"); n != attempts {
		t.Errorf("connections_total{zone=login_ip,decision=dry_run_denied} %v, want %d", n, attempts)
	}
}
