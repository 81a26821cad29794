package zones

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// What fail_policy local admits during an outage is owed to the store: when
// it answers again, each instance charges it key by key, so that no key gets
// its quota again (bounds: docs/distributed.md, After the outage). A charge is
// sent at most once, as one that timed out may have run; one the store
// refused without running (breaker open, an error reply) is tried again, at
// most owedAttempts times. Async records do this themselves (their pending
// cost, counted by the next sync); quota zones are not reconciled.

const (
	owedAttempts = 5  // how many times an owed charge the store refused is tried
	owedBatch    = 64 // owed charges in flight at once: they share the store's pipelines
)

type owed struct {
	mu      sync.Mutex
	m       map[string]*owedCharge
	max     int
	any     atomic.Bool // m is not empty
	running atomic.Bool // a reconcile is under way
}

type owedCharge struct {
	plan     Plan
	cost     int64
	attempts int
}

// owe notes that fail_policy local admitted (or charged) cost for key under
// plan p; a negative cost is a refund of such an admission.
func (z *Zone) owe(key string, p *Plan, cost int64) {
	if z.FailPolicy == FailLocal && z.records == nil && z.state.quota == nil && z.store != nil {
		z.state.owed.add(key, p, cost, 0)
	}
}

// add adds cost under p to what key owes, a charge tried attempts times;
// at most max keys owe.
func (o *owed) add(key string, p *Plan, cost int64, attempts int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.m[key]
	if c == nil {
		if cost <= 0 || len(o.m) >= o.max {
			return
		}
		if o.m == nil {
			o.m = make(map[string]*owedCharge)
		}
		c = &owedCharge{}
		o.m[key] = c
		o.any.Store(true)
	}
	c.plan = *p
	c.cost = min(c.cost+cost, MaxCharge*p.Burst)
	c.attempts = max(c.attempts, attempts)
	if c.cost <= 0 {
		delete(o.m, key)
		o.any.Store(len(o.m) > 0)
	}
}

// reconcile pays the store, in the background, what this instance owes it.
func (z *Zone) reconcile() {
	o := &z.state.owed
	if !o.any.Load() || !o.running.CompareAndSwap(false, true) {
		return
	}
	z.state.chargers.Go(func() {
		defer o.running.Store(false)
		o.mu.Lock()
		taken := o.m
		o.m = nil
		o.any.Store(false)
		o.mu.Unlock()
		var wg sync.WaitGroup
		sem := make(chan struct{}, owedBatch)
		for key, c := range taken {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				z.payOwed(key, c)
			})
		}
		wg.Wait()
	})
}

// payOwed sends one owed charge; one the store refused without running it
// is owed again.
func (z *Zone) payOwed(key string, c *owedCharge) {
	ch := charge{key: key, plan: c.plan, cost: c.cost}
	if !z.tryCharge(context.Background(), monotime.Now(), &ch) && !errors.Is(ch.err, context.DeadlineExceeded) && c.attempts+1 < owedAttempts {
		z.state.owed.add(key, &c.plan, c.cost, c.attempts+1)
	}
}

func (o *owed) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}
