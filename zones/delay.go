package zones

// Delay: a rate zone with `delay` admits for later the requests it would deny
// whose allow time is at most the delay away. The turn is reserved as the
// request is decided (the TAT moves as for an allowed one, in the store's same
// atomic step); the request waits for it (serve.go), or gives it back with a
// refund. At most the queue wait at once per zone and instance.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
)

const (
	// MaxDelay is the longest a request may wait for its turn: beyond it a
	// client is better told Retry-After than kept on a connection.
	MaxDelay = time.Minute
	// DefaultQueue is how many requests of a zone may wait at once on one
	// instance by default: each holds a goroutine and a connection (a few
	// KiB), so 1,000 bound them to a few MiB.
	DefaultQueue = 1000
	// MaxQueue is the largest queue a zone may set.
	MaxQueue = 1_000_000
)

func (c Config) validateDelay() error {
	switch {
	case c.Delay == 0 && c.Queue == 0:
		return nil
	case c.IsConcurrency() && !c.IsAdaptive():
		return errors.New("delay is for rate zones: a concurrency zone's slot frees when a request ends, at no time known in advance; remove delay")
	case c.IsQuota():
		return errors.New("delay is for rate zones: a quota zone's next unit comes at the period's end; remove delay, or put a rate zone with delay beside it")
	case c.Delay <= 0:
		return errors.New("delay must be a positive duration, the longest a request waits for its turn (e.g. delay 3s)")
	case c.Delay > MaxDelay:
		return fmt.Errorf("delay %v is longer than the %v a request may wait: use a shorter delay (clients are better told Retry-After)", c.Delay, MaxDelay)
	case c.Queue < 0 || c.Queue > MaxQueue:
		return fmt.Errorf("queue must be a whole number from 1 to %d", MaxQueue)
	}
	return nil
}

// QueueSize is how many requests of the zone may wait at once here.
func (c Config) QueueSize() int64 { return cmp.Or(c.Queue, DefaultQueue) }

// ahead is how far ahead the zone may reserve now: its delay, or 0 (none,
// or a full queue).
func (z *Zone) ahead() int64 {
	if z.Delay <= 0 || z.DryRun || z.state.waiting.Load() >= z.QueueSize() {
		return 0
	}
	return int64(z.Delay)
}

// EndWait gives back the queue place of a request the zone admitted for
// later (Decision.Delay > 0), once per such decision.
func (z *Zone) EndWait() { z.state.waiting.Add(-1) }

// Waiting is how many requests of the zone wait here now.
func (z *Zone) Waiting() int64 { return z.state.waiting.Load() }

// delayed completes a decision of a zone with delay: an admission for later
// takes its queue place (a queue filled meanwhile refunds it and denies as a
// full queue does); a denial whose retry is within the delay was a full queue's.
func (z *Zone) delayed(ctx context.Context, key string, now int64, p *Plan, cost, ahead int64, d Decision) Decision {
	switch {
	case d.Allowed && d.Delay > 0 && !z.takeQueuePlace():
		refunded, _ := z.RefundWith(ctx, key, now, d, p, cost)
		return Decision{RetryAfter: d.Delay, ResetAfter: max(refunded.ResetAfter, d.Delay), Source: d.Source, QueueFull: true}
	case !d.Allowed && !d.Banned && ahead == 0 && d.RetryAfter <= z.Delay && !z.DryRun:
		d.QueueFull = true
	}
	return d
}
