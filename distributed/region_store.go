package distributed

import (
	"context"
	"errors"
	"math"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/zones"
)

// Shared is the store a `scope global` zone decides with (Region.Wrap):
// the regional store at the region's share of the key's limit, counting
// the steps that say something of the key's demand. It offers what the
// regional store offers but quotas and slots, its records at the share.
type Shared struct {
	zones.Records // inner's (async mode), or nil; Fallback and Peek at the share
	inner         zones.Store
	offers        zones.Offers // inner's
	region        *Region
}

// Wrap returns the store a `scope global` zone of the region decides
// with, over the regional store inner, and makes the zone (whose whole
// limit is limit, ns) global in the region.
func (r *Region) Wrap(inner zones.Store, zone string, limit algorithms.Limit) *Shared {
	r.AddZone(zone, limit)
	o := inner.Offers()
	return &Shared{Records: o.Records, inner: inner, offers: o, region: r}
}

// Region is the region whose share the store applies.
func (s *Shared) Region() *Region { return s.region }

// Scale is limit at share (ppm): the emission interval divided by the
// share, the burst multiplied by it (at least 1). The span B·T is the same
// at every share, so a key's debt means the same at each (see plantScript).
func Scale(limit algorithms.Limit, share int64) algorithms.Limit {
	if share >= ShareScale {
		return limit
	}
	share = max(1, share)
	t := min(float64(limit.EmissionInterval)*ShareScale/float64(share), math.MaxInt64/4)
	return algorithms.Limit{EmissionInterval: int64(t), Burst: max(1, limit.Burst*share/ShareScale)}
}

// Rate runs st at this region's share of its limit. A decision, a failed
// check and a charge count for the region's demand (a ban's denial too);
// a peek, a refund and a reset do not.
func (s *Shared) Rate(ctx context.Context, zone, key string, st zones.RateStep) (zones.RateReply, error) {
	whole := st.Limit
	if st.Op != zones.OpReset {
		st.Limit = Scale(whole, s.region.Share(zone, key))
	}
	rep, err := s.inner.Rate(ctx, zone, key, st)
	if err != nil {
		return rep, err
	}
	switch {
	case st.Op == zones.OpDecide, st.Op == zones.OpCharge:
		s.region.count(zone, key, rep.Allowed || st.Op == zones.OpCharge, st.Cost, whole)
	case st.Op == zones.OpCheck && !rep.Allowed:
		s.region.count(zone, key, false, 1, whole)
	}
	return rep, nil
}

// Quota is not offered: scope global is for rate zones.
func (s *Shared) Quota(context.Context, string, string, zones.QuotaStep) (zones.QuotaResult, error) {
	return zones.QuotaResult{}, errors.New("distributed: scope global zones keep no quotas")
}

// Offers is the regional store's without quotas and slots, with this
// store's records; a denial from the deny cache counts as demand too (at a
// small share its retry time is longer than a sync interval).
func (s *Shared) Offers() zones.Offers {
	o := s.offers
	o.Quotas, o.Slots = false, nil
	o.Denied = func(zone, key string, l algorithms.Limit) { s.region.count(zone, key, false, 1, l) }
	if o.Records != nil {
		o.Records = s
	}
	return o
}

// Instances is the regional instance count divided by the region's
// weight: fail_policy local splits the region's default share.
func (s *Shared) Instances() int {
	n := int64(max(1, s.inner.Instances()))
	return int(min(math.MaxInt32, (n*ShareScale+s.region.weight-1)/max(1, s.region.weight)))
}

// Fallback is the async store's fail_policy local step at this region's
// share of limit.
func (s *Shared) Fallback(zone, key string, now int64, limit, share algorithms.Limit, op zones.Op, cost, ahead int64) algorithms.Result {
	return s.Records.Fallback(zone, key, now, Scale(limit, s.region.Share(zone, key)), share, op, cost, ahead)
}

// Peek is the async store's record of key at this region's share of limit.
func (s *Shared) Peek(zone, key string, now int64, limit algorithms.Limit) (algorithms.Result, bool) {
	return s.Records.Peek(zone, key, now, Scale(limit, s.region.Share(zone, key)))
}

// Interface guards.
var (
	_ zones.Store   = (*Shared)(nil)
	_ zones.Records = (*Shared)(nil)
)
