package zones

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// Post-charged zones (`count`, `charge`; docs/configuration.md): a check
// before the request consumes nothing; the charge after the response may
// run past the burst, so that the key is denied until the debt is paid. A
// strict-mode charge never holds the response: background chargers send
// it, and a check of a key whose charge this instance has not landed waits
// for it (at most ChargeWait): one instance never lets a client past its
// own unrecorded debt.

// Strict-mode charging bounds.
const (
	// ChargeRetryFor is how long a charge that cannot reach Redis is retried.
	ChargeRetryFor = 2 * time.Second
	// ChargeWait is the longest a check waits for this instance's charges
	// of its key.
	ChargeWait = 100 * time.Millisecond

	chargeQueue = 4096
	// chargesInFlight first attempts at once share the store's pipelines.
	chargesInFlight = 256
)

// charge is one queued strict-mode charge.
type charge struct {
	zone *Zone
	key  string
	plan Plan
	cost int64
	at   time.Time // when it was queued: retries stop ChargeRetryFor later
	err  error     // the last attempt's error, for retries
	held bool      // zone.Hold returned true: zone.Done once it is over
}

// over is called once ch has landed or failed for good.
func (ch *charge) over() {
	if ch.held {
		ch.zone.Done()
	}
}

// charger sends a state's strict-mode charges and tracks those not landed per key.
type charger struct {
	once    sync.Once
	started atomic.Bool
	queue   chan charge
	retries chan charge // charges whose first attempt failed
	mu      sync.Mutex
	pending map[string]*pendingCharges
}

// pendingCharges are one key's charges not landed; done closes when the
// last lands or fails.
type pendingCharges struct {
	n    int
	done chan struct{}
}

func (c *charger) start(stop <-chan struct{}, wg *sync.WaitGroup) {
	c.once.Do(func() {
		c.queue = make(chan charge, chargeQueue)
		c.retries = make(chan charge, chargeQueue)
		c.pending = make(map[string]*pendingCharges)
		wg.Go(func() {
			sem := make(chan struct{}, chargesInFlight)
			for {
				select {
				case ch := <-c.queue:
					sem <- struct{}{}
					wg.Go(func() { // wg counts this loop: never at zero here
						defer func() { <-sem }()
						ch.zone.sendCharge(ch, c)
					})
				case <-stop:
					return
				}
			}
		})
		wg.Go(func() { c.retryLoop(stop) })
		c.started.Store(true)
	})
}

// errStateClosed fails the charges still queued when a zone's state goes.
var errStateClosed = errors.New("zone state closed before the charge was sent")

// fail reports every charge still queued after the chargers stopped.
func (c *charger) fail() {
	if !c.started.Load() {
		return
	}
	for {
		select {
		case ch := <-c.queue:
			ch.zone.chargeFallback(ch.key, monotime.Now(), &ch.plan, ch.cost)
			ch.zone.chargeFailed(errStateClosed)
			c.landed(ch.key)
			ch.over()
		case ch := <-c.retries:
			ch.zone.chargeFailed(errStateClosed)
			ch.over()
		default:
			return
		}
	}
}

func (c *charger) add(key string) {
	c.mu.Lock()
	p := c.pending[key]
	if p == nil {
		p = &pendingCharges{done: make(chan struct{})}
		c.pending[key] = p
	}
	p.n++
	c.mu.Unlock()
}

func (c *charger) landed(key string) {
	c.mu.Lock()
	if p := c.pending[key]; p != nil {
		if p.n--; p.n == 0 {
			close(p.done)
			delete(c.pending, key)
		}
	}
	c.mu.Unlock()
}

// wait returns when this instance has no charge of key in flight, after
// ChargeWait, or when ctx ends.
func (c *charger) wait(ctx context.Context, key string) {
	if !c.started.Load() {
		return
	}
	c.mu.Lock()
	p := c.pending[key]
	c.mu.Unlock()
	if p == nil {
		return
	}
	t := time.NewTimer(ChargeWait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Check decides a post-charged zone's request before it runs: allowed
// unless the key has nothing left under p; it consumes nothing.
func (z *Zone) Check(ctx context.Context, key string, now int64, p *Plan) Decision {
	return z.step(ctx, OpCheck, key, now, p, 1)
}

// MaxCharge is the most one charge counts, in bursts (a key's debt is
// capped at one burst beyond empty anyway: algorithms.Limit.Charge).
const MaxCharge = 2

// Charge charges cost for key under p after the response, never waiting
// for Redis: a strict-mode charge is queued (OnChargeFailed if it cannot land).
func (z *Zone) Charge(ctx context.Context, key string, now int64, p *Plan, cost int64) {
	cost = min(cost, MaxCharge*p.Burst)
	switch {
	case cost <= 0:
	case z.store == nil:
		z.localStep(false, key, now, p, OpCharge, cost, 0)
	case z.offers.Records != nil:
		// Async: an in-process step, reported at the next sync.
		if ch := (charge{key: key, plan: *p, cost: cost}); !z.tryCharge(ctx, now, &ch) {
			z.chargeFallback(key, now, p, cost)
			z.chargeFailed(ch.err)
		}
	default:
		c := &z.state.charger
		c.start(z.state.stop, &z.state.chargers)
		c.add(key)
		ch := charge{zone: z, key: key, plan: *p, cost: cost, at: time.Now(), held: z.Hold != nil && z.Hold()}
		select {
		case c.queue <- ch:
		default:
			// Full (Redis far slower than traffic): charge here, not drop it.
			z.sendCharge(ch, c)
		}
	}
}

// sendCharge makes the first attempt to land a strict-mode charge. The
// key's checks wait until it is in Redis or, failed, in the fail policy's
// view (local: charged at once, an outage's checks see the debt without
// waiting for retryLoop's retries).
func (z *Zone) sendCharge(ch charge, c *charger) {
	defer c.landed(ch.key)
	if z.tryCharge(context.Background(), monotime.Now(), &ch) {
		ch.over()
		return
	}
	z.chargeFallback(ch.key, monotime.Now(), &ch.plan, ch.cost)
	select {
	case c.retries <- ch:
		return // retryLoop's now
	default:
		// More failed charges than can be held: owed now.
		z.owe(ch.key, &ch.plan, ch.cost)
		z.chargeFailed(ch.err)
	}
	ch.over()
}

// tryCharge makes one attempt to land ch, noting its error.
func (z *Zone) tryCharge(ctx context.Context, now int64, ch *charge) bool {
	if q := z.state.quota; q != nil {
		pn := q.at(now)
		r, err := z.store.Quota(ctx, z.Name, ch.key, QuotaStep{Op: OpCharge, Limit: QuotaLimit{Limit: ch.plan.Events, Periods: &pn.periods}, Cost: ch.cost})
		if ch.err = err; err != nil {
			z.followClock(err)
			return false
		}
		z.storeQuotaDecision(ch.key, now, pn, ch.plan.Events, r)
		return true
	}
	rep, err := z.store.Rate(ctx, z.Name, ch.key, RateStep{Op: OpCharge, Limit: ch.plan.limit, Cost: ch.cost})
	if ch.err = err; err != nil {
		return false
	}
	z.heard(ch.key, now, rep.Result)
	return true
}

// chargeRetryEvery is how often failed charges are tried again.
const chargeRetryEvery = 100 * time.Millisecond

// retryLoop retries failed charges every chargeRetryEvery until they land
// or ChargeRetryFor passed since they were queued, leaving the workers free
// for first attempts.
func (c *charger) retryLoop(stop <-chan struct{}) {
	tick := time.NewTicker(chargeRetryEvery)
	defer tick.Stop()
	var failed []charge
	for {
		select {
		case ch := <-c.retries:
			failed = append(failed, ch)
		case <-tick.C:
			keep := failed[:0]
			for _, ch := range failed {
				switch {
				case time.Since(ch.at) > ChargeRetryFor:
					ch.zone.owe(ch.key, &ch.plan, ch.cost)
					ch.zone.chargeFailed(ch.err)
				case !ch.zone.tryCharge(context.Background(), monotime.Now(), &ch):
					keep = append(keep, ch)
					continue
				}
				ch.over() // landed, or failed for good
			}
			clear(failed[len(keep):])
			failed = keep
		case <-stop:
			for _, ch := range failed {
				ch.zone.chargeFailed(errStateClosed)
				ch.over()
			}
			return
		}
	}
}

// chargeFallback applies the fail policy to a charge the store did not
// take: local charges this instance's part (open and closed: nothing).
func (z *Zone) chargeFallback(key string, now int64, p *Plan, cost int64) {
	z.failPolicy(nil, Decision{}, func() Decision { return z.fallback(key, now, p, OpCharge, cost, 0) })
}

func (z *Zone) chargeFailed(err error) {
	if f := z.OnChargeFailed; f != nil {
		f(err)
	}
}
