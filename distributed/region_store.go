package distributed

import (
	"context"
	"math"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Shared is the store a `scope global` zone decides with: the regional
// store (strict or async, exactly as for a zone of scope region), given the
// key's limit scaled to this region's share of it, and counting each
// decision for the region's demand. Make one with Region.Wrap.
type Shared struct {
	inner  zones.Store
	region *Region
}

// SharedRecords is Shared over an async store: it keeps the zone's records
// as the async store does (zones.RecordStore).
type SharedRecords struct {
	Shared
	records zones.RecordStore
}

// SharedBans is Shared over a strict store with bans (zones.BanStore).
type SharedBans struct {
	Shared
	bans zones.BanStore
}

// Wrap returns the store a `scope global` zone of the region decides
// with, over the regional store inner, and makes the zone (whose whole
// limit is limit, ns) global in the region.
func (r *Region) Wrap(inner zones.Store, zone string, limit algorithms.Limit) zones.Store {
	r.AddZone(zone, limit)
	s := Shared{inner: inner, region: r}
	if rec, ok := inner.(zones.RecordStore); ok {
		return &SharedRecords{Shared: s, records: rec}
	}
	if b, ok := inner.(zones.BanStore); ok {
		return &SharedBans{Shared: s, bans: b}
	}
	return &s
}

// Region is the region whose share the store applies.
func (s *Shared) Region() *Region { return s.region }

// Scale is limit at share (ppm): the emission interval divided by the
// share, the burst multiplied by it (at least 1). Shares summing to at
// most ShareScale give rates summing to at most the limit's, and bursts to
// at most its burst plus one per region whose share rounds it to 0. The
// burst's span B·T is the same at every share (but for rounding), so that
// a key's debt means the same at every share: a cut takes tokens away at
// once, and a raise, rescaled by the coordinator (see plantScript), adds
// none.
func Scale(limit algorithms.Limit, share int64) algorithms.Limit {
	if share >= ShareScale {
		return limit
	}
	share = max(1, share)
	t := float64(limit.EmissionInterval) * ShareScale / float64(share)
	if t > math.MaxInt64/4 {
		t = math.MaxInt64 / 4
	}
	return algorithms.Limit{EmissionInterval: int64(t), Burst: max(1, limit.Burst*share/ShareScale)}
}

func (s *Shared) limit(zone, key string, l algorithms.Limit) algorithms.Limit {
	return Scale(l, s.region.Share(zone, key))
}

// Decide decides key at this region's share of limit.
func (s *Shared) Decide(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	r, err := s.inner.Decide(ctx, zone, key, s.limit(zone, key, limit), cost)
	if err == nil {
		s.region.count(zone, key, r.Allowed, cost, limit)
	}
	return r, err
}

// DecideAhead is Decide in a zone with delay (zones.DelayStore), when the
// regional store reserves for later; else Decide.
func (s *Shared) DecideAhead(ctx context.Context, zone, key string, limit algorithms.Limit, cost, ahead int64) (algorithms.Result, error) {
	ds, ok := s.inner.(zones.DelayStore)
	if !ok {
		return s.Decide(ctx, zone, key, limit, cost)
	}
	r, err := ds.DecideAhead(ctx, zone, key, s.limit(zone, key, limit), cost, ahead)
	if err == nil {
		s.region.count(zone, key, r.Allowed, cost, limit)
	}
	return r, err
}

// Refund gives back cost at this region's share of limit.
func (s *Shared) Refund(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) error {
	return s.inner.Refund(ctx, zone, key, s.limit(zone, key, limit), cost)
}

// Peek reports key at this region's share of limit.
func (s *Shared) Peek(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	return s.inner.Peek(ctx, zone, key, s.limit(zone, key, limit))
}

// Check is Peek on the request path.
func (s *Shared) Check(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, error) {
	r, err := s.inner.Check(ctx, zone, key, s.limit(zone, key, limit))
	if err == nil && !r.Allowed {
		s.region.count(zone, key, false, 1, limit)
	}
	return r, err
}

// Charge charges key at this region's share of limit.
func (s *Shared) Charge(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64) (algorithms.Result, error) {
	r, err := s.inner.Charge(ctx, zone, key, s.limit(zone, key, limit), cost)
	if err == nil {
		s.region.count(zone, key, true, cost, limit)
	}
	return r, err
}

// Reset deletes key's regional state (its share is the global store's).
func (s *Shared) Reset(ctx context.Context, zone, key string) error {
	return s.inner.Reset(ctx, zone, key)
}

// Instances is the regional instance count divided by the region's
// weight: fail_policy local divides the region's default share between
// the region's instances.
func (s *Shared) Instances() int {
	n := int64(max(1, s.inner.Instances()))
	return int(min(math.MaxInt32, (n*ShareScale+s.region.weight-1)/max(1, s.region.weight)))
}

// Mode is the regional store's mode.
func (s *Shared) Mode() string {
	if m, ok := s.inner.(zones.ModeStore); ok {
		return m.Mode()
	}
	return "strict"
}

// Inner is the regional store.
func (s *Shared) Inner() zones.Store { return s.inner }

// SetMaxKeys caps the async store's records for zone.
func (s *SharedRecords) SetMaxKeys(zone string, n int) { s.records.SetMaxKeys(zone, n) }

// Keys is the number of records the async store keeps for zone.
func (s *SharedRecords) Keys(zone string) int { return s.records.Keys(zone) }

// DeniedUntil is the async store's deny cache.
func (s *SharedRecords) DeniedUntil(zone, key string, now int64) (int64, bool) {
	return s.records.DeniedUntil(zone, key, now)
}

// Fallback is the async store's fail_policy local step at this region's
// share of limit.
func (s *SharedRecords) Fallback(zone, key string, now int64, limit, share algorithms.Limit, op zones.FallbackOp, cost, ahead int64) algorithms.Result {
	return s.records.Fallback(zone, key, now, s.limit(zone, key, limit), share, op, cost, ahead)
}

// DecideBan is Decide in a zone with a ban.
func (s *SharedBans) DecideBan(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64, rule zones.BanRule) (algorithms.Result, zones.StoreBan, error) {
	r, b, err := s.bans.DecideBan(ctx, zone, key, s.limit(zone, key, limit), cost, rule)
	if err == nil {
		s.region.count(zone, key, r.Allowed, cost, limit)
	}
	return r, b, err
}

// DecideBanAhead is DecideBan in a zone with delay (zones.DelayBanStore),
// when the regional store reserves for later; else DecideBan.
func (s *SharedBans) DecideBanAhead(ctx context.Context, zone, key string, limit algorithms.Limit, cost int64, rule zones.BanRule, ahead int64) (algorithms.Result, zones.StoreBan, error) {
	ds, ok := s.bans.(zones.DelayBanStore)
	if !ok {
		return s.DecideBan(ctx, zone, key, limit, cost, rule)
	}
	r, b, err := ds.DecideBanAhead(ctx, zone, key, s.limit(zone, key, limit), cost, rule, ahead)
	if err == nil {
		s.region.count(zone, key, r.Allowed, cost, limit)
	}
	return r, b, err
}

// CheckBan is Check in a zone with a ban.
func (s *SharedBans) CheckBan(ctx context.Context, zone, key string, limit algorithms.Limit, rule zones.BanRule) (algorithms.Result, zones.StoreBan, error) {
	return s.bans.CheckBan(ctx, zone, key, s.limit(zone, key, limit), rule)
}

// PeekBan is Peek with the key's ban.
func (s *SharedBans) PeekBan(ctx context.Context, zone, key string, limit algorithms.Limit) (algorithms.Result, zones.StoreBan, error) {
	return s.bans.PeekBan(ctx, zone, key, s.limit(zone, key, limit))
}

// Interface guards.
var (
	_ zones.Store         = (*Shared)(nil)
	_ zones.ModeStore     = (*Shared)(nil)
	_ zones.RecordStore   = (*SharedRecords)(nil)
	_ zones.BanStore      = (*SharedBans)(nil)
	_ zones.DelayStore    = (*Shared)(nil)
	_ zones.DelayBanStore = (*SharedBans)(nil)
)
