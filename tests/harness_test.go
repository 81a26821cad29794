package tests

// The harness's pieces that are not a server: free loopback ports, and
// polling a condition instead of sleeping.

import (
	"net"
	"slices"
	"testing"
	"time"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// freePortExcept is freePort, never one of taken: a port freed a moment ago
// can come back at once.
func freePortExcept(t testing.TB, taken ...int) int {
	t.Helper()
	for {
		if p := freePort(t); !slices.Contains(taken, p) {
			return p
		}
	}
}

// waitFor polls cond every 10ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
