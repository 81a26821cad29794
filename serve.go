package ratelimit

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// maxStackZones is how many zone verdicts ServeHTTP keeps on the stack.
const maxStackZones = 4

// verdict is one zone's decision on the request being served.
type verdict struct {
	zone *zoneHandler
	key  string
	d    zones.Decision
	plan zones.Plan // the limit the request was decided under
	slot zones.Slot // a concurrency zone's slot, held until next returns
	cost int64      // what it cost (post-charged zones: the default charge)
}

// ServeHTTP decides the request in every zone that applies to it, tightest
// first, and either calls next or returns the denial.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	now := monotime.Now()

	var stack [maxStackZones]verdict
	applicable, err := h.applicable(r, repl, stack[:0])
	if err != nil {
		return err
	}
	if v := h.cachedDenial(applicable, now); v >= 0 {
		maxT := h.setHeaders(w.Header(), applicable[v:v+1], true)
		return h.deny(w, r, repl, &applicable[v], maxT)
	}
	ctx, cancel := h.storeContext(r, now)

	verdicts := applicable[:0]
	var denied *verdict
	holding := false
	postCharged := false
	for _, v := range applicable {
		z, key, plan, cost := v.zone, v.key, v.plan, v.cost
		var start time.Time
		if z.timed {
			start = time.Now()
		}
		var d zones.Decision
		var slot zones.Slot
		switch {
		case z.IsConcurrency():
			d, slot = z.Acquire(ctx, key)
			holding = holding || slot.Held()
		case z.costs.postCharged():
			d = z.Check(ctx, key, now, &plan)
			postCharged = true
		case cost > plan.Burst:
			d = h.neverPasses(z, &plan, cost)
		default:
			d = z.DecideWith(ctx, key, now, &plan, cost)
		}
		if z.metrics != nil {
			var wait time.Duration
			if !start.IsZero() {
				wait = time.Since(start)
			}
			z.metrics.observe(d, z.dryRun, wait)
		}
		if d.Err != nil {
			h.logStoreError(z, d)
		}
		verdicts = append(verdicts, verdict{zone: z, key: key, d: d, plan: plan, slot: slot, cost: cost})
		if !d.Allowed {
			if z.dryRun {
				h.logDenial(z, key, d, true)
				continue
			}
			denied = &verdicts[len(verdicts)-1]
			break
		}
	}

	if denied != nil {
		// A denied request consumes nothing: give back what the zones
		// before the denying one took, at the cost they took it
		// (post-charged zones only checked).
		for i := range verdicts[:len(verdicts)-1] {
			v := &verdicts[i]
			if !v.d.Allowed || v.zone.costs.postCharged() {
				continue
			}
			if v.slot.Held() {
				releaseSlot(v)
				continue
			}
			var err error
			if v.d, err = v.zone.RefundWith(ctx, v.key, now, v.d, &v.plan, v.cost); err != nil {
				h.logger.Debug("refund failed", zap.String("zone", v.zone.Name), zap.Error(err))
			}
		}
	}
	cancel()
	maxT := h.setHeaders(w.Header(), verdicts, denied != nil)
	if denied == nil {
		if h.weighted {
			countCost(verdicts)
		}
		if postCharged {
			return h.serveAndCharge(w, r, repl, next, verdicts, holding)
		}
		if holding {
			return serveHoldingSlots(w, r, next, verdicts)
		}
		return next.ServeHTTP(w, r)
	}
	return h.deny(w, r, repl, denied, maxT)
}

// applicable appends to verdicts the zones whose matchers accept r, with
// the request's key in each, tightest first; nothing is decided yet.
func (h *Handler) applicable(r *http.Request, repl *caddy.Replacer, verdicts []verdict) ([]verdict, error) {
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
		verdicts = append(verdicts, verdict{zone: z, key: z.Config.Key(z.expandKey(r, repl)),
			plan: z.planFor(h, repl), cost: z.costFor(h, repl)})
	}
	return verdicts, nil
}

// cachedDenial looks for a rate zone (not in dry run) whose deny cache
// already denies the request, before any zone asks the store: a request
// that one zone denies costs no Redis call in the others (no decision, no
// refund, no slot). It fills in that zone's verdict and returns its index,
// or -1.
func (h *Handler) cachedDenial(verdicts []verdict, now int64) int {
	for i := range verdicts {
		v := &verdicts[i]
		if v.zone.dryRun || v.zone.IsConcurrency() {
			continue
		}
		if d, ok := v.zone.CachedDenial(v.key, now, &v.plan); ok {
			v.d = d
			if v.zone.metrics != nil {
				v.zone.metrics.observe(d, false, 0)
			}
			return i
		}
	}
	return -1
}

// storeContext bounds the request's store calls by one budget, the
// distributed timeout, however many zones and handlers ask Redis: the
// first strict-mode handler on the request fixes the deadline in the
// request's vars and later ones keep it. Local and async handlers never
// wait for Redis and use the request's context as is.
func (h *Handler) storeContext(r *http.Request, now int64) (context.Context, context.CancelFunc) {
	ctx := r.Context()
	if h.budget <= 0 {
		return ctx, func() {}
	}
	deadline, ok := caddyhttp.GetVar(ctx, storeDeadlineVar).(int64)
	if !ok {
		deadline = now + int64(h.budget)
		caddyhttp.SetVar(ctx, storeDeadlineVar, deadline)
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Duration(deadline-monotime.Now())))
}

// storeDeadlineVar holds, in the request's vars, the monotime by which
// every store call of the request must be answered.
const storeDeadlineVar = "rate_limit.store_deadline"

// deny answers a denied request: Retry-After, placeholders, the
// rate_limit_exceeded event, a sampled log line, and the error for
// handle_errors to shape. The error is a plain caddyhttp.HandlerError:
// caddyhttp.Error would record a stack trace and an error id on every
// denial. Denying must stay cheaper than serving.
//
// Retry-After is never earlier than any t of the RateLimit field (minSeconds,
// draft-ietf-httpapi-ratelimit-headers-10 §6).
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, v *verdict, minSeconds int64) error {
	retry := v.d.RetryAfter
	if h.Jitter > 0 {
		// In floating point and clamped: a wait near the largest
		// Duration must not wrap.
		retry = time.Duration(min(float64(retry)*(1+rand.Float64()*h.Jitter), float64(math.MaxInt64/2)))
	}
	w.Header().Set("Retry-After", strconv.FormatInt(max(1, ceilSeconds(retry), minSeconds), 10))
	name := v.zone.nameValue // boxed once when provisioned
	if name == nil {
		name = v.zone.Name
	}
	repl.Set("http.rate_limit.exceeded.name", name)
	repl.Set("http.rate_limit.exceeded.key", v.key)
	if h.events.ShouldEmit(eventExceeded) {
		h.events.Emit(h.ctx, eventExceeded, map[string]any{
			"zone":        v.zone.Name,
			"key":         v.key,
			"retry_after": retry,
			"remote_addr": r.RemoteAddr,
		})
	}
	h.logDenial(v.zone, v.key, v.d, false)
	v.zone.State().Offenders.Record(v.key, time.Now().UnixNano())
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok &&
		(srv.Errors == nil || len(srv.Errors.Routes) == 0) {
		// Nothing would shape the error: answer directly. Caddy's error
		// path would encode the whole request for a debug log line on
		// every denial, which under a flood costs more than serving.
		w.WriteHeader(h.StatusCode)
		return nil
	}
	return caddyhttp.HandlerError{StatusCode: h.StatusCode, Err: v.zone.denyErr}
}

const eventExceeded = "rate_limit_exceeded"

func (h *Handler) logDenial(z *zoneHandler, key string, d zones.Decision, dryRun bool) {
	msg := "rate limit exceeded"
	if dryRun {
		msg = "rate limit would deny (dry run)"
	}
	if c := h.denyLog.Check(zapcore.InfoLevel, msg); c != nil {
		fields := []zap.Field{zap.String("zone", z.Name), zap.Duration("retry_after", d.RetryAfter)}
		if h.LogKey {
			fields = append(fields, zap.String("key", key))
		}
		c.Write(fields...)
	}
}

func (h *Handler) logStoreError(z *zoneHandler, d zones.Decision) {
	if c := h.denyLog.Check(zapcore.DebugLevel, "store unavailable; fail policy applied"); c != nil {
		c.Write(zap.String("zone", z.Name), zap.String("fail_policy", z.FailPolicy.String()), zap.Error(d.Err))
	}
}
