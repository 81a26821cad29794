package distributed

import (
	"cmp"
	"context"
	"hash/fnv"
	"maps"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// coordinator is the region's coordinator state, kept by the instance that
// holds the lock, afresh when it takes it (sync loop only).
type coordinator struct {
	token     int64                 // fencing token; 0: not the coordinator
	lockedAt  int64                 // monotime of the last lock renewal
	held      map[string]*coordZone // per zone
	epoch     string                // of the global store, as last heard
	full      bool                  // the next sync reports in full
	contact   int64                 // monotime the last successful sync was sent; 0: none
	lastSync  int64
	confirmAt int64 // monotime a cut's margin ends (0: none pending)
	waitUntil int64 // monotime: sync every poll until then, a raise waits on another region's cut
	down      bool  // an outage is being logged
}

// coordZone is a zone's keys' holdings (none: the weight), what the global
// store last heard, and the span (µs) of a key last counted with a plan's
// limit (plant's).
type coordZone struct {
	held  map[string]*holding
	sent  map[string]*lastReport
	spans map[string]int64
}

// zone is the coordinator's state of the zone named, made on first use.
func (c *coordinator) zone(name string) *coordZone {
	if c.held[name] == nil {
		c.held[name] = &coordZone{map[string]*holding{}, map[string]*lastReport{}, map[string]int64{}}
	}
	return c.held[name]
}

// holding is one key's share as published in the region. After a cut the
// old share is reported held until every instance has read the new one
// (prevUntil): that report is the cut's confirmation.
type holding struct{ cur, prev, prevUntil int64 }

type lastReport struct{ wants, held, at int64 }

// due says whether a sync not in full reports key, last reported as s
// (nil: never; docs/distributed.md, "What a sync reports"); the refresh
// period is 3/4 to all of Refresh by the key's hash, to spread refreshes.
func (r *Region) due(s *lastReport, key string, wants, held, now int64) bool {
	if s == nil || s.held != held || (s.wants < 0) != (wants < 0) {
		return true
	}
	if wants >= 0 && 10*max(wants-s.wants, s.wants-wants) > s.wants {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	refresh := int64(r.opts.Refresh)
	return now-s.at >= refresh-int64(h.Sum32())%(refresh/4+1)
}

func (r *Region) tick(now int64) {
	c := &r.coord
	interval := int64(r.opts.SyncInterval)
	if now-c.lockedAt >= interval || c.token == 0 && now-c.lockedAt >= int64(r.pollInterval()) {
		r.lock(now)
	}
	if c.token != 0 && (now-c.lastSync >= interval || c.confirmAt != 0 && now >= c.confirmAt || now < c.waitUntil) {
		r.sync(now, now-c.lastSync < interval)
	}
}

// lock takes or renews the coordinator lock (its TTL outlasts a slow sync);
// a new holder reports in full first.
func (r *Region) lock(now int64) {
	c := &r.coord
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.SyncInterval)
	defer cancel()
	tok, err := regionScript.Run(ctx, r.regional, r.set.Load().keys, "lock", r.member, (3*r.opts.SyncInterval + r.opts.Global.Timeout).Milliseconds()).Int64()
	if err != nil {
		return // the lock expires; another instance may take it
	}
	c.lockedAt = now
	if tok == 0 {
		if c.token != 0 {
			r.logger.Info("another instance coordinates this region's global shares now", zap.String("region", r.opts.Region))
		}
		r.resign()
		return
	}
	if tok != c.token {
		c.token, c.full = tok, true
		c.held = map[string]*coordZone{} // sync adopts the zones
		c.contact = r.contactAt.Load()   // the last contact the region published
		r.stats.Coordinating.Store(true)
	}
}

// report is a sync's report of a zone's keys.
type report struct {
	zone string
	keys map[string]*lastReport
}

// sync reports the region's hot keys and holdings to the global store and
// publishes its grants. atPoll: less than an interval after the last (a
// cut's margin ended, a raise waits on a cut), its collect spans about one
// poll and may hold none of the instances' pushes (see reports).
func (r *Region) sync(now int64, atPoll bool) {
	c := &r.coord
	lockVal := r.member + "|" + strconv.FormatInt(c.token, 10)
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.SyncInterval)
	defer cancel()
	set := r.set.Load() // one set of zones for the whole sync
	maps.DeleteFunc(c.held, func(name string, _ *coordZone) bool { return set.byName[name] == nil })
	for _, z := range set.zones {
		if c.held[z.name] != nil {
			continue
		}
		// new to this coordinator: it holds the region's shares as this
		// instance last read them, once it has read what was published
		m := z.shares.Load()
		if m == nil {
			return
		}
		held := c.zone(z.name).held
		for k, s := range *m {
			held[k] = &holding{cur: s}
		}
	}
	raw, err := regionScript.Run(ctx, r.regional, set.keys, "collect", lockVal).Slice()
	if err != nil {
		return
	}
	if len(raw) == 1 && raw[0] == int64(-1) {
		r.resign()
		return
	}
	elapsed := max(now-c.lastSync, int64(r.pollInterval()))
	if c.lastSync == 0 {
		elapsed = int64(r.opts.SyncInterval)
	}
	c.lastSync = now
	// past the lease and the margin, every instance applies its floor
	floored := c.contact == 0 || time.Duration(now-c.contact) > r.opts.Lease+r.confirmMargin()
	c.full = c.full || floored
	reports := r.reports(set.zones, now, raw, elapsed, floored, atPoll)
	if r.exchange(lockVal, set, reports, floored) {
		// the global store lost its state: report in full at once
		r.exchange(lockVal, set, r.reports(set.zones, now, raw, elapsed, floored, atPoll), floored)
	}
	// this sync confirmed the cuts whose margin ended; the next confirms
	// the first still running
	c.confirmAt = 0
	for _, cz := range c.held {
		for _, h := range cz.held {
			if h.prevUntil > now && (c.confirmAt == 0 || h.prevUntil < c.confirmAt) {
				c.confirmAt = h.prevUntil
			}
		}
	}
}

// reports builds a sync's reports from the collected counts (raw) and the
// holdings: in full, every hot key and holding; else the keys due.
func (r *Region) reports(zs []*regionZone, now int64, raw []any, elapsed int64, floored, atPoll bool) []report {
	c := &r.coord
	reports := make([]report, len(zs))
	rd := reader(raw)
	for zi, z := range zs {
		rep := report{zone: z.name, keys: map[string]*lastReport{}}
		cz := c.zone(z.name)
		// add reports key if due, with what the region holds (h nil: its weight)
		add := func(key string, wants int64, h *holding) {
			hv := r.applied(h, floored)
			if !floored && h != nil && now < h.prevUntil { // a cut's old share, until its confirmation
				hv = max(h.cur, h.prev)
			}
			if c.full || r.due(cz.sent[key], key, wants, hv, now) {
				rep.keys[key] = &lastReport{wants: wants, held: hv, at: now}
			}
		}
		hot := map[string]bool{}
		for range rd.n(4) {
			key, adm, den, span := rd.str(), rd.int(), rd.int(), rd.int()
			if span > 0 {
				cz.spans[key] = span
			} else {
				delete(cz.spans, key)
			}
			share := r.applied(cz.held[key], floored)
			// use: the fraction of the key's whole rate admitted
			use := float64(adm) * float64(z.interval.Load()) / float64(elapsed)
			wants := int64(ShareScale)
			if den <= 0 {
				if use*ShareScale < 0.8*float64(share) {
					continue
				}
				wants = int64(min(ShareScale, 1.2*use*ShareScale))
			}
			hot[key] = true
			add(key, wants, cz.held[key])
		}
		// gone is the demand of a key not hot in this collect: none, but at a
		// poll the last reported (instances push on tickers of their own).
		gone := func(key string) int64 {
			if s := cz.sent[key]; atPoll && s != nil && s.wants >= 0 {
				return s.wants
			}
			return -1
		}
		for key, h := range cz.held {
			if !hot[key] {
				add(key, gone(key), h)
			}
		}
		for key, s := range cz.sent {
			if !hot[key] && cz.held[key] == nil && s.wants >= 0 {
				add(key, gone(key), nil) // demand last reported, neither hot nor held now: gone
			}
		}
		reports[zi] = rep
	}
	return reports
}

// applied is the share the region applies of a key held as h (nil: the weight).
func (r *Region) applied(h *holding, floored bool) int64 {
	if floored {
		return r.floor
	}
	if h == nil {
		return r.weight
	}
	return h.cur
}

// noteSent records what the global store heard (after a full sync, only
// that); a key with neither demand nor holding is forgotten.
func (c *coordinator) noteSent(reports []report, full bool) {
	for _, rep := range reports {
		cz := c.zone(rep.zone)
		if full {
			clear(cz.sent)
		}
		maps.Copy(cz.sent, rep.keys)
		maps.DeleteFunc(cz.sent, func(k string, s *lastReport) bool { return s.wants < 0 && cz.held[k] == nil })
		maps.DeleteFunc(cz.spans, func(k string, _ int64) bool { return cz.sent[k] == nil && cz.held[k] == nil })
	}
}

// exchange sends the reports to the global store and publishes the grants;
// again: the global store has a new epoch, report in full at once.
func (r *Region) exchange(lockVal string, set *zoneSet, reports []report, floored bool) (again bool) {
	c := &r.coord
	// in full until the grants are published: the store may have run this
	// sync and lost its reply
	full := c.full
	c.full = true
	// a coordinator still syncing re-reports the key well before the TTL
	demandTTL := 2*r.opts.Refresh + r.opts.Global.Timeout + r.opts.SyncInterval
	args := []any{r.opts.Region, c.token, c.epoch, b2i(full), r.opts.Lease.Milliseconds(),
		demandTTL.Milliseconds(), r.spec, r.opts.Global.KeyPrefix, len(reports)}
	for _, rep := range reports {
		args = append(args, rep.zone, len(rep.keys))
		for k, s := range rep.keys {
			args = append(args, k, s.wants, s.held)
		}
	}
	if h := r.hold.Swap(nil); h != nil {
		release := make(chan struct{})
		*h <- release
		<-release
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(r.opts.SyncInterval, r.opts.Global.Timeout))
	defer cancel()
	sent := monotime.Now()
	r.stats.Syncs.Add(1)
	v, err := globalScript.Run(ctx, r.global, []string{r.opts.Global.KeyPrefix + "g.epoch"}, args...).Slice()
	r.stats.LastLatency.Store(monotime.Now() - sent)
	pctx, pcancel := context.WithTimeout(context.Background(), 2*r.timeout+r.pollInterval())
	defer pcancel()
	if err != nil || len(v) < 1 {
		r.stats.Failures.Add(1)
		if !c.down {
			c.down = true
			r.logger.Warn("global store unreachable: this region keeps its last shares of global zones, falling back to its floor after the lease",
				zap.String("region", r.opts.Region), zap.Duration("lease", r.opts.Lease), zap.Error(err))
		}
		r.publish(pctx, lockVal, set.keys, make([][]any, len(set.zones)), -1, false) // the TTLs only
		return false
	}
	rd := reader(v)
	switch rd.str() {
	case "FENCED":
		r.stats.Fenced.Add(1)
		r.logger.Warn("the global store refused this region's coordinator as stale (another took over)", zap.String("region", r.opts.Region))
		r.resign()
		return false
	case "EPOCH":
		c.epoch = rd.str()
		return true
	}
	r.stats.Contacts.Add(1)
	if c.down {
		c.down = false
		r.logger.Info("global store reachable again", zap.String("region", r.opts.Region))
	}
	if len(v) < 4 {
		return false
	}
	c.epoch = rd.str()
	learning, waiting := rd.int() == 1, rd.int() == 1
	now := monotime.Now()
	// Grants take effect once published; until then the region applies and
	// reports what it held. Published: those that change what the region
	// applies (in full: every grant; a floored region syncs in full).
	var updates []update
	published := make([][]any, len(reports)) // per zone, key and share pairs
	for zi, rep := range reports {
		rd.next() // the zone's name: the reply's zones are the reports'
		cz := c.zone(rep.zone)
		for range rd.n(2) {
			key, g := rd.str(), rd.int()
			h := cz.held[key]
			if h == nil {
				h = &holding{cur: r.weight}
				cz.held[key] = h
			}
			u := update{set.zones[zi], cz, key, h, rep.keys[key], g, r.applied(h, floored)}
			if g != u.from || full {
				pub := g
				if pub == r.weight {
					pub = -1 // back to the weight
				}
				published[zi] = append(published[zi], key, pub)
			}
			updates = append(updates, u)
		}
	}
	if !r.plant(pctx, updates) || !r.publish(pctx, lockVal, set.keys, published, (now-sent)/int64(time.Millisecond), full) {
		return false
	}
	c.contact = sent
	c.full = learning // a learning store: in full until done
	now = monotime.Now()
	if waiting && c.waitUntil == 0 {
		// the other region's next sync and its cut's margin, round trips
		c.waitUntil = now + int64(r.opts.SyncInterval+r.confirmMargin()) + 2*(now-sent)
	}
	for _, u := range updates {
		h := u.h
		if u.g > u.from && !waiting {
			c.waitUntil = 0 // the raise came
		}
		if u.g < u.from { // a cut
			if now >= h.prevUntil {
				h.prev = 0 // the last cut is in force everywhere: what it cut is gone
			}
			h.prev, h.prevUntil = max(h.prev, h.cur, u.g), now+int64(r.confirmMargin())
			if floored {
				h.prev = max(h.prev, r.floor)
			}
		}
		if u.g != h.cur {
			r.stats.ShareChanges.Add(1)
		}
		h.cur = u.g
		if u.sent != nil && u.sent.held == r.weight && u.g == r.weight && now >= h.prevUntil {
			delete(u.cz.held, u.key) // the global store knows it is back to the weight
		}
	}
	c.noteSent(reports, full)
	return false
}

// update is a key's grant g, from what the region applied; sent: this
// sync's report (nil: none).
type update struct {
	z       *regionZone
	cz      *coordZone
	key     string
	h       *holding
	sent    *lastReport
	g, from int64
}

// plantScript rescales a raised key before its raise is published, so
// that a raise adds no tokens at once: debt' = B·T − (B·T − debt)·from/to
// (see docs/distributed.md, "The bound"). The TTL becomes the new
// resetAfter or the old one if longer (a ban remembered); a value tally did
// not write is left alone. An async key's TAT is its hash's field t (a key
// with no state starts its episode, c, then).
// KEYS[1]: the key; ARGV: from, to (ppm), span (µs), 1 for an async key.
// One key per call: keys of a Cluster are in many slots.
var plantScript = redis.NewScript(`local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local from, to, span = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local hash = ARGV[4] == '1'
local raw
if hash then raw = redis.pcall('HGET', KEYS[1], 't') else raw = redis.pcall('GET', KEYS[1]) end
local tat, rest = now, ''
if raw then
  local v
  if type(raw) == 'string' then v, rest = string.match(raw, '^(%d+)(.*)$') end -- "TAT" or "TAT,<ban>"
  tat = tonumber(v)
end
if not tat then return 0 end
local debt = math.max(0, tat - now)
local d = span - math.floor((span - debt) * (from / to))
if d <= debt then return 0 end
local ms = math.floor((d + 999) / 1000)
local left = redis.call('PTTL', KEYS[1])
if left > ms then ms = left end
if not hash then
  redis.call('SET', KEYS[1], string.format('%d', now + d) .. rest, 'PX', ms)
  return 1
end
redis.call('HSET', KEYS[1], 't', string.format('%d', now + d))
if not raw then redis.call('HSET', KEYS[1], 'c', string.format('%d', now)) end
redis.call('PEXPIRE', KEYS[1], ms)
return 1`)

// plant rescales the raised keys (plantScript) with the key's last counted
// span or the zone's; false: not published.
func (r *Region) plant(ctx context.Context, updates []update) bool {
	_, err := r.regional.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, x := range updates {
			if x.g <= x.from {
				continue // not a raise
			}
			// the key's last counted span, else the zone's in µs, as
			// gcra.lua sees it
			span := cmp.Or(x.cz.spans[x.key], max(1, x.z.interval.Load()/1000)*x.z.burst.Load())
			key, hash := r.prefix+x.z.name+":"+x.key, "0"
			if r.async {
				key, hash = r.prefix+x.z.name+asyncZoneSep+x.key, "1"
			}
			plantScript.Eval(ctx, p, []string{key}, x.from, x.g, span, hash)
		}
		return nil
	})
	return err == nil // the first failed command's error
}

// publish writes per zone pairs of key and share (-1: back to the weight)
// to the regional Redis, replacing every share in full, and the last
// contact (age ms, -1: keep).
func (r *Region) publish(ctx context.Context, lockVal string, keys []string, shares [][]any, age int64, full bool) bool {
	args := []any{"publish", lockVal, age, (4 * r.opts.Lease).Milliseconds(), b2i(full), len(shares)}
	for _, zs := range shares {
		args = append(append(args, len(zs)/2), zs...)
	}
	v, err := regionScript.Run(ctx, r.regional, keys, args...).Slice()
	return err == nil && len(v) == 1 && v[0] == int64(1)
}

// resign notes that this instance no longer coordinates the region.
func (r *Region) resign() {
	r.coord.token = 0
	r.stats.Coordinating.Store(false)
}
