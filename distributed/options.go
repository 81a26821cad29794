package distributed

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults applied by Open to zero fields of Options.
const (
	// DefaultTimeout is twice the worst strict decision beside a CPU hog on
	// 2 cores (BenchmarkStrictDecide, 16 callers: p99.9 25ms, max 26ms);
	// 20ms sent 1 in 40 idle decisions and a third of a flood's to the fail
	// policy.
	DefaultTimeout      = 50 * time.Millisecond
	DefaultKeyPrefix    = "tally:"
	DefaultSyncInterval = 100 * time.Millisecond
)

// Options says which Redis to use and how long to wait for it.
//
// One address is a standalone server, several the seed nodes of a Cluster;
// with SentinelMaster, Sentinels watching that master. An address is
// host:port or a redis:// or rediss:// (TLS) URL, which may carry the
// username, password and database (redis://user:pass@host:6379/2); the URLs
// must agree, and Username, Password and DB, when set, override them. With
// Sentinel, the credentials are the master's.
type Options struct {
	Addresses      []string
	Username       string
	Password       string
	DB             int
	SentinelMaster string
	TLS            bool
	// TLSCAFile is a PEM file of the CAs that sign Redis's certificate
	// (default: the system's roots). Implies TLS.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a client certificate and its key,
	// for a Redis with tls-auth-clients. They imply TLS.
	TLSCertFile, TLSKeyFile string
	// Timeout bounds every store call, queueing included (default 50ms).
	Timeout time.Duration
	// KeyPrefix starts every Redis key the store writes (default "tally:").
	KeyPrefix string
	// Mode is "strict" (default; Open) or "async" (OpenAsync).
	Mode string
	// Instance names this instance in the heartbeat set. Default: one
	// random name per process, shared by all its stores, so that a process
	// counts once however many handlers and reloads it has (tests that play
	// several instances in one process give each its own).
	Instance string
	// SyncInterval is how often an async store reconciles with Redis
	// (default 100ms; ignored in strict mode).
	SyncInterval time.Duration
}

// withDefaults returns o with its zero fields defaulted.
func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	o.KeyPrefix = cmp.Or(o.KeyPrefix, DefaultKeyPrefix)
	o.Mode = cmp.Or(o.Mode, "strict")
	if o.SyncInterval <= 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	return o
}

// Key identifies the setting: Options with one Key share a store (through a
// caddy.UsagePool). It contains the password: never log it; log Redacted.
func (o Options) Key() string { return fmt.Sprintf("%#v", o.withDefaults()) }

// Redacted describes the setting without any password, for logs and errors.
func (o Options) Redacted() string {
	addrs := make([]string, len(o.Addresses))
	for i, a := range o.Addresses {
		addrs[i] = redactAddress(a)
	}
	s := strings.Join(addrs, ",")
	if o.SentinelMaster != "" {
		s = "sentinel " + o.SentinelMaster + "@" + s
	} else if len(addrs) > 1 {
		s = "cluster " + s
	}
	if o.Username != "" {
		s += " user=" + o.Username
	}
	if o.DB != 0 {
		s += " db=" + strconv.Itoa(o.DB)
	}
	if o.tlsOn() {
		s += " tls"
	}
	return s
}

// tlsOn reports whether the TLS fields ask for TLS (a rediss:// URL also does).
func (o Options) tlsOn() bool {
	return o.TLS || o.TLSCAFile != "" || o.TLSCertFile != "" || o.TLSKeyFile != ""
}

// redactAddress replaces a URL's userinfo with "***" on the raw string, so
// that even a URL that does not parse is redacted.
func redactAddress(a string) string {
	scheme, rest, ok := strings.Cut(a, "://")
	if !ok {
		return a
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return scheme + "://***@" + rest[at+1:]
	}
	return a
}

// universalOptions translates o (defaulted) into go-redis options: no
// retries (the breaker and fail policy handle failures), context deadlines
// honoured, RESP2 without CLIENT SETINFO (one round trip to connect beyond
// AUTH/SELECT).
func (o Options) universalOptions() (*redis.UniversalOptions, error) {
	if len(o.Addresses) == 0 {
		return nil, errors.New("distributed: no Redis address")
	}
	u := &redis.UniversalOptions{
		Username:        o.Username,
		Password:        o.Password,
		DB:              o.DB,
		MasterName:      o.SentinelMaster,
		Protocol:        2,
		DisableIdentity: true,
		MaxRetries:      -1,
		DialerRetries:   1,
		DialTimeout:     max(o.Timeout, 100*time.Millisecond),
		// go-redis applies the earlier of a call's deadline and these, so
		// they must not cut the longest call (an async sync) short.
		ReadTimeout:           backgroundTimeout(o),
		WriteTimeout:          backgroundTimeout(o),
		PoolTimeout:           o.Timeout,
		ContextTimeoutEnabled: true,
		PoolSize:              workers + idleCallers + 7, // + heartbeat, admin, NOSCRIPT retries, async syncs, a Cluster's pipelines left running by send
		// On a Cluster go-redis retries a dead node's commands up to
		// MaxRedirects times, holding the healthy masters' replies: two
		// follow a MOVED then an ASK, with no backoff. Scripts write: no
		// ReadOnly, no RouteByLatency.
		MaxRedirects:    2,
		MinRetryBackoff: -1,
		MaxRetryBackoff: -1,
	}
	type creds struct {
		user, pass string
		db         int
		tls        bool
	}
	var fromURL creds // what the URLs say, which must agree
	urls := 0
	for i, a := range o.Addresses {
		if !strings.Contains(a, "://") {
			u.Addrs = append(u.Addrs, a)
			continue
		}
		p, err := redis.ParseURL(a)
		if err != nil {
			var uerr *url.Error
			if errors.As(err, &uerr) {
				err = uerr.Err // url.Error repeats the whole URL, password included
			}
			return nil, fmt.Errorf("distributed: address %d (%s): %v", i+1, redactAddress(a), err)
		}
		if p.Network == "unix" {
			return nil, fmt.Errorf("distributed: address %d (%s): unix sockets are not supported", i+1, redactAddress(a))
		}
		got := creds{p.Username, p.Password, p.DB, p.TLSConfig != nil}
		if urls++; urls > 1 && got != fromURL {
			return nil, fmt.Errorf("distributed: address %d (%s) disagrees with the earlier URLs on user, password, database or TLS", i+1, redactAddress(a))
		}
		fromURL = got
		u.Addrs = append(u.Addrs, p.Addr)
	}
	u.Username = cmp.Or(u.Username, fromURL.user)
	u.Password = cmp.Or(u.Password, fromURL.pass)
	u.DB = cmp.Or(u.DB, fromURL.db)
	if o.tlsOn() || fromURL.tls {
		// ServerName stays empty: crypto/tls takes it from each dialled
		// address, which is what Cluster and Sentinel need.
		cfg, err := o.tlsConfig()
		if err != nil {
			return nil, err
		}
		u.TLSConfig = cfg
	}
	if u.DB != 0 && len(u.Addrs) > 1 && u.MasterName == "" {
		return nil, errors.New("distributed: Redis Cluster has no databases; remove db")
	}
	return u, nil
}

// tlsConfig reads the CA and client certificate files: a mistake is a
// provision error naming the file; a certificate Redis rejects, an outage
// the breaker logs once.
func (o Options) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.TLSCAFile != "" {
		pem, err := os.ReadFile(o.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("distributed: tls_ca: %v", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("distributed: tls_ca: no PEM certificate in %s", o.TLSCAFile)
		}
	}
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		return nil, errors.New("distributed: a client certificate needs both tls_cert and tls_key")
	}
	if o.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("distributed: tls_cert %s, tls_key %s: %v", o.TLSCertFile, o.TLSKeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// hint names the likely cause of an outage's first error where it does
// not: a TLS Redis that wants a client certificate closes the connection
// after the handshake (TLS 1.3), which reads as a reset.
func (o Options) hint(err error) string {
	rediss := slices.ContainsFunc(o.Addresses, func(a string) bool { return strings.HasPrefix(a, "rediss://") })
	if (o.tlsOn() || rediss) && o.TLSCertFile == "" && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || strings.Contains(err.Error(), "certificate required")) {
		return "the TLS connection was closed by Redis: if it requires client certificates (tls-auth-clients), set tls_client <cert file> <key file>"
	}
	return ""
}
