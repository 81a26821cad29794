package listener

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tally/ratelimit/zones"
)

// newWrapper provisions a listener wrapper from its Caddyfile block, outside
// an HTTP server (no placement to check).
func newWrapper(t *testing.T, block string) *Wrapper {
	t.Helper()
	var w Wrapper
	if err := w.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := w.Provision(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Cleanup()
		cancel()
	})
	return &w
}

// serveWrapped accepts on a loopback listener wrapped by w and echoes every
// byte each connection sends, as a server would read it, until the client
// closes; then it closes the connection. It returns the address; the accept
// loop must end only with the listener's close.
func serveWrapped(t *testing.T, w *Wrapper, wrap func(net.Listener) net.Listener) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	wl := w.WrapListener(ln)
	done := make(chan error, 1)
	go func() {
		for {
			c, err := wl.Accept()
			if err != nil {
				done <- err
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		wl.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept returned %v before the listener closed", err)
		}
	})
	return ln.Addr().String()
}

// dialFrom connects from the loopback address from and sends a byte: it
// returns the connection when the byte comes back (accepted), nil when the
// connection was reset (refused), which the client may see as soon as
// connect; anything else fails the test.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil // reset before connect returned
	}
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1)
	if _, err = c.Write([]byte("x")); err == nil {
		_, err = c.Read(buf)
	}
	if err == nil {
		_ = c.SetDeadline(time.Time{})
		return c
	}
	c.Close()
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("connection from %s neither served nor reset: %v", from, err)
	}
	return nil
}

func TestRefusedConnectionsAreResetAndTheAcceptLoopGoesOn(t *testing.T) {
	w := newWrapper(t, "rate_limit {\n zone c {\n key {remote_ip}\n events 2\n window 1h\n }\n}")
	addr := serveWrapped(t, w, nil)
	for i, want := range []bool{true, true, false, false} {
		c := dialFrom(t, "127.0.0.1", addr)
		if (c != nil) != want {
			t.Fatalf("connection %d from 127.0.0.1: accepted %v, want %v", i+1, c != nil, want)
		}
		if c != nil {
			c.Close()
		}
	}
	// Another client is not affected, and the loop accepts it after the
	// refusals.
	if c := dialFrom(t, "127.0.0.2", addr); c == nil {
		t.Fatal("127.0.0.2 refused")
	} else {
		c.Close()
	}
}

func TestConcurrencySlotIsReleasedOnceWhateverClosesTheConnection(t *testing.T) {
	w := newWrapper(t, "rate_limit {\n zone open {\n key {remote_ip}\n concurrency 2\n }\n}")
	z := w.zones[0]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wl := w.WrapListener(ln)
	defer wl.Close()
	accept := func() net.Conn {
		t.Helper()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		c, err := wl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := accept(), accept()
	if n := z.InFlight(); n != 2 {
		t.Fatalf("%d connections in flight, want 2", n)
	}
	for range 3 {
		_ = a.Close()
	}
	if n := z.InFlight(); n != 1 {
		t.Fatalf("after three Closes of one connection: %d in flight, want 1", n)
	}
	c := accept() // the slot a gave back
	var wg sync.WaitGroup
	for range 8 { // Close from many goroutines at once
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = b.Close()
			_ = c.Close()
		}()
	}
	wg.Wait()
	if n := z.InFlight(); n != 0 {
		t.Fatalf("after concurrent Closes: %d in flight, want 0", n)
	}
	if got := z.State(); got == nil {
		t.Fatal("no state")
	}
}

// A connection that a later zone refuses consumes nothing in the zones
// before it: the rate zone's budget of 3 is whole after five refusals by the
// concurrency zone.
func TestRefusedConnectionConsumesNothingInOtherZones(t *testing.T) {
	w := newWrapper(t, `rate_limit {
	zone rate {
		key {remote_ip}
		events 3
		window 1h
	}
	zone open {
		key {remote_ip}
		concurrency 1
	}
}`)
	addr := serveWrapped(t, w, nil)
	held := dialFrom(t, "127.0.0.1", addr)
	if held == nil {
		t.Fatal("first connection refused")
	}
	for i := range 5 {
		if c := dialFrom(t, "127.0.0.1", addr); c != nil {
			t.Fatalf("connection %d accepted beside one open, with concurrency 1", i+2)
		}
	}
	held.Close()
	open := w.zones[1]
	waitUntil(t, "the closed connection's slot is released", func() bool { return open.InFlight() == 0 })
	for i := range 2 {
		c := dialFrom(t, "127.0.0.1", addr)
		if c == nil {
			t.Fatalf("connection %d of a budget of 3 refused: the refusals consumed it", i+2)
		}
		c.Close()
		waitUntil(t, "the slot is released", func() bool { return open.InFlight() == 0 })
	}
	if c := dialFrom(t, "127.0.0.1", addr); c != nil {
		t.Fatal("a fourth connection accepted with events 3 per hour")
	}
}

// Many clients connect and disconnect at once: at no time does a client
// have more connections served than its concurrency, and every slot comes
// back.
func TestConnectionConcurrencyHoldsUnderManyGoroutines(t *testing.T) {
	w := newWrapper(t, "rate_limit {\n zone open {\n key {remote_ip}\n concurrency 4\n }\n}")
	addr := serveWrapped(t, w, nil)
	var open, most, served atomic.Int64
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from := "127.0.0.1"
			if g%3 == 0 {
				from = "127.0.0.2"
			}
			for range 20 {
				c := dialFrom(t, from, addr)
				if c == nil {
					continue
				}
				served.Add(1)
				if from == "127.0.0.1" {
					n := open.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(time.Millisecond)
					open.Add(-1)
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > 4 {
		t.Fatalf("127.0.0.1 had %d connections served at once, with concurrency 4", m)
	}
	if served.Load() < 8 {
		t.Fatalf("only %d connections served", served.Load())
	}
	waitUntil(t, "every slot is released", func() bool { return w.zones[0].InFlight() == 0 })
}

// slowAddrConn is a connection whose RemoteAddr waits, as a PROXY protocol
// connection's does until its header arrives.
type slowAddrConn struct {
	*net.TCPConn
	header <-chan struct{}
	source net.Addr
}

func (c *slowAddrConn) RemoteAddr() net.Addr {
	<-c.header
	return c.source
}

type slowAddrListener struct {
	net.Listener
	header chan struct{}
	source net.Addr
}

func (l *slowAddrListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &slowAddrConn{TCPConn: c.(*net.TCPConn), header: l.header, source: l.source}, nil
}

// A connection whose address is not known yet is decided on its first read,
// in its own goroutine: Accept hands it out at once, and it is then decided
// by the address it turns out to have.
func TestAcceptNeverWaitsForAConnectionsAddress(t *testing.T) {
	w := newWrapper(t, "rate_limit {\n zone c {\n key {remote_ip}\n events 1\n window 1h\n }\n}")
	header := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	source := &net.TCPAddr{IP: net.ParseIP("203.0.113.9"), Port: 4000}
	wl := w.WrapListener(&slowAddrListener{Listener: ln, header: header, source: source})
	defer wl.Close()
	var accepted []net.Conn
	for range 2 {
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		c, err := wl.Accept() // returns although RemoteAddr blocks
		if err != nil {
			t.Fatal(err)
		}
		accepted = append(accepted, c)
		_, _ = client.Write([]byte("x"))
	}
	results := make(chan error, 2)
	for _, c := range accepted {
		go func() {
			_, err := c.Read(make([]byte, 1))
			results <- err
		}()
	}
	close(header)
	var refused, served int
	for range 2 {
		switch err := <-results; {
		case err == nil:
			served++
		case errors.Is(err, errRefused):
			refused++
		default:
			t.Fatalf("first read: %v", err)
		}
	}
	if served != 1 || refused != 1 {
		t.Fatalf("%d served, %d refused of two connections from one source with events 1, want 1 and 1", served, refused)
	}
	if k := w.zones[0].Config.Key("203.0.113.9"); k != "203.0.113.9" {
		t.Fatalf("key %q", k)
	}
	tk := zones.Ticket[*connZone]{Zone: w.zones[0].Zone, Key: "203.0.113.9", Plan: w.zones[0].Plan()}
	if s, err := tk.Read(background, 0); err != nil || !s.Tracked {
		t.Fatalf("the source has no state: %+v, %v", s, err)
	}
}

// {remote_ip} is the client address as Caddy's {client_ip} has it without
// trusted proxies: what server.go's determineTrustedProxy does with
// RemoteAddr, so that deny_while finds the keys HTTP zones store.
func TestClientIPIsFormattedAsCaddyFormatsClientIP(t *testing.T) {
	caddyClientIP := func(remoteAddr string) string {
		host, _, err := net.SplitHostPort(remoteAddr)
		if err != nil {
			return ""
		}
		host, _, _ = strings.Cut(host, "%")
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return ""
		}
		return ip.String()
	}
	addrs := []net.Addr{
		&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1).To4(), Port: 1},
		&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}, // 16-byte, IPv4-mapped
		&net.TCPAddr{IP: net.ParseIP("2001:0db8:0000::0001"), Port: 443},
		&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 443, Zone: "eth0"},
		&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 80},
		&net.UDPAddr{IP: net.ParseIP("2001:db8::7"), Port: 443},
		&net.UnixAddr{Name: "@", Net: "unix"},
	}
	for _, a := range addrs {
		if got, want := clientIP(a), caddyClientIP(a.String()); got != want {
			t.Errorf("%s (%T): %q, Caddy's client IP is %q", a, a, got, want)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
