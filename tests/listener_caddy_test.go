package tests

// The connection layer, caddy.listeners.rate_limit, in a real Caddy: TLS
// connections from 127.0.0.1, 127.0.0.2 and 127.0.0.3, and from any IPv4 or
// IPv6 source through PROXY protocol headers.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// edge is a Caddy with the harness's http:// site and one TLS site on its
// own port, whose certificate a test PKI signed for 127.0.0.1.
type edge struct {
	*caddyInstance
	tlsPort    int
	tlsAddr    string
	cert, key  string
	clientConf *tls.Config
}

func newEdge(t *testing.T) *edge {
	t.Helper()
	c := newCaddyInstance(t)
	pki := newTestPKI(t, "edge")
	e := &edge{caddyInstance: c}
	e.tlsPort = freePort(t)
	e.tlsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(e.tlsPort))
	e.cert, e.key = issueForLoopback(pki)
	pem, err := os.ReadFile(pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	e.clientConf = &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}}
	return e
}

// issueForLoopback signs a server certificate for 127.0.0.1 and ::1: a
// client connecting to an IP sends no SNI, and Caddy then picks the
// certificate by the local address, which a PROXY header over IPv6 makes ::1.
func issueForLoopback(p *testPKI) (certFile, keyFile string) {
	p.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: "edge"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return p.write("edge.pem", "CERTIFICATE", der), p.write("edge-key.pem", "EC PRIVATE KEY", kder)
}

// wrappersOnTLS is the global servers option giving the TLS site's server
// these listener_wrappers (a block's body).
func (e *edge) wrappersOnTLS(wrappers string) string {
	return fmt.Sprintf("\tservers %s {\n\t\tlistener_wrappers {\n%s\n\t\t}\n\t}", e.tlsAddr, wrappers)
}

// config is the whole Caddyfile: global options (debug, so that a TLS
// handshake net/http saw would be logged), the http:// site and the TLS
// site with body.
func (e *edge) config(global, body string) string {
	return e.Caddyfile("\tdebug\n"+global, fmt.Sprintf(`http:// {
	respond "plain"
}

https://%s {
	tls %s %s
%s
}
`, e.tlsAddr, e.cert, e.key, body))
}

func (e *edge) start(global, body string) *edge {
	e.Start(e.config(global, body), "caddyfile")
	return e
}

// conn opens a TLS connection from the loopback address from, first sending
// proxyHeader (a PROXY protocol header, or ""). It returns the connection,
// handshake done, or nil when the server reset it; anything else fails the
// test.
func (e *edge) conn(t *testing.T, from, proxyHeader string) *tls.Conn {
	t.Helper()
	c, err := e.try(from, proxyHeader)
	switch {
	case err == nil:
		return c
	case isReset(err):
		return nil
	}
	t.Fatalf("TLS connection from %s %q: neither handshake nor reset: %v", from, proxyHeader, err)
	return nil
}

func (e *edge) try(from, proxyHeader string) (*tls.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	raw, err := d.Dial("tcp", e.tlsAddr)
	if err != nil {
		return nil, err
	}
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	if proxyHeader != "" {
		if _, err := io.WriteString(raw, proxyHeader); err != nil {
			raw.Close()
			return nil, err
		}
	}
	c := tls.Client(raw, e.clientConf)
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return c, nil
}

// isReset reports whether err is the client's view of a refusal: an RST,
// whether it arrives as connect returns, as the ClientHello is written or as
// the handshake reads. An EOF (a FIN) is not one.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// get sends GET path on c and returns the status and body.
func get(t *testing.T, c net.Conn, path string) (int, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func proxyV1(src string) string {
	if strings.Contains(src, ":") {
		return "PROXY TCP6 " + src + " ::1 40000 443\r\n"
	}
	return "PROXY TCP4 " + src + " 127.0.0.1 40000 443\r\n"
}

func connectionsTotal(t *testing.T, c *caddyInstance, zone, decision string) float64 {
	t.Helper()
	v, ok := metricValue(c.scrape(), "caddy_rate_limit_connections_total", map[string]string{"zone": zone, "decision": decision})
	if !ok {
		t.Fatalf("no caddy_rate_limit_connections_total{zone=%q,decision=%q}", zone, decision)
	}
	return v
}

// slotsHeld is what the admin API says key holds in a connection
// concurrency zone (0 when it holds none).
func slotsHeld(t *testing.T, c *caddyInstance, zone, key string) int {
	t.Helper()
	status, body := c.adminDo(http.MethodGet, "/rate_limit/zones/"+zone+"/keys/"+key)
	switch status {
	case http.StatusNotFound:
		return 0
	case http.StatusOK:
		var v struct {
			InUse int `json:"in_use"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		return v.InUse
	}
	t.Fatalf("GET key %s of %s: %d %s", key, zone, status, body)
	return 0
}

// Zone 5 per 10s: of 8 sequential TLS connections from 127.0.0.1, 5 are
// served and 3 reset before their handshake (net/http never sees them: no
// handshake error in Caddy's debug log); 127.0.0.2 meanwhile is served.
func TestConnectionRateZoneResetsConnectionsBeforeTheHandshake(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 5
					window 10s
				}
			}
			tls`), "\trespond \"{http.request.scheme} {remote_host}\"")
	var served, reset int
	for i := range 8 {
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			reset++
		} else {
			served++
			if status, body := get(t, c, "/"); status != 200 || body != "https 127.0.0.1" {
				t.Errorf("connection %d: %d %q, want 200 \"https 127.0.0.1\"", i+1, status, body)
			}
			c.Close()
		}
		if i == 5 { // while 127.0.0.1 is refused
			c := e.conn(t, "127.0.0.2", "")
			if c == nil {
				t.Fatal("127.0.0.2 refused while 127.0.0.1 is over its limit")
			}
			if status, body := get(t, c, "/"); status != 200 || body != "https 127.0.0.2" {
				t.Errorf("127.0.0.2: %d %q", status, body)
			}
			c.Close()
		}
	}
	if served != 5 || reset != 3 {
		t.Fatalf("127.0.0.1: %d served, %d reset, want 5 and 3", served, reset)
	}
	if n := connectionsTotal(t, e.caddyInstance, "conn_rate", "denied"); n != 3 {
		t.Errorf("connections_total denied %v, want 3", n)
	}
	if n := connectionsTotal(t, e.caddyInstance, "conn_rate", "allowed"); n != 6 {
		t.Errorf("connections_total allowed %v, want 6", n)
	}
	out := e.Output()
	if strings.Contains(out, "TLS handshake error") || strings.Contains(out, "connectionStater") {
		t.Errorf("net/http saw a refused connection, or the wrapper broke TLS state:\n%s", tail(out, 40))
	}
	if n := strings.Count(out, `"msg":"connection refused","zone":"conn_rate"`); n != 3 {
		t.Errorf("%d refusal lines logged, want 3 (the sampler logs the first 10 a second)", n)
	}
	// The admin API and the CLI list the connection zone as such.
	var zs []struct {
		Name   string `json:"name"`
		Layer  string `json:"layer"`
		Events int    `json:"events"`
	}
	e.adminJSON("/rate_limit/zones", &zs)
	if len(zs) != 1 || zs[0].Name != "conn_rate" || zs[0].Layer != "connection" || zs[0].Events != 5 {
		t.Errorf("GET /rate_limit/zones: %+v", zs)
	}
	lines := rateLimitCLI(t, e.caddyInstance, "zones").ok(t, "zones")
	if got := strings.Join(row(lines, "conn_rate"), " "); !strings.HasPrefix(got, "conn_rate 5/10s connections 5 local") {
		t.Errorf("caddy rate-limit zones: %q\n%s", got, strings.Join(lines, "\n"))
	}
}

// concurrency 3: a fourth open connection is refused; closing one lets the
// next in.
func TestConnectionConcurrencyZoneCountsOpenConnections(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				zone conn_open {
					key {remote_ip}
					concurrency 3
				}
			}
			tls`), "\trespond \"ok\"")
	var open []*tls.Conn
	for i := range 3 {
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatalf("connection %d of concurrency 3 refused", i+1)
		}
		defer c.Close()
		open = append(open, c)
	}
	if c := e.conn(t, "127.0.0.1", ""); c != nil {
		t.Fatal("a fourth open connection was served")
	}
	if c := e.conn(t, "127.0.0.2", ""); c == nil {
		t.Fatal("127.0.0.2 refused")
	} else {
		c.Close()
	}
	waitFor(t, 5*time.Second, "connections_in_flight 3 (127.0.0.2's closed)", func() bool {
		v, _ := metricValue(e.scrape(), "caddy_rate_limit_connections_in_flight", map[string]string{"zone": "conn_open"})
		return v == 3
	})
	lines := rateLimitCLI(t, e.caddyInstance, "zones").ok(t, "zones")
	if got := strings.Join(row(lines, "conn_open"), " "); !strings.HasPrefix(got, "conn_open 3 connections open") {
		t.Errorf("caddy rate-limit zones: %q", got)
	}
	open[0].Close()
	waitFor(t, 5*time.Second, "the closed connection's slot", func() bool { return slotsHeld(t, e.caddyInstance, "conn_open", "127.0.0.1") == 2 })
	c := e.conn(t, "127.0.0.1", "")
	if c == nil {
		t.Fatal("refused after one of three connections closed")
	}
	c.Close()
}

// A connection's slot is released however it ends. Each case holds the one
// slot of concurrency 1, ends the connection its way, and then a new
// connection must be served.
func TestConnectionSlotIsReleasedHoweverTheConnectionEnds(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	e := newEdge(t)
	wrappers := e.wrappersOnTLS(`			rate_limit {
				zone conn_open {
					key {remote_ip}
					concurrency 1
				}
			}
			tls`)
	e.start(wrappers, "\treverse_proxy "+u.Addr)
	held := func(what string) {
		t.Helper()
		if c := e.conn(t, "127.0.0.1", ""); c != nil {
			c.Close()
			t.Fatalf("%s: a second connection was served", what)
		}
	}
	free := func(what string) {
		t.Helper()
		waitFor(t, 5*time.Second, "the slot after "+what, func() bool { return slotsHeld(t, e.caddyInstance, "conn_open", "127.0.0.1") == 0 })
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatalf("after %s: refused, the slot was not released", what)
		}
		c.Close()
		waitFor(t, 5*time.Second, "the check connection's slot", func() bool { return slotsHeld(t, e.caddyInstance, "conn_open", "127.0.0.1") == 0 })
	}
	dial := func() net.Conn {
		t.Helper()
		raw, err := net.Dial("tcp", e.tlsAddr)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}

	t.Run("handshake failure", func(t *testing.T) {
		raw := dial()
		defer raw.Close()
		waitFor(t, 5*time.Second, "the slot taken", func() bool { return slotsHeld(t, e.caddyInstance, "conn_open", "127.0.0.1") == 1 })
		held("a client that has not sent its ClientHello")
		fmt.Fprint(raw, "this is not a TLS ClientHello\r\n\r\n")
		free("a failed handshake")
	})
	t.Run("client reset", func(t *testing.T) {
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatal("refused")
		}
		held("an open connection")
		_ = c.NetConn().(*net.TCPConn).SetLinger(0)
		c.NetConn().Close()
		free("the client's RST")
	})
	t.Run("keep-alive connection closed by the client", func(t *testing.T) {
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatal("refused")
		}
		if status, _ := get(t, c, "/fast"); status != 200 {
			t.Fatalf("GET: %d", status)
		}
		held("an idle keep-alive connection")
		c.Close()
		free("the client's close")
	})
	t.Run("hijacked connection", func(t *testing.T) {
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatal("refused")
		}
		defer c.Close()
		fmt.Fprint(c, "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: tally-test\r\n\r\n")
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v, want 101", res, err)
		}
		fmt.Fprint(c, "ping\n")
		if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo through the upgraded connection: %q %v", line, err)
		}
		held("an upgraded connection")
		c.Close()
		free("the upgraded connection's close")
	})
	t.Run("reload", func(t *testing.T) {
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatal("refused")
		}
		defer c.Close()
		if status, _ := get(t, c, "/fast"); status != 200 {
			t.Fatalf("GET: %d", status)
		}
		held("an idle keep-alive connection")
		// The same zone: its state is kept, and the old server's idle
		// connection is closed, which gives its slot back there.
		if status, body := e.loadCaddyfile(e.config(wrappers, "\treverse_proxy "+u.Addr+"\n\theader X-Reloaded yes")); status != http.StatusOK {
			t.Fatalf("reload: %d %s", status, body)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("the old server's idle connection is still open after the reload")
		}
		free("a reload")
	})
}

// A refused connection's rate is given back too: it consumed nothing in the
// rate zone before the concurrency zone that refused it.
func TestConnectionRefusedByOneZoneConsumesNothingInAnother(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 3
					window 1h
				}
				zone conn_open {
					key {remote_ip}
					concurrency 1
				}
			}
			tls`), "\trespond \"ok\"")
	first := e.conn(t, "127.0.0.1", "")
	if first == nil {
		t.Fatal("first connection refused")
	}
	for i := range 5 {
		if c := e.conn(t, "127.0.0.1", ""); c != nil {
			t.Fatalf("connection %d served beside an open one", i+2)
		}
	}
	first.Close()
	for i := range 2 {
		waitFor(t, 5*time.Second, "the slot", func() bool { return slotsHeld(t, e.caddyInstance, "conn_open", "127.0.0.1") == 0 })
		c := e.conn(t, "127.0.0.1", "")
		if c == nil {
			t.Fatalf("connection %d of 3 per hour refused: the refusals consumed the rate", i+2)
		}
		c.Close()
	}
	waitFor(t, 5*time.Second, "the slot", func() bool { return slotsHeld(t, e.caddyInstance, "conn_open", "127.0.0.1") == 0 })
	if c := e.conn(t, "127.0.0.1", ""); c != nil {
		t.Fatal("a fourth connection served at 3 per hour")
	}
}

// deny_while: once an HTTP zone denies 127.0.0.1, its new connections are
// refused until the zone allows it again (here: the key is reset); others
// are served.
func TestDenyWhileRefusesConnectionsWhileTheHTTPZoneDenies(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				deny_while login_ip
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
	for i := range 3 {
		if c := e.conn(t, "127.0.0.1", ""); c != nil {
			t.Fatalf("new connection %d served while login_ip denies 127.0.0.1", i+1)
		}
	}
	for _, other := range []string{"127.0.0.2", "127.0.0.3"} {
		c := e.conn(t, other, "")
		if c == nil {
			t.Fatalf("%s refused", other)
		}
		if status, _ := get(t, c, "/"); status != 200 {
			t.Errorf("%s: %d", other, status)
		}
		c.Close()
	}
	if n := connectionsTotal(t, e.caddyInstance, "login_ip", "denied"); n != 3 {
		t.Errorf("connections_total{zone=login_ip,decision=denied} %v, want 3", n)
	}
	if status, body := e.adminDo(http.MethodDelete, "/rate_limit/zones/login_ip/keys/127.0.0.1"); status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", status, body)
	}
	if c := e.conn(t, "127.0.0.1", ""); c == nil {
		t.Fatal("refused after the zone allows 127.0.0.1 again")
	} else {
		c.Close()
	}
}

// A distributed HTTP zone's denial reaches deny_while through its deny
// cache: refused connections cost Redis nothing.
func TestDenyWhileReadsADistributedZoneWithoutRedis(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				deny_while login_ip
			}
			tls`), `	rate_limit {
		zone login_ip {
			key {remote_host}
			events 1
			window 1h
		}
		distributed {
			redis `+rs.Addr+`
		}
	}
	respond "ok"`)
	c := e.conn(t, "127.0.0.1", "")
	if c == nil {
		t.Fatal("refused before any denial")
	}
	for i, want := range []int{200, 429} {
		if status, _ := get(t, c, "/"); status != want {
			t.Fatalf("request %d: %d, want %d", i+1, status, want)
		}
	}
	c.Close()
	logEveryCommand(t, rs)
	const attempts = 30
	for i := range attempts {
		if c := e.conn(t, "127.0.0.1", ""); c != nil {
			t.Fatalf("connection %d served while login_ip denies", i+1)
		}
	}
	// Heartbeats and override polls are scripts too, about no key.
	if calls := scriptsLogged(t, rs, ":127.0.0.1"); len(calls) > 0 {
		t.Fatalf("%d refused connections cost %d Redis scripts about the key:\n%s", attempts, len(calls), strings.Join(calls, "\n"))
	}
}

// The issue's syntax as written (proxy_protocol, rate_limit with both zones
// and deny_while, tls, for every server), the proxy trusted being loopback:
// the key is the PROXY source, and a client that never sends its header
// delays no one's handshake.
func TestBehindProxyProtocolTheSourceIsTheKeyAndAnIdleClientDelaysNoOne(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(`	servers {
		listener_wrappers {
			proxy_protocol {          # optional; must come before rate_limit
				timeout 10s               # the idle clients stay idle while measured
				allow 127.0.0.0/8
			}
			rate_limit {
				zone conn_rate {
					key {remote_ip}      # the connection's client address
					ipv6_prefix 64
					events 20
					window 1s
					burst 40
				}
				zone conn_open {
					key {remote_ip}
					concurrency 50       # connections open at once per client
				}
				deny_while login_ip      # refuse connections while that HTTP zone denies or bans the key
			}
			tls
		}
	}`, `	rate_limit {
		zone login_ip {
			key {remote_host}
			events 1
			window 1h
		}
	}
	respond "{client_ip}"`)
	// Idle clients: connected, no PROXY header.
	for range 3 {
		raw, err := net.Dial("tcp", e.tlsAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
	}
	var slowest time.Duration
	for i := range 5 {
		src := "203.0.113." + strconv.Itoa(10+i)
		start := time.Now()
		c := e.conn(t, "127.0.0.1", proxyV1(src))
		if c == nil {
			t.Fatalf("%s refused", src)
		}
		slowest = max(slowest, time.Since(start))
		defer c.Close()
		if status, body := get(t, c, "/"); status != 200 || body != src {
			t.Errorf("%s: %d %q, want its address as {client_ip}", src, status, body)
		}
	}
	// Held behind an idle client, a handshake would wait for its 10s timeout.
	if slowest > 2*time.Second {
		t.Errorf("with three idle PROXY clients, the slowest of 5 handshakes took %v, want far less than their 10s timeout", slowest)
	}
	// While they are open, conn_open holds a slot for each source and none
	// for the proxy's address; an IPv6 source is its address as Caddy
	// writes it.
	c := e.conn(t, "127.0.0.1", proxyV1("2001:0db8:0::7"))
	if c == nil {
		t.Fatal("2001:db8::7 refused")
	}
	defer c.Close()
	if status, body := get(t, c, "/"); status != 200 || body != "2001:db8::7" {
		t.Errorf("2001:db8::7: %d %q", status, body)
	}
	for key, want := range map[string]int{"203.0.113.10": 1, "203.0.113.14": 1, "2001:db8::7": 1, "127.0.0.1": 0} {
		if n := slotsHeld(t, e.caddyInstance, "conn_open", key); n != want {
			t.Errorf("conn_open: %s holds %d slots, want %d", key, n, want)
		}
	}
	// login_ip allowed 203.0.113.10 once and now denies it: so does the
	// connection layer, for that source only.
	if c := e.conn(t, "127.0.0.1", proxyV1("203.0.113.10")); c != nil {
		if status, _ := get(t, c, "/"); status != 429 {
			t.Fatalf("second request of 203.0.113.10: %d, want 429", status)
		}
		c.Close()
	}
	// The first request denied by login_ip set the key's denial; the next
	// connection from that source is refused, another source's served.
	if c := e.conn(t, "127.0.0.1", proxyV1("203.0.113.10")); c != nil {
		t.Fatal("203.0.113.10 served while login_ip denies it")
	}
	if c := e.conn(t, "127.0.0.1", proxyV1("203.0.113.99")); c == nil {
		t.Fatal("203.0.113.99 refused")
	} else {
		c.Close()
	}
}

// Behind proxy_protocol each source has its own limit, whatever the socket's
// peer: 3 per hour for 198.51.100.1, 3 for the /64 of 2001:db8:: (::1 and
// ::2 share it), none of it for 127.0.0.1, the proxy.
func TestBehindProxyProtocolEachSourceHasItsOwnLimit(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			proxy_protocol {
				allow 127.0.0.0/8
			}
			rate_limit {
				zone conn_rate {
					key {remote_ip}
					ipv6_prefix 64
					events 3
					window 1h
				}
			}
			tls`), "\trespond \"{client_ip}\"")
	served := func(src string) bool {
		c := e.conn(t, "127.0.0.1", proxyV1(src))
		if c == nil {
			return false
		}
		c.Close()
		return true
	}
	for _, tc := range []struct {
		src  string
		want bool
	}{
		{"198.51.100.1", true}, {"198.51.100.1", true}, {"198.51.100.1", true}, {"198.51.100.1", false},
		{"198.51.100.2", true},
		{"2001:db8::1", true}, {"2001:db8::2", true}, {"2001:db8::1", true}, {"2001:db8::2", false},
		{"2001:db8:0:1::1", true},
	} {
		if got := served(tc.src); got != tc.want {
			t.Fatalf("%s: served %v, want %v", tc.src, got, tc.want)
		}
	}
}

// Placed where it would see TLS connections, or after proxy_protocol's
// place, the wrapper is a config error that says what to do.
func TestMisplacedRateLimitWrapperIsAConfigError(t *testing.T) {
	t.Parallel()
	const zone = `			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 5
					window 10s
				}
			}`
	for _, tc := range []struct {
		name, wrappers, want string
	}{
		{"after tls", "\t\t\tproxy_protocol\n\t\t\ttls\n" + zone, "listener wrapper rate_limit must come before tls in listener_wrappers"},
		{"tls left out", zone, "listener wrapper rate_limit needs tls listed after it"},
		{"before proxy_protocol", zone + "\n\t\t\tproxy_protocol\n\t\t\ttls", "proxy_protocol must come before rate_limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEdge(t)
			err := e.startProcess(e.config(e.wrappersOnTLS(tc.wrappers), "\trespond \"ok\""), "caddyfile")
			if err == nil {
				t.Fatal("Caddy accepted the config")
			}
			if !strings.Contains(unescapeJSON(err.Error()), tc.want) {
				t.Fatalf("error does not say %q:\n%v", tc.want, err)
			}
		})
	}
}

// A connection zone's state survives a reload as an HTTP zone's does; a
// zone name an HTTP zone has with other limits is refused.
func TestConnectionZoneStateSurvivesAReloadAndItsNameIsClaimed(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	wrappers := e.wrappersOnTLS(`			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 4
					window 1h
				}
			}
			tls`)
	e.start(wrappers, "\trespond \"ok\"")
	for i := range 3 {
		if c := e.conn(t, "127.0.0.1", ""); c == nil {
			t.Fatalf("connection %d refused", i+1)
		} else {
			c.Close()
		}
	}
	if status, body := e.loadCaddyfile(e.config(wrappers, "\trespond \"reloaded\"")); status != http.StatusOK {
		t.Fatalf("reload: %d %s", status, body)
	}
	// The key kept its state: 1 of 4 left. On Linux the new config listens
	// on a socket of its own beside the old one (SO_REUSEPORT), and a
	// connection queued on the old one as it closes is reset before any
	// wrapper sees it: a reset that left the key its connection is retried.
	left := func() int64 {
		var k adminKey
		e.adminJSON(keyPath("conn_rate", "127.0.0.1"), &k)
		return k.Remaining
	}
	if n := left(); n != 1 {
		t.Fatalf("after the reload 127.0.0.1 has %d connections left, want 1 (4 per hour, 3 used): the reload forgot the zone's state", n)
	}
	c := e.conn(t, "127.0.0.1", "")
	for try := 0; c == nil && try < 3 && left() == 1; try++ {
		c = e.conn(t, "127.0.0.1", "")
	}
	if c == nil {
		t.Fatal("the fourth connection refused after the reload")
	}
	if _, body := get(t, c, "/"); body != "reloaded" {
		t.Errorf("served %q by the old config", body)
	}
	c.Close()
	if c := e.conn(t, "127.0.0.1", ""); c != nil {
		t.Fatal("a fifth connection served at 4 per hour: the reload forgot the zone's state")
	}

	status, body := e.loadCaddyfile(e.config(wrappers, `	rate_limit {
		zone conn_rate {
			key {client_ip}
			events 100
			window 1m
		}
	}
	respond "ok"`))
	if status == http.StatusOK || !strings.Contains(unescapeJSON(body), "zone conn_rate is both a connection zone (listener_wrappers rate_limit) and an HTTP zone, with other limits") {
		t.Fatalf("a handler zone named as the connection zone, with other limits: %d %s", status, body)
	}
	for _, tc := range []struct{ deny, want string }{
		{"nope", "deny_while nope: no rate_limit handler of this config has a zone nope"},
		{"conn_rate", "deny_while conn_rate: conn_rate is a zone of this listener wrapper"},
		{"by_key", "deny_while by_key: zone by_key is keyed by {http.request.header.X-Api-Key}, which a connection does not carry"},
		{"slots", "deny_while slots: slots is a concurrency zone"},
		// behind trusted_proxies a client could spend the proxy's key
		{"by_ip", "would get every client behind it reset): key zone by_ip by {remote_host}"},
	} {
		status, body := e.loadCaddyfile(e.config(e.wrappersOnTLS(`			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 4
					window 1h
				}
				deny_while `+tc.deny+`
			}
			tls`), `	rate_limit {
		zone by_key {
			key {http.request.header.X-Api-Key}
			events 1
			window 1m
		}
		zone slots {
			key {client_ip}
			concurrency 2
		}
		zone by_ip {
			key {client_ip}
			events 1
			window 1m
		}
	}
	respond "ok"`))
		if status == http.StatusOK || !strings.Contains(unescapeJSON(body), tc.want) {
			t.Errorf("deny_while %s: %d %s", tc.deny, status, body)
		}
	}
}

// Many clients open and close TLS connections at once against a concurrency
// and a rate zone: no client ever has more served at once than its
// concurrency, every slot comes back, and the race-built Caddy finds no
// race.
func TestConnectionZonesUnderConcurrentClients(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	e.start(e.wrappersOnTLS(`			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 1000
					window 1s
				}
				zone conn_open {
					key {remote_ip}
					concurrency 3
				}
			}
			tls`), "\trespond \"ok\"")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sources := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	type result struct{ served, most int }
	results := make(chan result, len(sources))
	for _, src := range sources {
		go func() {
			var (
				mu                 sync.Mutex
				open, most, served int
				wg                 sync.WaitGroup
			)
			const workers, each = 6, 10
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						if ctx.Err() != nil {
							return
						}
						c, err := e.try(src, "")
						if err != nil {
							continue
						}
						mu.Lock()
						open++
						served++
						most = max(most, open)
						mu.Unlock()
						time.Sleep(2 * time.Millisecond)
						mu.Lock()
						open--
						mu.Unlock()
						c.Close()
					}
				}()
			}
			wg.Wait()
			results <- result{served, most}
		}()
	}
	for range sources {
		r := <-results
		if r.most > 3 {
			t.Errorf("a client had %d connections served at once with concurrency 3", r.most)
		}
		if r.served == 0 {
			t.Error("a client had no connection served")
		}
	}
	for _, src := range sources {
		waitFor(t, 10*time.Second, "every slot of "+src, func() bool { return slotsHeld(t, e.caddyInstance, "conn_open", src) == 0 })
	}
}
