package tests

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// peekT is an emission interval that is not a whole number of ms (1.0003
// s): a TAT gcra.lua writes is then mostly between two ms, where the TTL it
// sets, rounded up to a ms, runs past it.
const peekT = 1_000_300 * time.Microsecond

// The one read's peek of a strict rate key in a zone without a ban reads
// its PTTL, not the script: on a table of states gcra.lua wrote on Redis's
// clock (fresh, partly spent, exhausted, in debt after a charge, a delay's
// reservation, a refund, read under another plan) it says what the
// script's peek says at the same moment: the same allowed and remaining, a
// reset from 1 ms early to 2 ms late (the TTL is rounded up to a ms when
// written, Redis's clock down to one when read), and a retry at most 3 ms
// shorter, never longer.
func TestReadPeekByTTLEqualsScriptPeek(t *testing.T) {
	rs := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{rs.Addr}, Timeout: time.Second}, nil)
	ctx := t.Context()
	l := algorithms.NewLimit(5, int64(5*peekT), 0)      // T 1.0003 s, B 5
	other := algorithms.NewLimit(10, int64(5*peekT), 0) // a plan change: T 0.50015 s, B 10
	decide := func(cost int64) func(string) error {
		return func(key string) error { _, err := stepDecide(s, ctx, "peek", key, l, cost); return err }
	}
	for _, c := range []struct {
		name  string
		write []func(key string) error
		read  algorithms.Limit
	}{
		{"fresh", nil, l},
		{"partly spent", []func(string) error{decide(2)}, l},
		{"exhausted", []func(string) error{decide(5)}, l},
		{"in debt", []func(string) error{func(key string) error {
			_, err := s.Rate(ctx, "peek", key, zones.RateStep{Op: zones.OpCharge, Limit: l, Cost: 8})
			return err
		}}, l},
		{"a delay's reservation", []func(string) error{decide(5), func(key string) error {
			r, err := stepDecideAhead(s, ctx, "peek", key, l, 1, int64(2*peekT))
			if err == nil && !r.Allowed {
				t.Errorf("the reservation was denied: %+v", r)
			}
			return err
		}}, l},
		{"refunded", []func(string) error{decide(3), func(key string) error { return stepRefund(s, ctx, "peek", key, l, 1) }}, l},
		{"read under another plan", []func(string) error{decide(3)}, other},
	} {
		key := c.name
		for _, w := range c.write {
			if err := w(key); err != nil {
				t.Fatalf("%s: writing the key: %v", c.name, err)
			}
		}
		before := redisMicros(t, ctx, rs)
		micro := c.read
		micro.EmissionInterval /= 1000
		want, err := s.EvalAt(ctx, distributed.OpPeek, "peek", key, micro, 1, before)
		if err != nil {
			t.Fatalf("%s: the script's peek: %v", c.name, err)
		}
		got, err := stepPeek(s, ctx, "peek", key, c.read)
		if err != nil {
			t.Fatalf("%s: the read's peek: %v", c.name, err)
		}
		passed := redisMicros(t, ctx, rs) - before
		reset, retry := got.ResetAfter/1000, got.RetryAfter/1000
		if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
			reset < want.ResetAfter-passed-1000 || reset > want.ResetAfter+2000 ||
			retry < want.RetryAfter-passed-3000 || retry > want.RetryAfter {
			t.Errorf("%s: the read's peek %+v (µs: reset %d, retry %d); the script's, %d µs earlier, %+v", c.name, got, reset, retry, passed, want)
		}
	}
}

// A peek right after a decision says that decision's remaining, what the
// request's RateLimit header said, also for a fresh key, whose TAT is then
// exactly cost·T ahead: the TTL gcra.lua rounds up to a whole ms never
// reads as more spent than the key is.
func TestReadPeekRightAfterADecisionSaysItsRemaining(t *testing.T) {
	rs := startRedis(t)
	s := openStore(t, distributed.Options{Addresses: []string{rs.Addr}, Timeout: time.Second}, nil)
	ctx := t.Context()
	l := algorithms.NewLimit(10, int64(10*peekT), 0)
	for i := range 500 {
		key := strconv.Itoa(i)
		d, err := stepDecide(s, ctx, "after", key, l, int64(1+i%3))
		if err != nil || !d.Allowed {
			t.Fatalf("decision %d: %+v, %v", i, d, err)
		}
		p, err := stepPeek(s, ctx, "after", key, l)
		if err != nil || p.Remaining != d.Remaining {
			t.Fatalf("decision %d (cost %d) said remaining %d, the peek right after it %d (%v)", i, 1+i%3, d.Remaining, p.Remaining, err)
		}
	}
}

// redisMicros is Redis's clock in µs, as gcra.lua reads it.
func redisMicros(t *testing.T, ctx context.Context, rs *redisServer) int64 {
	t.Helper()
	now, err := rs.Client().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}
