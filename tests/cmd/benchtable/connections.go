package main

// The connection layer (caddy.listeners.rate_limit): one Caddy with three
// TLS sites on their own ports, the same certificate and response on each:
//
//	plain    no listener wrapper
//	wrapped  rate_limit with a rate and a concurrency zone no client reaches
//	         (every connection allowed, each holding a slot)
//	edge     rate_limit at 50 new connections/s per address, burst 50
//
// A connection is what a browser's first visit costs: a full TLS 1.3
// handshake (no resumption), one GET and the close. Clients skip certificate
// verification, so that less of the shared cores goes to them.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var connectionScenarios = []scenario{
	{
		name:       "conn-allowed",
		metric:     "New TLS connections (handshake, one GET, close), listener wrapper `rate_limit` with a rate and a concurrency zone, every connection allowed (ratio to the same site without the wrapper)",
		standalone: measureConnectionsAllowed,
		target:     0.97,
		targetText: "≥ 0.97 by Caddy CPU per connection",
	},
	{
		name:       "conn-refused-cpu",
		metric:     "Caddy CPU of a connection the wrapper refuses (reset before its ClientHello is read) vs of an accepted TLS handshake",
		standalone: measureRefusedCPU,
		target:     10,
		targetText: "refused ≥ 10× cheaper",
	},
	{
		name:       "conn-flood",
		metric:     "New TLS connections/s 8 other clients get while one address floods ClientHellos (32 connections at a time), with the wrapper (50/s per address) vs without",
		standalone: measureFloodVictims,
		targetText: "report (more with the wrapper)",
	},
}

func init() { scenarios = append(scenarios, connectionScenarios...) }

// edgeCaddy is the Caddy of these scenarios and its three TLS addresses.
type edgeCaddy struct {
	*caddyProcess
	plain, wrapped, edge string
}

func startEdgeCaddy(bin, dir string) (*edgeCaddy, error) {
	cert, key, err := writeLoopbackCert(dir)
	if err != nil {
		return nil, err
	}
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	ec := &edgeCaddy{plain: addrs[0], wrapped: addrs[1], edge: addrs[2]}
	ec.caddyProcess, err = startCaddyFile(bin, dir, func(addr, adminAddr, runtimeLog string) string {
		site := func(a string) string {
			return fmt.Sprintf("https://%s {\n\ttls %s %s\n\trespond \"ok\"\n}\n", a, cert, key)
		}
		// default_bind makes each server's address 127.0.0.1:port, the
		// servers options' addresses.
		return fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	auto_https off
	persist_config off
	log {
		output file %s
	}
	servers %s {
		protocols h1 h2
		listener_wrappers {
			rate_limit {
				zone conn_rate {
					key {remote_ip}
					events 1000000
					window 1s
				}
				zone conn_open {
					key {remote_ip}
					concurrency 100000
				}
			}
			tls
		}
	}
	servers %s {
		protocols h1 h2
		listener_wrappers {
			rate_limit {
				zone edge_rate {
					key {remote_ip}
					events 50
					window 1s
				}
			}
			tls
		}
	}
	servers %s {
		protocols h1 h2
	}
}

http://%s {
	respond "ok"
}

%s
%s
%s`, adminAddr, runtimeLog, ec.wrapped, ec.edge, ec.plain, addr, site(ec.plain), site(ec.wrapped), site(ec.edge))
	})
	return ec, err
}

// writeLoopbackCert writes a self-signed ECDSA P-256 certificate for
// 127.0.0.1 and its key into dir.
func writeLoopbackCert(dir string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "benchtable"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
}

// connLoad is a run of new connections: workers goroutines, each opening
// one connection after the other from its sources (round robin), for runFor
// and at most maxConns connections in all.
type connLoad struct {
	addr     string
	sources  []string // loopback addresses to connect from
	workers  int
	runFor   time.Duration
	maxConns int64
	get      bool // send a GET after the handshake and read the response
	// hello, when set, is a ClientHello recorded once: the connection
	// writes it, reads the server's first flight (by then the server has
	// made its key share and signed) and closes, as a flood does that
	// spends nothing on handshakes of its own.
	hello []byte
}

// connResult counts a run's connections.
type connResult struct {
	served, refused int64 // handshake done (and response read) / reset
	failed          int64 // anything else (a timeout, an EOF)
	elapsed         time.Duration
}

var tlsClient = &tls.Config{InsecureSkipVerify: true, ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}}

func (l connLoad) run(stop *atomic.Bool) connResult {
	var (
		res    connResult
		issued atomic.Int64
		wg     sync.WaitGroup
		served atomic.Int64
		reset  atomic.Int64
		failed atomic.Int64
	)
	start := time.Now()
	deadline := start.Add(l.runFor)
	for w := range l.workers {
		wg.Go(func() {
			for i := w; time.Now().Before(deadline) && (stop == nil || !stop.Load()); i += l.workers {
				if issued.Add(1) > l.maxConns {
					return
				}
				switch err := l.one(l.sources[i%len(l.sources)]); {
				case err == nil:
					served.Add(1)
				case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
					reset.Add(1)
				default:
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	res.served, res.refused, res.failed = served.Load(), reset.Load(), failed.Load()
	res.elapsed = time.Since(start)
	return res
}

// one opens a connection from src: handshake, then (with get) one request
// whose response it reads to the server's close.
func (l connLoad) one(src string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	raw, err := d.Dial("tcp", l.addr)
	if err != nil {
		return err
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	if l.hello != nil {
		if _, err := raw.Write(l.hello); err != nil {
			return err
		}
		_, err := raw.Read(make([]byte, 1))
		return err
	}
	c := tls.Client(raw, tlsClient)
	if err := c.Handshake(); err != nil {
		return err
	}
	if !l.get {
		return nil
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	b, err := io.ReadAll(c)
	if err != nil && len(b) == 0 {
		return err
	}
	if len(b) < 12 || string(b[9:12]) != "200" {
		return fmt.Errorf("response %q", b)
	}
	return nil
}

// recordClientHello returns the first flight of a tlsClient handshake.
func recordClientHello() ([]byte, error) {
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		_ = tls.Client(client, tlsClient).Handshake()
		client.Close()
	}()
	buf := make([]byte, 16<<10)
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := server.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// loopbackSources returns n loopback addresses 127.0.<third>.1 … .n.
func loopbackSources(third, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "127.0." + strconv.Itoa(third) + "." + strconv.Itoa(i+1)
	}
	return out
}

// measuredRun runs l on c and returns its result and the CPU Caddy used.
func measuredRun(c *caddyProcess, l connLoad) (connResult, time.Duration, error) {
	cpu0, err := c.cpuTime()
	if err != nil {
		return connResult{}, 0, err
	}
	r := l.run(nil)
	cpu1, err := c.cpuTime()
	if err != nil {
		return connResult{}, 0, err
	}
	return r, cpu1 - cpu0, nil
}

// measureConnectionsAllowed alternates runs against the plain and the
// wrapped site: new connections per second and Caddy CPU per connection,
// medians of the rounds' ratios.
func measureConnectionsAllowed(o options, e *env, bin string) (customResult, error) {
	ec, err := startEdgeCaddy(bin, e.dir)
	if err != nil {
		return customResult{}, err
	}
	defer ec.stop()
	sources := loopbackSources(1, 64)
	mk := func(addr string, d time.Duration) connLoad {
		return connLoad{addr: addr, sources: sources, workers: 8, runFor: d, maxConns: o.maxRequests, get: true}
	}
	for _, a := range []string{ec.plain, ec.wrapped} { // warm up
		if r := mk(a, time.Second/2).run(nil); r.served == 0 {
			return customResult{}, fmt.Errorf("warming %s: no connection served (%+v)", a, r)
		}
	}
	var cpuRatios, rateRatios []float64
	var cpuPer [2]time.Duration
	var conns [2]int64
	rounds := max(o.rounds, minCPURounds)
	for round := range rounds {
		var rate [2]float64
		var per [2]time.Duration
		for i, a := range []string{ec.plain, ec.wrapped} {
			r, cpu, err := measuredRun(ec.caddyProcess, mk(a, o.runFor))
			if err != nil {
				return customResult{}, err
			}
			if r.refused+r.failed > 0 || r.served == 0 {
				return customResult{}, fmt.Errorf("%s: %d served, %d refused, %d failed: want every connection served", a, r.served, r.refused, r.failed)
			}
			rate[i] = float64(r.served) / r.elapsed.Seconds()
			per[i] = cpu / time.Duration(r.served)
			cpuPer[i] += cpu
			conns[i] += r.served
		}
		cpuRatios = append(cpuRatios, float64(per[0])/float64(per[1]))
		rateRatios = append(rateRatios, rate[1]/rate[0])
		progressf("  conn-allowed round %d: plain %.0f conn/s (%v CPU each), wrapped %.0f conn/s (%v CPU each)", round+1, rate[0], per[0], rate[1], per[1])
	}
	cpuRatio, rateRatio := median(cpuRatios), median(rateRatios)
	met := cpuRatio >= 0.97
	return customResult{
		value: cpuRatio,
		met:   &met,
		text: fmt.Sprintf("**%.2f** by Caddy CPU per connection (median of %d rounds, spread %s; %.0f vs %.0f µs over all rounds); throughput %.2f",
			cpuRatio, rounds, spread(cpuRatios), float64(cpuPer[1]/time.Duration(conns[1]))/1e3, float64(cpuPer[0]/time.Duration(conns[0]))/1e3, rateRatio),
	}, nil
}

// measureRefusedCPU compares Caddy's CPU per accepted handshake (no GET: the
// handshake alone) on the plain site with its CPU per refused connection on
// the edge site, from an address that spent its budget: the client writes
// its ClientHello and gets the reset.
func measureRefusedCPU(o options, e *env, bin string) (customResult, error) {
	ec, err := startEdgeCaddy(bin, e.dir)
	if err != nil {
		return customResult{}, err
	}
	defer ec.stop()
	hello, err := recordClientHello()
	if err != nil {
		return customResult{}, err
	}
	accepted := connLoad{addr: ec.plain, sources: loopbackSources(1, 64), workers: 8, maxConns: o.maxRequests}
	refused := connLoad{addr: ec.edge, sources: []string{"127.0.2.1"}, workers: 8, maxConns: o.maxRequests, hello: hello}
	var ratios []float64
	var perAccepted, perRefused []float64
	for round := range o.rounds {
		accepted.runFor, refused.runFor = o.runFor, o.runFor
		a, cpuA, err := measuredRun(ec.caddyProcess, accepted)
		if err != nil {
			return customResult{}, err
		}
		r, cpuR, err := measuredRun(ec.caddyProcess, refused)
		if err != nil {
			return customResult{}, err
		}
		if a.served == 0 || r.refused == 0 {
			return customResult{}, fmt.Errorf("round %d: %d handshakes served, %d connections refused", round+1, a.served, r.refused)
		}
		// The flooder's 50 a second allowed get the server's half of a
		// handshake: their CPU, counted at a whole one's, is not a
		// refusal's.
		refusedCPU := cpuR - time.Duration(float64(cpuA)/float64(a.served)*float64(r.served))
		pa := float64(cpuA) / float64(a.served)
		pr := float64(refusedCPU) / float64(r.refused)
		perAccepted, perRefused = append(perAccepted, pa), append(perRefused, pr)
		ratios = append(ratios, pa/pr)
		progressf("  conn-refused-cpu round %d: accepted %.0f/s at %.0f µs CPU each; refused %.0f/s (and %d served) at %.1f µs each", round+1,
			float64(a.served)/a.elapsed.Seconds(), pa/1e3, float64(r.refused)/r.elapsed.Seconds(), r.served, pr/1e3)
	}
	ratio := median(ratios)
	met := ratio >= 10
	return customResult{
		value: ratio,
		met:   &met,
		text: fmt.Sprintf("**%.0f×** cheaper (%.1f µs per refused connection vs %.0f µs per handshake, medians of %d rounds; spread %s)",
			ratio, median(perRefused)/1e3, median(perAccepted)/1e3, o.rounds, spread(ratios)),
	}, nil
}

// measureFloodVictims runs, against the plain and then the edge site, a
// flood from one address (32 workers opening connections back to back)
// beside 8 other clients (64 addresses) opening theirs, and reports the
// connections per second the other clients got.
func measureFloodVictims(o options, e *env, bin string) (customResult, error) {
	ec, err := startEdgeCaddy(bin, e.dir)
	if err != nil {
		return customResult{}, err
	}
	defer ec.stop()
	hello, err := recordClientHello()
	if err != nil {
		return customResult{}, err
	}
	run := func(addr string) (victims, floodServed, floodRefused float64, err error) {
		flood := connLoad{addr: addr, sources: []string{"127.0.3.1"}, workers: 32, runFor: o.runFor, maxConns: 10 * o.maxRequests, hello: hello}
		victim := connLoad{addr: addr, sources: loopbackSources(4, 64), workers: 8, runFor: o.runFor, maxConns: o.maxRequests, get: true}
		var stop atomic.Bool
		var fr connResult
		done := make(chan struct{})
		go func() {
			fr = flood.run(&stop)
			close(done)
		}()
		time.Sleep(200 * time.Millisecond) // the flood is under way
		vr := victim.run(nil)
		stop.Store(true)
		<-done
		if vr.served == 0 {
			return 0, 0, 0, fmt.Errorf("%s: the other clients got no connection (%+v)", addr, vr)
		}
		return float64(vr.served) / vr.elapsed.Seconds(), float64(fr.served) / fr.elapsed.Seconds(), float64(fr.refused) / fr.elapsed.Seconds(), nil
	}
	var with, without, ratios, alone []float64
	var floodWith, floodWithout []float64
	for round := range o.rounds {
		quiet := connLoad{addr: ec.plain, sources: loopbackSources(4, 64), workers: 8, runFor: o.runFor, maxConns: o.maxRequests, get: true}.run(nil)
		alone = append(alone, float64(quiet.served)/quiet.elapsed.Seconds())
		w0, fs0, _, err := run(ec.plain)
		if err != nil {
			return customResult{}, err
		}
		w1, fs1, fr1, err := run(ec.edge)
		if err != nil {
			return customResult{}, err
		}
		without, with, ratios = append(without, w0), append(with, w1), append(ratios, w1/w0)
		floodWithout, floodWith = append(floodWithout, fs0), append(floodWith, fs1)
		progressf("  conn-flood round %d: others %.0f conn/s with no flood, %.0f without the wrapper (flood served %.0f/s), %.0f with it (flood served %.0f/s, refused %.0f/s)",
			round+1, alone[round], w0, fs0, w1, fs1, fr1)
	}
	ratio := median(ratios)
	met := ratio > 1
	return customResult{
		value: ratio,
		met:   &met,
		text: fmt.Sprintf("**%.0f** vs %.0f connections/s, %.0f with no flood (medians of %d rounds; ratio per round: median **%.1f×**, spread %s); the flood itself got %.0f vs %.0f handshakes/s; its client shares the 2 cores",
			median(with), median(without), median(alone), o.rounds, ratio, spread(ratios), median(floodWith), median(floodWithout)),
	}, nil
}
