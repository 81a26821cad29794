package tests

// The harness's pieces that are not a server: free loopback ports, and
// polling a condition instead of sleeping.

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
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
	// Below the kernel's ephemeral range: a port from it, closed again, can
	// be taken by any outgoing connection (a Redis client's) before the
	// server binds it.
	lo := 32768
	var a, b int
	if f, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if _, err := fmt.Sscan(string(f), &a, &b); err == nil && a > 11024 {
			lo = a
		}
	}
	for range 10000 {
		p := lo - 10000 + rand.IntN(10000)
		if handedOut.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		handedOut.ports[p] = true
		return p
	}
	t.Fatalf("no free port in 127.0.0.1:%d-%d", lo-10000, lo-1)
	return 0
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
