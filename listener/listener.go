// Package listener is the listener wrapper caddy.listeners.rate_limit: new
// connections decided per client before the TLS handshake, in connection
// zones of its own and while HTTP zones deny (deny_while). It shares zone
// states, name claims and the registry of running zones with the rate_limit
// handler through internal/live, and never imports the handler's package.
package listener

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// connections counts the wrapper's decisions; connections_in_flight is read
// from its concurrency zones at scrape time.
var connections = live.CounterVec("connections_total", "New TCP connections decided by a connection zone or a deny_while zone (listener wrapper rate_limit), by decision: allowed, denied, dry_run_denied.", "decision")

func init() {
	caddy.RegisterModule(Wrapper{})
	live.Gauge("connections_in_flight", "Connections holding a slot of a connection concurrency zone (listener wrapper rate_limit) in this instance.", func(z *zones.Zone, _ int64) (float64, bool) {
		return float64(z.InFlight()), z.IsConcurrency() && live.IsConnection(z)
	})
}

// Wrapper limits new connections per client before the TLS handshake: a
// refused connection costs an accept and a reset, not a handshake. It must
// be listed before `tls` in the server's listener_wrappers (and after
// `proxy_protocol`, when there is one); anywhere else the config is
// refused.
//
// A connection is decided by the client's address, `{remote_ip}`: the
// socket's peer, or the PROXY protocol's source behind `proxy_protocol`.
// `{client_ip}` and `trusted_proxies` are request-level and not known here:
// a deny_while zone must be keyed by `{remote_host}`. A refused connection
// is reset (TCP RST) before anything is read from it: it never gets a TLS
// handshake, an HTTP request or an access log line. Without
// `proxy_protocol` it is decided as it is accepted; with it, on its first
// read, in the connection's own goroutine, so that a client that is slow to
// send its PROXY header delays no one else.
//
// Connection zones are local to this instance, whatever the HTTP zones'
// distributed settings. Their state survives config reloads as HTTP zones'
// does. HTTP/3 (QUIC) connections never pass through listener wrappers.
type Wrapper struct {
	// The connection zones, by name: rate zones (events per window per key,
	// with burst) and concurrency zones (connections of a key open at
	// once), with the handler's zone settings that need no request (match,
	// cost, count, charge, placeholders in limits) and no Redis
	// (fail_policy, lease). A name shared with an HTTP zone must have the
	// same limits, and then shares its state.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// HTTP zones (of rate_limit handlers in this config, keyed by the
	// connection's address: {remote_host}) whose denial refuses the
	// client's new connections: while such a zone denies (or bans) the key,
	// a new connection of that address is reset. Read from the zone's local
	// state and deny cache, with no Redis call.
	DenyWhile []string `json:"deny_while,omitempty"`

	// Include the client's key in refusal logs (personal data: left out by
	// default).
	LogKey bool `json:"log_key,omitempty"`

	// Decide, count and log, but refuse nothing.
	DryRun bool `json:"dry_run,omitempty"`

	logger    *zap.Logger
	zones     []*connZone // rate zones tightest first, then concurrency zones
	slotZones bool        // some zone is a concurrency zone: connections hold slots
	live      *connLive
}

// connZone is a provisioned connection zone.
type connZone struct {
	*zones.Zone
	key     string // the key template
	keyIsIP bool   // the template is {remote_ip} alone
	metrics live.Decisions
	stateID live.StateID
}

// denyWhileZone is an HTTP zone a deny_while names, as the wrapper uses it.
type denyWhileZone struct {
	*zones.Zone
	dryRun  bool
	metrics live.Decisions
}

// connLive is what the wrapper's connections update and read.
type connLive struct {
	refused, dryRunRefused live.Sampler
	denyOnce               sync.Once
	denyZones              []*denyWhileZone // resolved by the first WrapListener
}

func (Wrapper) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.listeners.rate_limit",
		New: func() caddy.Module { return new(Wrapper) },
	}
}

// Provision checks the wrapper's place, sets up its zones and checks its
// deny_while zones.
func (w *Wrapper) Provision(ctx caddy.Context) error {
	w.logger = ctx.Logger()
	w.live = new(connLive)
	if err := checkPlacement(ctx); err != nil {
		return err
	}
	if len(w.RateLimits) == 0 && len(w.DenyWhile) == 0 {
		return errors.New("listener wrapper rate_limit needs a zone or a deny_while: zone <name> { key {remote_ip}; events 20; window 1s }")
	}
	if err := live.RegisterMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	for name, zc := range w.RateLimits {
		if zc == nil {
			return fmt.Errorf("zone %s: empty definition", name)
		}
		z, err := zc.provision(ctx, name, w.DryRun)
		if err != nil {
			return err
		}
		w.zones = append(w.zones, z)
		w.slotZones = w.slotZones || z.IsConcurrency()
	}
	// Rate zones tightest first, then concurrency zones smallest first: a
	// connection a rate zone refuses never takes a slot.
	slices.SortFunc(w.zones, func(a, b *connZone) int {
		return cmp.Or(cmp.Compare(a.Concurrency, b.Concurrency), cmp.Compare(float64(a.Events)/float64(a.Window), float64(b.Events)/float64(b.Window)), strings.Compare(a.Name, b.Name))
	})
	for _, name := range w.DenyWhile {
		if err := checkDenyWhile(ctx, name, w.RateLimits); err != nil {
			return err
		}
	}
	return nil
}

// Cleanup releases the zones' registrations and state references; the
// connections still open release their slots into the states they took them
// from as they close. The zones stay readable: the old listener's accept
// loop may still decide a connection while a reload cleans up (its read of
// w.zones raced Cleanup's reset of them).
func (w *Wrapper) Cleanup() error {
	for _, z := range w.zones {
		live.Unregister(z.Zone)
		live.ReleaseState(z.stateID)
	}
	return nil
}

// checkPlacement refuses a rate_limit wrapper that would not see raw
// connections (placementProblem says why). The HTTP app provisions the
// wrappers with the server, whose listener_wrappers list is still whole, in
// the context; outside an HTTP server there is none.
func checkPlacement(ctx caddy.Context) error {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return nil
	}
	names := make([]string, 0, len(srv.ListenerWrappersRaw))
	for _, raw := range srv.ListenerWrappersRaw {
		var m struct {
			Wrapper string `json:"wrapper"`
		}
		_ = json.Unmarshal(raw, &m)
		names = append(names, m.Wrapper)
	}
	return placementProblem(names)
}

// placementProblem checks the listener wrappers' names, in order: after
// tls, or with tls left out (Caddy then puts tls first), rate_limit would
// wrap connections not yet handshaken, breaking {http.request.scheme};
// before proxy_protocol, it would key every connection by the proxy's.
func placementProblem(names []string) error {
	rl := slices.Index(names, "rate_limit")
	if rl < 0 {
		return nil
	}
	if slices.Contains(names[rl+1:], "rate_limit") {
		return errors.New("listener wrapper rate_limit is listed twice in this server's listener_wrappers: put every zone in one")
	}
	tls := slices.Index(names, "tls")
	if tls < 0 || tls > rl {
		if pp := slices.Index(names, "proxy_protocol"); pp > rl && (tls < 0 || pp < tls) {
			return errors.New("listener wrapper proxy_protocol must come before rate_limit in listener_wrappers, or every connection is keyed by the proxy's address: list proxy_protocol, then rate_limit, then tls")
		}
		if tls >= 0 {
			return nil
		}
		return errors.New("listener wrapper rate_limit needs tls listed after it in listener_wrappers: without tls, Caddy puts TLS first " +
			"and rate_limit would decide connections after their handshake (and break {http.request.scheme}); write listener_wrappers { rate_limit { ... } tls }")
	}
	return errors.New("listener wrapper rate_limit must come before tls in listener_wrappers: after it, rate_limit would decide connections after their handshake " +
		"(and break {http.request.scheme}); move rate_limit above tls")
}

// checkDenyWhile checks that name is an HTTP zone of the config being
// loaded that deny_while can read: a rate zone keyed by {remote_host}.
// Handlers of servers provisioned already have claimed their zones; the
// others' routes are still JSON, and so is this server's (its listener
// wrappers come first).
func checkDenyWhile(ctx caddy.Context, name string, own map[string]*Zone) error {
	if _, ok := own[name]; ok {
		return fmt.Errorf("deny_while %s: %s is a zone of this listener wrapper; deny_while names an HTTP zone (of a rate_limit handler)", name, name)
	}
	key, concurrency, found := "", false, false
	if c, ok := live.ClaimedHTTPZone(ctx, name); ok {
		key, concurrency, found = c.Key, c.Concurrency(), true
	} else if app, err := ctx.AppIfConfigured("http"); err == nil {
		if app, ok := app.(*caddyhttp.App); ok {
			var routes []any
			for _, srv := range app.Servers {
				routes = append(routes, srv.Routes, srv.Errors, srv.NamedRoutes)
			}
			key, concurrency, found = live.ZoneInJSON(routes, name)
		}
	}
	switch {
	case !found:
		return fmt.Errorf("deny_while %s: no rate_limit handler of this config has a zone %s: name one of the HTTP zones (e.g. zone %s { key {remote_host} ... } in a rate_limit handler)", name, name, name)
	case concurrency:
		return fmt.Errorf("deny_while %s: %s is a concurrency zone, whose slots free as requests end: deny_while reads rate zones; limit open connections with a concurrency zone of this wrapper instead", name, name)
	case key == "{client_ip}" || key == "{http.vars.client_ip}":
		return fmt.Errorf("deny_while %s: zone %s is keyed by %s, which behind trusted_proxies is X-Forwarded-For's address while a connection has the proxy's "+
			"(a client sending X-Forwarded-For: <the proxy's address> would get every client behind it reset): key zone %s by {remote_host}, the connection's address, or do not use deny_while behind a proxy", name, name, key, name)
	case key != "{remote_host}" && key != "{http.request.remote.host}":
		return fmt.Errorf("deny_while %s: zone %s is keyed by %s, which a connection does not carry: deny_while reads zones keyed by the connection's address, {remote_host}", name, name, key)
	}
	return nil
}

// WrapListener decides every connection l accepts. The deny_while zones are
// looked up on the first call: the HTTP app starts listening once every
// handler of the config is provisioned.
func (w *Wrapper) WrapListener(l net.Listener) net.Listener {
	w.live.denyOnce.Do(func() {
		for _, name := range w.DenyWhile {
			z := live.Lookup(name, true)
			if z == nil {
				// Provision found it in this config: only a wrapper outside
				// an HTTP server gets here.
				w.logger.Error("deny_while names a zone no rate_limit handler defines: it refuses nothing", zap.String("zone", name))
				continue
			}
			dryRun := z.DryRun || w.DryRun
			w.live.denyZones = append(w.live.denyZones, &denyWhileZone{Zone: z, dryRun: dryRun, metrics: live.NewDecisions(connections, name, dryRun)})
		}
	})
	return &listener{Listener: l, w: w}
}

type listener struct {
	net.Listener
	w *Wrapper
}

// Accept returns the next connection that is not refused, never an error
// for a refused one (a non-temporary error would stop the server, a
// temporary one make it back off). It never waits for a client: a
// connection other than plain TCP (PROXY protocol) is decided on its first
// read.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return &conn{Conn: c, w: l.w, pending: true}, nil
		}
		ip := clientIP(tc.RemoteAddr())
		if ip == "" {
			return c, nil
		}
		var lc *conn
		var slots *[]heldSlot // nil: no zone takes slots
		if l.w.slotZones {
			lc = &conn{Conn: c, w: l.w}
			lc.slots, slots = lc.inline[:0], &lc.slots
		}
		if !l.w.decide(ip, monotime.Now(), slots) {
			reset(c)
			continue
		}
		if lc == nil || len(lc.slots) == 0 { // no slot taken: only dry-run zones refused one
			return c, nil
		}
		lc.state.Store(connHolding)
		return lc, nil
	}
}

// decide decides a new connection of ip at now: the deny_while zones first,
// which change nothing, then the rate zones, then the concurrency zones
// (zones.Admit), whose slots it appends to slots. A refused connection
// consumes nothing: the zones that allowed it before the one that refused
// are refunded and their slots released.
func (w *Wrapper) decide(ip string, now int64, slots *[]heldSlot) bool {
	for _, dz := range w.live.denyZones {
		key := dz.Config.Key(ip)
		denies := dz.Denies(key, now)
		dz.metrics.Count(!denies, dz.dryRun)
		if denies {
			w.logRefusal(now, dz.Name, key, dz.dryRun)
			if !dz.dryRun {
				return false
			}
		}
	}
	var stack [4]zones.Ticket[*connZone]
	tickets := stack[:0]
	for _, z := range w.zones {
		tickets = append(tickets, zones.Ticket[*connZone]{Owner: z, Zone: z.Zone, Key: z.keyOf(ip), Plan: z.Plan(), Cost: 1})
	}
	adm := zones.Admit(background, tickets, now, func(i int) { w.seen(&tickets[i], now) }, noTurns)
	if adm.Denied >= 0 {
		return false
	}
	for i := range tickets {
		if t := &tickets[i]; t.Holds() {
			*slots = append(*slots, heldSlot{t.Zone, t.Slot()})
		}
	}
	return true
}

// seen counts and logs a connection zone's decision t.
func (w *Wrapper) seen(t *zones.Ticket[*connZone], now int64) {
	z := t.Owner
	z.metrics.Count(t.Allowed, z.DryRun)
	if t.Allowed {
		return
	}
	z.State().Offenders.Record(t.Key, time.Now().UnixNano())
	w.logRefusal(now, z.Name, t.Key, z.DryRun)
}

// noTurns is zones.Admit's wait for connection zones, which have no delay.
func noTurns(int64) (context.Context, bool) { return background, true }

// background is the context of connection zones' decisions: they have no
// store and never wait.
var background = context.Background()

func (z *connZone) keyOf(ip string) string {
	if z.keyIsIP {
		return z.Config.Key(ip)
	}
	return z.Config.Key(strings.ReplaceAll(z.key, remoteIPPlaceholder, ip))
}

// logRefusal logs (sampled) a refused connection, or in dry run the refusal
// it would have been; the key only with log_key.
func (w *Wrapper) logRefusal(now int64, zone, key string, dryRun bool) {
	s, msg := &w.live.refused, "connection refused"
	if dryRun {
		s, msg = &w.live.dryRunRefused, "connection would be refused (dry run)"
	}
	if c := s.Check(w.logger, now, zapcore.InfoLevel, msg); c != nil {
		fields := []zap.Field{zap.String("zone", zone)}
		if w.LogKey {
			fields = append(fields, zap.String("key", key))
		}
		c.Write(fields...)
	}
}

// clientIP formats a connection's remote address as Caddy formats a
// request's client IP ({client_ip} without trusted proxies): the host
// without port and IPv6 zone, IPv4 in IPv6 unmapped, in netip's form. It is
// "" for an address that is not an IP (a Unix socket's peer): such
// connections are not limited.
func clientIP(a net.Addr) string {
	switch a := a.(type) {
	case nil:
		return ""
	case *net.TCPAddr:
		// net.IP prints an IPv4-mapped address as IPv4, which is what Caddy
		// parses from RemoteAddr.
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			return ""
		}
		return ip.Unmap().String()
	}
	host, _, err := net.SplitHostPort(a.String())
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

// reset closes a refused connection with an RST rather than a FIN (linger
// 0), so the client sees the refusal at once and the socket skips
// TIME_WAIT. Unread bytes (the ClientHello) are dropped unread.
func reset(c net.Conn) {
	if l := lingerer(c); l != nil {
		_ = l.SetLinger(0)
	}
	_ = c.Close()
}

// lingerer finds the TCP connection under c (go-proxyproto's Raw, tls's
// NetConn), a few layers deep at most.
func lingerer(c net.Conn) interface{ SetLinger(int) error } {
	for range 4 {
		switch u := c.(type) {
		case interface{ SetLinger(int) error }:
			return u
		case interface{ Raw() net.Conn }:
			c = u.Raw()
		case interface{ NetConn() net.Conn }:
			c = u.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// heldSlot is a concurrency slot a connection holds until it closes.
type heldSlot struct {
	zone *zones.Zone
	slot zones.Slot
}

func releaseHeld(slots []heldSlot) {
	for _, s := range slots {
		s.zone.Release(s.slot)
	}
}

// A conn's slots, once taken (connHolding), are released by its first Close
// only, whatever ends it (a failed handshake, a reset, a hijacked
// connection's close, a double Close).
const (
	connOpen uint32 = iota
	connHolding
	connClosed
)

// conn is a connection that holds concurrency slots, or whose decision
// waits for its first read or write (pending).
type conn struct {
	net.Conn
	w       *Wrapper
	pending bool
	once    sync.Once
	refused bool // set by decideFirst, read after once
	state   atomic.Uint32
	slots   []heldSlot
	inline  [1]heldSlot
}

// errRefused is a refused pending connection's first read's error, which
// net/http logs as a TLS handshake error (at DEBUG in Caddy).
var errRefused = errors.New("connection refused by rate_limit")

// decideFirst decides a pending connection in its own goroutine, where
// RemoteAddr may wait for a PROXY header.
func (c *conn) decideFirst() {
	if c.state.Load() == connClosed {
		return
	}
	ip := clientIP(c.Conn.RemoteAddr())
	if ip == "" {
		return
	}
	c.slots = c.inline[:0]
	if !c.w.decide(ip, monotime.Now(), &c.slots) {
		c.refused = true
		c.state.Store(connClosed)
		reset(c.Conn)
		return
	}
	if len(c.slots) > 0 && !c.state.CompareAndSwap(connOpen, connHolding) {
		releaseHeld(c.slots) // closed meanwhile
	}
}

// ready decides a pending connection once; false when it is refused.
func (c *conn) ready() bool {
	if !c.pending {
		return true
	}
	c.once.Do(c.decideFirst)
	return !c.refused
}

func (c *conn) Read(p []byte) (int, error) {
	if !c.ready() {
		return 0, errRefused
	}
	return c.Conn.Read(p)
}

func (c *conn) Write(p []byte) (int, error) {
	if !c.ready() {
		return 0, errRefused
	}
	return c.Conn.Write(p)
}

func (c *conn) Close() error {
	if c.state.Swap(connClosed) == connHolding {
		releaseHeld(c.slots)
	}
	return c.Conn.Close()
}

// ReadFrom keeps sendfile for plain HTTP responses (net/http looks for
// io.ReaderFrom on the connection).
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if !c.ready() {
		return 0, errRefused
	}
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite half-closes the connection when the one under it can (net/http
// and reverse_proxy's upgraded connections use it).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("the connection cannot half-close")
}

var (
	_ caddy.Provisioner     = (*Wrapper)(nil)
	_ caddy.CleanerUpper    = (*Wrapper)(nil)
	_ caddy.ListenerWrapper = (*Wrapper)(nil)
	_ net.Conn              = (*conn)(nil)
	_ io.ReaderFrom         = (*conn)(nil)
)
