package tests

// The harness's pieces that are not a server: free loopback ports, and
// polling a condition instead of sleeping.

import (
	"net"
	"sync"
	"testing"
	"time"
)

// handedOut are the ports freePort returned in this test process.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that it never returned before in this process: Caddy binds its listeners
// with SO_REUSEPORT, so two Caddies of parallel tests given the same port
// would both bind it and share its connections (one's admin API answering
// for the other's site).
func freePort(t testing.TB) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[p] {
			handedOut.ports[p] = true
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
