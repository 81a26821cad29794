package ratelimit

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/challenge"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

const maxStackZones = 4 // zone tickets ServeHTTP keeps on the stack

// ticket is one zone's zones.Ticket for the request being served.
type ticket = zones.Ticket[*httpZone]

// ServeHTTP decides the request in every zone that applies to it, tightest
// first, and either calls next or returns the denial.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.URL.Path == challenge.VerifyPath && h.challengeZone("") != nil {
		return h.verifyChallenge(w, r, next)
	}
	now := monotime.Now()
	var repl *caddy.Replacer // deep in the request's context: looked up only when needed
	if h.placeholders {
		repl = requestReplacer(r)
	}
	var stack [maxStackZones]ticket
	tickets, err := h.applicable(r, repl, now, stack[:0])
	if err != nil {
		return err
	}
	if h.store != nil {
		// In local mode the decision is the lookup a cache would be.
		if v := h.cachedDenial(tickets, now); v >= 0 {
			return h.deny(w, r, tickets[v:v+1], &tickets[v], now)
		}
	}
	if h.holds && h.users.hold() {
		// The store must outlive a reload while this request uses it.
		defer h.users.done()
	}
	ctx, cancel := h.storeContext(r, now, false)
	mark := now // the end of the last zone's decision, for the store's latency
	adm := zones.Admit(ctx, tickets, now,
		func(i int) { h.seen(&tickets[i], now, &mark) },
		func(turn int64) (context.Context, bool) {
			cancel()
			if !h.awaitTurn(r, tickets, turn) {
				return nil, false
			}
			ctx, cancel = h.storeContext(r, monotime.Now(), true)
			mark = monotime.Now()
			return ctx, true
		})
	cancel()
	switch {
	case adm.Gone:
		return clientGone(w)
	case adm.Denied >= 0:
		return h.deny(w, r, tickets[:adm.Denied+1], &tickets[adm.Denied], now)
	case adm.Turn != 0 && !h.awaitTurn(r, tickets, adm.Turn):
		return clientGone(w)
	}
	h.setHeaders(w.Header(), tickets, false, 0)
	if h.weighted {
		countCost(tickets)
	}
	h.annotate(r, tickets)
	return h.serve(w, r, repl, next, tickets)
}

// serve calls next for an allowed request, through finish (panics
// included) when a ticket finishes with the response. A hijacked
// connection (WebSocket) holds its slots until the handler that hijacked
// it returns, which reverse_proxy does when the connection ends.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, tickets []ticket) error {
	rw, nr := h.responseFor(w, r, tickets)
	if rw == nil {
		return next.ServeHTTP(w, r)
	}
	defer h.finish(rw, r, repl, tickets)
	err := next.ServeHTTP(rw, nr)
	rw.returned, rw.err = true, err
	return err
}

// seen counts and logs v's zone's decision as Admit makes it (the store's
// latency: since mark, the end of the last decision, which seen moves),
// and in a dry-run zone the denial (or ban) it would have been.
func (h *Handler) seen(v *ticket, now int64, mark *int64) {
	z, d := v.Owner, &v.Decision
	var took time.Duration
	if z.timed {
		t := monotime.Now()
		took, *mark = time.Duration(t-*mark), t
	}
	z.metrics.observe(*d, z.dryRun, took)
	if z.metrics.classes != nil {
		z.metrics.countClass(v.Class, d.Allowed)
	}
	if d.Err != nil {
		if c := z.logs.storeError.Check(z.logger, now, zapcore.DebugLevel, "store unavailable; fail policy applied"); c != nil {
			c.Write(zap.String("zone", z.Name), zap.String("fail_policy", z.FailPolicy.String()), zap.Error(d.Err))
		}
	}
	if v.OverBurst() {
		z.logOverBurst(now, v.Cost, v.Plan)
	}
	if !d.Allowed && z.dryRun {
		h.denied(now, v, true)
	}
}

// awaitTurn waits until turn (monotime), the latest turn the request's
// zones with delay reserved, and reports whether it may go on. A request
// whose context ends meanwhile gives back what every zone took,
// reservations included, and returns false at once. Either way the queue
// places are given back; {http.rate_limit.delay} is the time waited.
func (h *Handler) awaitTurn(r *http.Request, tickets []ticket, turn int64) bool {
	start := time.Now()
	t := time.NewTimer(time.Duration(turn - monotime.Now()))
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		// Refunds outlive the request's context, bounded by the budget.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), cmp.Or(h.budget, time.Second))
		now := monotime.Now()
		for i := range tickets {
			if err := tickets[i].Cancel(ctx, now); err != nil {
				h.logger.Debug("refund failed", zap.String("zone", tickets[i].Owner.Name), zap.Error(err))
			}
		}
		cancel()
		return false
	}
	waited := time.Since(start)
	for i := range tickets {
		tickets[i].Served(waited)
	}
	// A provider, not a Set: see deny.
	requestReplacer(r).Map(func(placeholder string) (any, bool) {
		if placeholder == "http.rate_limit.delay" {
			return waited, true
		}
		return nil, false
	})
	return true
}

// clientGone answers 499 (client closed request) for the access log, as
// Caddy's reverse proxy does.
func clientGone(w http.ResponseWriter) error {
	w.WriteHeader(499)
	return nil
}

func requestReplacer(r *http.Request) *caddy.Replacer {
	return r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
}

// applicable appends to tickets the zones whose matchers accept r, with
// the request's key in each; nothing is decided yet.
func (h *Handler) applicable(r *http.Request, repl *caddy.Replacer, now int64, tickets []ticket) ([]ticket, error) {
	for _, z := range h.zones {
		if len(z.matchers) > 0 {
			match, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return nil, caddyhttp.Error(http.StatusInternalServerError, err)
			}
			if !match {
				continue
			}
		}
		raw := z.expandKey(r, repl)
		tickets = append(tickets, ticket{Owner: z, Zone: z.Zone, Key: z.Config.Key(raw), Raw: raw,
			Plan: z.planFor(repl, now), Cost: z.costFor(r, repl, now), Class: z.classFor(r, repl),
			PostCharged: z.costs.postCharged() && !z.costs.estimate, UpTo: z.costs.llm != nil && z.costs.llm.estimate})
		v := &tickets[len(tickets)-1]
		if z.waits {
			v.Done = r.Context().Done()
		}
		z.resolve(r, v)
	}
	return tickets, nil
}

// resolve gives v, r's ticket in z, the identity of a solved cookie and
// the operator's override.
func (z *httpZone) resolve(r *http.Request, v *ticket) {
	if z.challenge != nil {
		z.challenge.identify(r, v)
	}
	v.Resolve()
}

// cachedDenial is the index of a rate zone (not in dry run) whose deny
// cache already denies the request, with its ticket filled in, or -1: a
// request one zone denies costs no Redis call in the others.
func (h *Handler) cachedDenial(tickets []ticket, now int64) int {
	for i := range tickets {
		v := &tickets[i]
		if v.Owner.dryRun || v.Owner.IsConcurrency() || v.Waived() {
			continue
		}
		if d, ok := v.Owner.CachedDenial(v.Key, now, &v.Plan); ok {
			v.Decision = d
			v.Owner.metrics.observe(d, false, 0)
			return i
		}
	}
	return -1
}

// storeContext bounds the request's store calls by one budget, the
// distributed timeout, however many zones and handlers ask Redis: the
// first strict-mode handler fixes the deadline in the request's vars.
// Local and async handlers never wait for Redis. After a wait for a turn
// (restart) the budget starts again, from now.
//
// The request's cancellation is not passed on: a child of Caddy's request
// context costs ~3% of Caddy's CPU in strict mode (a CPU profile), and the
// budget bounds the calls anyway.
func (h *Handler) storeContext(r *http.Request, now int64, restart bool) (context.Context, context.CancelFunc) {
	ctx := r.Context()
	if h.budget <= 0 {
		return ctx, func() {}
	}
	deadline, ok := caddyhttp.GetVar(ctx, storeDeadlineVar).(int64)
	if !ok || restart {
		deadline = now + int64(h.budget)
		caddyhttp.SetVar(ctx, storeDeadlineVar, deadline)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), time.Now().Add(time.Duration(deadline-monotime.Now())))
}

const storeDeadlineVar = "rate_limit.store_deadline" // monotime: the request's store calls end

// deny answers a request that v, one of tickets, denied. The error is a
// plain caddyhttp.HandlerError, boxed once per zone: caddyhttp.Error would
// record a stack trace on every denial. Denying must stay cheaper than
// serving.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, tickets []ticket, v *ticket, now int64) error {
	retry := v.Decision.RetryAfter
	if h.Jitter > 0 {
		// Clamped: a wait near the largest Duration must not wrap.
		retry = time.Duration(min(float64(retry)*(1+rand.Float64()*h.Jitter), float64(math.MaxInt64/2)))
	}
	h.setHeaders(w.Header(), tickets, true, retry)
	// A provider rather than Sets: a first Set allocates the replacer's
	// table, and the key is boxed only if a placeholder is read.
	repl := requestReplacer(r)
	name, key, limited := v.Owner.nameValue, v.Key, limitedOnDenial(repl, tickets, v.Owner.Name)
	repl.Map(func(placeholder string) (any, bool) {
		switch placeholder {
		case "http.rate_limit.exceeded.name":
			return name, true
		case "http.rate_limit.exceeded.key":
			return key, true
		case limitedPlaceholder:
			return limited, true
		}
		return nil, false
	})
	if h.events.ShouldEmit(eventExceeded) {
		h.events.Emit(h.ctx, eventExceeded, map[string]any{
			"zone":        v.Owner.Name,
			"key":         v.Key,
			"retry_after": retry,
			"remote_addr": r.RemoteAddr,
		})
	}
	h.denied(now, v, false)
	if v.Owner.challenge != nil && v.Owner.challenge.challenge(w, r, v, retry) {
		return nil
	}
	if h.answersDirectly(r) {
		// Caddy's error path would encode the whole request for a debug
		// log line, which under a flood costs more than serving.
		w.WriteHeader(v.Owner.status)
		return nil
	}
	return v.Owner.denial
}

// answersDirectly reports whether r's server has no error routes, so that
// a denial is written rather than returned; looked up once, since a
// handler belongs to one server.
func (h *Handler) answersDirectly(r *http.Request) bool {
	if known := h.live.errorRoutes.Load(); known != errorRoutesUnknown {
		return known == errorRoutesNone
	}
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok {
		return false // not served by Caddy (tests): return the error
	}
	known := errorRoutesSome
	if srv.Errors == nil || len(srv.Errors.Routes) == 0 {
		known = errorRoutesNone
	}
	h.live.errorRoutes.Store(known)
	return known == errorRoutesNone
}

type liveState struct {
	logs        logSamplers  // shared by the handler's zones
	errorRoutes atomic.Int32 // errorRoutesUnknown, None or Some
}

// logSamplers are a handler's samplers, one per log line a request can cause.
type logSamplers struct {
	denial, ban    [2]live.Sampler // by dry run
	storeError     live.Sampler
	planFallback   live.Sampler
	costFallback   live.Sampler
	costOverBurst  live.Sampler
	chargeFailure  live.Sampler
	chargeFallback live.Sampler
}

const (
	errorRoutesUnknown int32 = iota
	errorRoutesNone
	errorRoutesSome
)

const (
	eventExceeded = "rate_limit_exceeded"
	eventBanned   = "rate_limit_banned"
)

// denied records v's denial (in dry run: would-be denial) for top and
// logs it (sampled), and tells of a ban it started: the rate_limit_banned
// event (real bans), a sampled INFO line and the counter.
func (h *Handler) denied(now int64, v *ticket, dryRun bool) {
	z, d, dry := v.Owner, &v.Decision, 0
	if dryRun {
		dry = 1
	}
	z.State().Offenders.Record(v.Key, time.Now().UnixNano()) // in dry run too: top tells what headers do
	if c := h.live.logs.denial[dry].Check(h.logger, now, zapcore.InfoLevel, denialMessages[dry]); c != nil {
		c.Write(h.keyed(v.Key, zap.String("zone", z.Name), zap.Duration("retry_after", d.RetryAfter))...)
	}
	if d.BanStarted <= 0 {
		return
	}
	add(z.metrics.bans, 1)
	if !dryRun && h.events.ShouldEmit(eventBanned) {
		data := map[string]any{"zone": z.Name, "ban": d.BanStarted, "level": d.BanLevel}
		if h.LogKey {
			data["key"] = v.Key
		}
		h.events.Emit(h.ctx, eventBanned, data)
	}
	if c := h.live.logs.ban[dry].Check(h.logger, now, zapcore.InfoLevel, banMessages[dry]); c != nil {
		fields := []zap.Field{zap.String("zone", z.Name), zap.Duration("ban", d.BanStarted)}
		if d.BanLevel > 0 {
			fields = append(fields, zap.Int("level", d.BanLevel))
		}
		c.Write(h.keyed(v.Key, fields...)...)
	}
}

var (
	denialMessages = [2]string{"rate limit exceeded", "rate limit would deny (dry run)"}
	banMessages    = [2]string{"rate limit ban started", "rate limit would ban (dry run)"}
)

// keyed is fields with, when log_key is on, the key.
func (h *Handler) keyed(key string, fields ...zap.Field) []zap.Field {
	if h.LogKey {
		return append(fields, zap.String("key", key))
	}
	return fields
}
