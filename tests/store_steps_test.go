package tests

import (
	"context"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// The steps of a zones.Store by name, as the tests read best: a store
// offers one operation per zone kind, the step as data.

func stepDecide(s zones.Store, ctx context.Context, zone, key string, l algorithms.Limit, cost int64) (algorithms.Result, error) {
	rep, err := s.Rate(ctx, zone, key, zones.RateStep{Op: zones.OpDecide, Limit: l, Cost: cost})
	return rep.Result, err
}

func stepDecideAhead(s zones.Store, ctx context.Context, zone, key string, l algorithms.Limit, cost, ahead int64) (algorithms.Result, error) {
	rep, err := s.Rate(ctx, zone, key, zones.RateStep{Op: zones.OpDecide, Limit: l, Cost: cost, Ahead: ahead})
	return rep.Result, err
}

func stepDecideBanAhead(s zones.Store, ctx context.Context, zone, key string, l algorithms.Limit, cost int64, rule zones.BanRule, ahead int64) (algorithms.Result, zones.StoreBan, error) {
	rep, err := s.Rate(ctx, zone, key, zones.RateStep{Op: zones.OpDecide, Limit: l, Cost: cost, Ahead: ahead, Ban: rule})
	return rep.Result, rep.Ban, err
}

func stepRefund(s zones.Store, ctx context.Context, zone, key string, l algorithms.Limit, cost int64) error {
	_, err := s.Rate(ctx, zone, key, zones.RateStep{Op: zones.OpRefund, Limit: l, Cost: cost})
	return err
}

func stepPeek(s zones.Store, ctx context.Context, zone, key string, l algorithms.Limit) (algorithms.Result, error) {
	rep, err := s.Rate(ctx, zone, key, zones.RateStep{Op: zones.OpPeek, Limit: l, Cost: 1})
	return rep.Result, err
}

func stepReset(s zones.Store, ctx context.Context, zone, key string) error {
	_, err := s.Rate(ctx, zone, key, zones.RateStep{Op: zones.OpReset})
	return err
}

func stepQuota(s zones.Store, ctx context.Context, op zones.Op, zone, key string, q zones.QuotaLimit, cost int64) (zones.QuotaResult, error) {
	return s.Quota(ctx, zone, key, zones.QuotaStep{Op: op, Limit: q, Cost: cost})
}

func stepDecideQuota(s zones.Store, ctx context.Context, zone, key string, q zones.QuotaLimit, cost int64) (zones.QuotaResult, error) {
	return stepQuota(s, ctx, zones.OpDecide, zone, key, q, cost)
}

func stepCheckQuota(s zones.Store, ctx context.Context, zone, key string, q zones.QuotaLimit) (zones.QuotaResult, error) {
	return stepQuota(s, ctx, zones.OpCheck, zone, key, q, 0)
}

func stepChargeQuota(s zones.Store, ctx context.Context, zone, key string, q zones.QuotaLimit, cost int64) (zones.QuotaResult, error) {
	return stepQuota(s, ctx, zones.OpCharge, zone, key, q, cost)
}

func stepPeekQuota(s zones.Store, ctx context.Context, zone, key string, q zones.QuotaLimit) (zones.QuotaResult, error) {
	return stepQuota(s, ctx, zones.OpPeek, zone, key, q, 0)
}

func stepRefundQuota(s zones.Store, ctx context.Context, zone, key string, q zones.QuotaLimit, cost int64) error {
	_, err := stepQuota(s, ctx, zones.OpRefund, zone, key, q, cost)
	return err
}

// mustZone is zones.New for a zone the test knows its store accepts.
func mustZone(c zones.Config, s *zones.State, store zones.Store) *zones.Zone {
	z, err := zones.New(c, s, store)
	if err != nil {
		panic(err)
	}
	return z
}
