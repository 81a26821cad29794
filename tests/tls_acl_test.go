package tests

// TLS and ACLs against a real redis-server: rediss:// with certificates the
// test generates (a CA, a server certificate, a client certificate for
// tls-auth-clients), and an ACL user with only what tally needs. What is
// wrong (the CA, an expired certificate, a missing client certificate, a
// command the user lacks) is one clear WARN line when the breaker opens,
// then the fail policy: never a line per request.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// testPKI is a CA and certificates it signed, as PEM files in dir.
type testPKI struct {
	dir    string
	caKey  *ecdsa.PrivateKey
	caCert *x509.Certificate
	CAFile string
	serial int64
	t      *testing.T
}

func newTestPKI(t *testing.T, name string) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), t: t}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p.caKey = key
	p.caCert, _ = x509.ParseCertificate(der)
	p.CAFile = p.write(name+"-ca.pem", "CERTIFICATE", der)
	p.serial = 1
	return p
}

func (p *testPKI) write(name, typ string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// issue signs a certificate for 127.0.0.1 (server and client use), valid
// until notAfter, and returns its certificate and key files.
func (p *testPKI) issue(name string, notAfter time.Time) (certFile, keyFile string) {
	p.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-48 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return p.write(name+".pem", "CERTIFICATE", der), p.write(name+"-key.pem", "EC PRIVATE KEY", kder)
}

// startTLSRedis starts a redis-server that speaks only TLS, with the given
// server certificate, trusting pki's CA for client certificates (required
// when authClients). It returns the rediss:// address.
func startTLSRedis(t *testing.T, pki *testPKI, certFile, keyFile string, authClients bool, extra ...string) (addr string, srv *redisServer) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed: run `make test`, which installs it: %v", err)
	}
	port := freePort(t)
	auth := "no"
	if authClients {
		auth = "yes"
	}
	dir := t.TempDir()
	srv = &redisServer{t: t, Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
	srv.args = append([]string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", pki.CAFile,
		"--tls-auth-clients", auth, "--save", "", "--appendonly", "no", "--dir", dir}, extra...)
	cmd := exec.Command("redis-server", srv.args...)
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	srv.cmd = cmd
	t.Cleanup(srv.Kill)
	// Ready when a TLS client (with a client certificate when required)
	// gets PONG; it does not check the server's certificate, which some
	// tests make expired on purpose.
	cfg := &tls.Config{InsecureSkipVerify: true}
	if authClients {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, TLSConfig: cfg})
	defer c.Close()
	waitFor(t, 10*time.Second, "TLS redis-server to answer PING", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
	return "rediss://" + srv.Addr, srv
}

func TestTLSRedisWithTheRightCAAndClientCertificateIsExact(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t, "tally-test")
	serverCert, serverKey := pki.issue("redis", time.Now().Add(24*time.Hour))
	clientCert, clientKey := pki.issue("tally", time.Now().Add(24*time.Hour))
	addr, _ := startTLSRedis(t, pki, serverCert, serverKey, true)
	s := openStore(t, distributed.Options{Addresses: []string{addr}, Timeout: 2 * time.Second,
		TLSCAFile: pki.CAFile, TLSCertFile: clientCert, TLSKeyFile: clientKey}, nil)
	limit := algorithms.NewLimit(5, int64(time.Hour), 0)
	allowed := 0
	for range 8 {
		r, err := stepDecide(s, context.Background(), "tls", "k", limit, 1)
		if err != nil {
			t.Fatalf("Decide over TLS: %v", err)
		}
		if r.Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("8 decisions at 5 per hour over TLS: %d allowed, want 5", allowed)
	}
}

// Each misconfiguration fails the first call with an error that names it,
// opens the breaker with one WARN line that carries it, and then costs
// nothing (ErrUnavailable, the fail policy) until a probe.
func TestTLSAndACLMistakesAreOneClearErrorThenTheFailPolicy(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t, "tally-test")
	serverCert, serverKey := pki.issue("redis", time.Now().Add(24*time.Hour))
	expiredCert, expiredKey := pki.issue("redis-expired", time.Now().Add(-time.Hour))
	clientCert, clientKey := pki.issue("tally", time.Now().Add(24*time.Hour))
	otherCA := newTestPKI(t, "someone-else")

	good, _ := startTLSRedis(t, pki, serverCert, serverKey, true)
	expired, _ := startTLSRedis(t, pki, expiredCert, expiredKey, false)

	plain := startRedis(t)
	ctx := context.Background()
	rc := plain.Client()
	// tally's user without SET: strict decisions cannot write.
	if err := rc.Do(ctx, anySlice(strings.Fields("ACL SETUSER noset on >pw ~tally:* &tally:resets +evalsha +eval +get +del +pexpire +time +zadd +zrem +zremrangebyscore +zcard +publish +subscribe +ping"))...).Err(); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		opts distributed.Options
		// in the first error (when not empty) and in the WARN line
		wantErr, want string
	}{
		{"wrong CA", distributed.Options{Addresses: []string{good}, TLSCAFile: otherCA.CAFile, TLSCertFile: clientCert, TLSKeyFile: clientKey}, "unknown authority", "unknown authority"},
		{"expired server certificate", distributed.Options{Addresses: []string{expired}, TLSCAFile: pki.CAFile}, "expired", "expired"},
		// TLS 1.3: Redis closes the connection after the handshake, which
		// the client reads as a reset; the WARN line names the likely fix.
		{"no client certificate", distributed.Options{Addresses: []string{good}, TLSCAFile: pki.CAFile}, "", "tls_client"},
		{"ACL user missing SET", distributed.Options{Addresses: []string{"redis://noset:pw@" + plain.Addr}}, "can't run this command", "can't run this command"},
	} {
		t.Run(c.name, func(t *testing.T) {
			logger, logs := observedLogger()
			c.opts.Timeout = time.Second
			s := openStore(t, c.opts, logger)
			limit := algorithms.NewLimit(5, int64(time.Hour), 0)
			_, err := stepDecide(s, ctx, "z", "k", limit, 1)
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("first Decide: %v, want an error about %q", err, c.wantErr)
			}
			var calls int
			for calls = 1; calls < 50; calls++ {
				if _, err = stepDecide(s, ctx, "z", "k", limit, 1); errors.Is(err, distributed.ErrUnavailable) {
					break
				}
			}
			if !errors.Is(err, distributed.ErrUnavailable) {
				t.Fatalf("after %d failed calls the breaker is still closed: %v", calls, err)
			}
			for range 100 {
				if _, err := stepDecide(s, ctx, "z", "k", limit, 1); !errors.Is(err, distributed.ErrUnavailable) {
					t.Fatalf("with the breaker open: %v, want ErrUnavailable (the fail policy, no call)", err)
				}
			}
			warns := logs.FilterLevelExact(zapcore.WarnLevel)
			if n := warns.Len(); n != 1 {
				t.Fatalf("%d WARN lines for %d failing decisions, want 1; the store logged:\n%s", n, calls+100, logText(logs))
			}
			if line := warnText(warns); !strings.Contains(line, c.want) {
				t.Errorf("the WARN line %q does not say %q", line, c.want)
			}
		})
	}
}

// logText is every line logs holds, one per line, for a failure message.
func logText(logs *observer.ObservedLogs) string {
	var b strings.Builder
	for _, e := range logs.All() {
		b.WriteString(e.Level.String() + " " + e.Message)
		for k, v := range e.ContextMap() {
			b.WriteString(" " + k + "=" + fmt.Sprint(v))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func warnText(logs *observer.ObservedLogs) string {
	var b strings.Builder
	for _, e := range logs.All() {
		b.WriteString(e.Message)
		for k, v := range e.ContextMap() {
			b.WriteString(" " + k + "=")
			if s, ok := v.(string); ok {
				b.WriteString(s)
			}
		}
	}
	return b.String()
}

// leastPrivilegeACL is docs/distributed.md's ACL line for tally's user, with the
// default key_prefix: the commands tally's scripts and calls use, its keys
// and its reset channel, nothing else.
const leastPrivilegeACL = "on >tally-secret resetchannels &tally:resets resetkeys ~tally:* -@all +evalsha +eval +get +set +del +pexpire +hget +hmget +hset +hlen +pttl +time +zadd +zrem +zremrangebyscore +zcard +zrange +zscore +publish +subscribe +ping"

// Everything tally does, in both modes, works as the least-privilege user:
// decisions, refunds, peeks, resets (with their pub/sub), heartbeats and
// async syncs.
func TestLeastPrivilegeACLUserCanDoEverythingTallyDoes(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	ctx := context.Background()
	if err := srv.Client().Do(ctx, append([]any{"ACL", "SETUSER", "tally"}, anySlice(strings.Fields(leastPrivilegeACL))...)...).Err(); err != nil {
		t.Fatal(err)
	}
	logger, logs := observedLogger()
	url := "redis://tally:tally-secret@" + srv.Addr
	s := openStore(t, distributed.Options{Addresses: []string{url}, Timeout: 2 * time.Second}, logger)
	limit := algorithms.NewLimit(3, int64(time.Hour), 0)
	for i := range 4 {
		r, err := stepDecide(s, ctx, "acl", "k", limit, 1)
		if err != nil || r.Allowed != (i < 3) {
			t.Fatalf("strict decision %d as the ACL user: %+v, %v", i, r, err)
		}
	}
	if err := stepRefund(s, ctx, "acl", "k", limit, 1); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if _, err := stepPeek(s, ctx, "acl", "k", limit); err != nil {
		t.Fatalf("Peek: %v", err)
	}
	if n, err := s.Heartbeat(ctx); err != nil || n != 1 {
		t.Fatalf("Heartbeat: %d, %v", n, err)
	}
	if err := stepReset(s, ctx, "acl", "k"); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	id, inUse, err := s.Acquire(ctx, "slots", "k", 2, time.Minute)
	if err != nil || id == "" || inUse != 1 {
		t.Fatalf("a concurrency slot as the ACL user: id %q, %d in use, %v", id, inUse, err)
	}
	s.Release("slots", "k", id)

	a, err := distributed.OpenAsync(distributed.Options{Addresses: []string{url}, Mode: "async",
		SyncInterval: 50 * time.Millisecond, Timeout: 2 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if _, err := stepDecide(a, ctx, "acl", "k", limit, 1); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	waitFor(t, 5*time.Second, "an async sync as the ACL user", func() bool { return a.LastSync().After(after) })
	if _, err := stepPeek(a, ctx, "acl", "k", limit); err != nil {
		t.Fatalf("async Peek: %v", err)
	}
	if err := stepReset(a, ctx, "acl", "k"); err != nil {
		t.Fatalf("async Reset: %v", err)
	}
	if logs.FilterLevelExact(zapcore.WarnLevel).Len() > 0 || logs.FilterMessageSnippet("NOPERM").Len() > 0 {
		t.Fatalf("the ACL user hit an error: %v", logs.All())
	}
	if ok, _ := s.Health(); !ok {
		t.Fatal("store unhealthy as the ACL user")
	}
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
