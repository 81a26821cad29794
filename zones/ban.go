package zones

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddy-tally/ratelimit/internal/keytable"
)

// Bans (`ban <first> [<max>]`, docs/configuration.md#bans): a key the zone
// denies for lack of quota is then denied for the ban's length, a floor on
// its retry time: banned requests consume nothing, so a ban never admits
// more than the zone without one. With max > first the n-th ban lasts
// first·2^(n-1), at most max, while the key is remembered (max after its
// last ban ends; a lift forgets the level too). A running ban is never
// evicted: a full table makes room only from ended bans, and a ban that
// finds none is dropped and counted (Zone.OnBanDropped), so that a flood of
// banned keys cannot lift running bans. A key's state is one entry of
// State.Bans (BanEntry).

// sweepBans drops the entries past their memory; with none left, lookups
// are skipped until the next ban (anyBan): one atomic load per request.
func (s *State) sweepBans(now int64) {
	s.banMu.Lock()
	defer s.banMu.Unlock()
	if s.Bans.Sweep(now) == 0 {
		s.anyBan.Store(false)
	}
}

// banLevels is one more than the highest escalation level; levels live in
// the low bits of a ban entry. first·2^62 is past any representable ban.
const banLevels = 64

// MaxBan is the longest ban: the longest span tally represents.
const MaxBan = MaxSpan

// BanEntry is a key's ban as State.Bans holds it, in the monotonic clock of
// a TAT: end+memory rounded up to a multiple of banLevels, the level (1 for
// the first) in its low bits.
func BanEntry(end int64, level int, memory time.Duration) int64 {
	v := satAdd(end, int64(memory))
	if r := v % banLevels; r != 0 {
		v = satAdd(v, banLevels-r)
	}
	return v - v%banLevels + int64(min(max(level, 1), banLevels-1))
}

// ParseBanEntry is BanEntry's inverse, to within banLevels nanoseconds of
// the end (never earlier).
func ParseBanEntry(v int64, memory time.Duration) (end int64, level int) {
	return v - v%banLevels - int64(memory), int(v % banLevels)
}

func satAdd(a, b int64) int64 {
	if s := a + b; (s > a) == (b > 0) {
		return s
	}
	if b > 0 {
		return 1<<63 - 1 - banLevels
	}
	return -1 << 63
}

func (c Config) validateBan() error {
	switch {
	case c.Ban == 0 && c.BanMax == 0:
		return nil
	case c.IsConcurrency():
		return errors.New("ban is for rate zones: a concurrency zone's denials end as requests finish, not with time; remove ban")
	case c.IsQuota():
		return errors.New("ban is for rate zones: a quota zone's denial already lasts until its period ends; remove ban, or put a rate zone with ban beside it")
	case c.Ban <= 0:
		return errors.New("ban must be a positive duration (e.g. ban 1h)")
	case c.Ban > MaxBan || c.BanMax > MaxBan:
		return fmt.Errorf("a ban longer than the %d years tally can represent", MaxBan/(365*24*time.Hour))
	case c.BanMax != 0 && c.BanMax < c.Ban:
		return fmt.Errorf("ban %v %v: the longest ban is shorter than the first; write ban <first> <max> with max >= first", c.Ban, c.BanMax)
	}
	return nil
}

// BanMemory is how long after its last ban a key is remembered for
// escalation: max, or 0 without escalation.
func (c Config) BanMemory() time.Duration {
	if c.BanMax > c.Ban {
		return c.BanMax
	}
	return 0
}

// banLength is the length of a ban at level (1 for the first).
func (c Config) banLength(level int) time.Duration {
	if c.BanMax <= c.Ban {
		return c.Ban
	}
	d := c.Ban
	for i := 1; i < level && d < c.BanMax; i++ {
		d *= 2
	}
	return min(d, c.BanMax)
}

// banIn reports the end of key's ban when it is banned at now (anyBan is
// set only with a ban table).
func (z *Zone) banIn(key string, now int64) (end int64, level int, ok bool) {
	if !z.state.anyBan.Load() {
		return 0, 0, false
	}
	v, found := z.state.Bans.kt.Get(key)
	if !found {
		return 0, 0, false
	}
	end, level = ParseBanEntry(v, z.BanMemory())
	return end, level, end > now
}

// startBan bans key from now, a level above its last ban if remembered. A
// key already banned keeps its ban (started false); !ok: not kept (storeBan).
func (z *Zone) startBan(key string, now int64) (end int64, level int, started, ok bool) {
	memory := z.BanMemory()
	ok = z.storeBan(key, now, func(v int64, found bool) (int64, keytable.Op) {
		level = 1
		if found && v > now {
			prevEnd, prev := ParseBanEntry(v, memory)
			if prevEnd > now {
				end, level = prevEnd, prev
				return 0, keytable.Keep
			}
			level = min(prev+1, banLevels-1)
		}
		end, started = satAdd(now, int64(z.banLength(level))), true
		return BanEntry(end, level, memory), keytable.StoreIfExpired
	})
	return end, level, started, ok
}

// learnBan records a ban the store reports, to hold it through an outage.
func (z *Zone) learnBan(key string, end int64, level int, now int64) {
	if end <= now {
		return
	}
	entry := BanEntry(end, level, z.BanMemory())
	z.storeBan(key, now, func(int64, bool) (int64, keytable.Op) { return entry, keytable.StoreIfExpired })
}

// storeBan updates key's ban entry with f, ordered with the sweep that
// clears anyBan; false (and counted) when the table is full of running bans.
func (z *Zone) storeBan(key string, now int64, f func(int64, bool) (int64, keytable.Op)) bool {
	z.state.banMu.Lock()
	z.state.anyBan.Store(true)
	ok := z.state.Bans.kt.Update(key, banEnded(now, z.BanMemory()), f)
	z.state.banMu.Unlock()
	if !ok {
		z.droppedBans(false, 1)
	}
	return ok
}

// banEnded is the value at or below which an entry's ban has ended at now:
// what a full ban table may evict.
func banEnded(now int64, memory time.Duration) int64 { return satAdd(now, int64(memory)) }

// banned is key's denial when banned at now under p: the ban's time left,
// or the rate's retry time if later. It asks no store: a banned flood costs
// nothing but this.
func (z *Zone) banned(key string, now int64, p *Plan) (Decision, bool) {
	end, level, banned := z.banIn(key, now)
	if !banned {
		return Decision{}, false
	}
	d := Decision{Source: SourceDenyCache, Banned: true, BanLevel: level}
	if z.store == nil {
		r := z.state.Local.Peek(key, now, p.limit)
		end, d.ResetAfter, d.Source = max(end, now+r.RetryAfter), time.Duration(r.ResetAfter), SourceLocal
	}
	d.RetryAfter = time.Duration(end - now)
	d.ResetAfter = max(d.ResetAfter, d.RetryAfter)
	return d, true
}

// storeDecision is the decision of a store's answer to a rate step. A ban
// is remembered here until its end, so that it holds through an outage and
// the key's flood costs the store nothing; a store without bans has its
// denial start one here, listed for the others.
func (z *Zone) storeDecision(key string, now int64, rep RateReply) Decision {
	r, b := rep.Result, rep.Ban
	z.heard(key, now, r)
	d := fromResult(r, SourceStore)
	switch {
	case b.Banned:
		z.learnBan(key, now+r.RetryAfter, b.Level, now)
		d.Banned, d.BanLevel = true, b.Level
		if b.Started {
			d.BanStarted = time.Duration(r.RetryAfter)
		}
	case !r.Allowed && z.state.Bans != nil && z.banRule == (BanRule{}): // no ban rule: the ban is this instance's (or a dry run's)
		z.banOnDenial(key, now, &d)
	}
	if l := z.offers.BanList; l != nil && d.BanStarted > 0 && !z.DryRun {
		l.RecordBan(z.Name, key, d.BanStarted, max(z.Ban, z.BanMax), d.BanLevel, func(n int64) { z.droppedBans(true, n) })
	}
	return d
}

// banOnDenial starts a ban for a key just denied and makes d its denial. In
// dry run it only reports the ban that would start, once: it is remembered,
// never enforced, so that a running one is not reported as starting again.
func (z *Zone) banOnDenial(key string, now int64, d *Decision) {
	if z.DryRun {
		if _, running := z.state.wouldBan.Get(key, now); !running {
			if _, _, banned := z.banIn(key, now); !banned {
				d.BanStarted = z.banLength(1)
				z.state.wouldBan.Set(key, now+int64(d.BanStarted), now)
			}
		}
		return
	}
	end, level, started, ok := z.startBan(key, now)
	if !ok {
		return // the rate's denial, without a ban
	}
	z.withBan(d, time.Duration(end-now), level)
	if started {
		d.BanStarted = time.Duration(end - now)
	}
}

// Ban is a current ban, as the admin API lists it.
type Ban struct {
	Key   string
	Left  time.Duration // until it ends
	Level int           // 1 for the first ban of the key; 0 when the store does not say
}

// BanOf reports key's ban at now on this instance, if it is banned.
func (z *Zone) BanOf(key string, now int64) (Ban, bool) {
	end, level, ok := z.banIn(key, now)
	if !ok {
		return Ban{}, false
	}
	return Ban{Key: key, Left: time.Duration(end - now), Level: level}, true
}

// Bans lists the bans this instance knows of, longest left first, at most
// MaxListedBans. It reads the whole table, holding at most 2·MaxListedBans:
// for the admin API, not for requests.
func (z *Zone) Bans(now int64) []Ban {
	if z.state.Bans == nil {
		return nil
	}
	var out []Ban
	top := func() {
		slices.SortFunc(out, func(a, b Ban) int { return cmp.Or(cmp.Compare(b.Left, a.Left), strings.Compare(a.Key, b.Key)) })
		out = out[:min(len(out), MaxListedBans)]
	}
	var c keytable.Copy
	kt, memory := z.state.Bans.kt, z.BanMemory()
	for i := range kt.Shards() {
		c.Reset()
		kt.CopyShard(i, banEnded(now, memory), &c)
		for j := range c.Len() {
			if end, level := ParseBanEntry(c.Values[j], memory); end > now {
				out = append(out, Ban{Key: string(c.Key(j)), Left: time.Duration(end - now), Level: level})
			}
		}
		if len(out) > 2*MaxListedBans {
			top()
		}
	}
	top()
	return out
}

// withBan adds a ban with left to run, of level, to d.
func (z *Zone) withBan(d *Decision, left time.Duration, level int) {
	if left > 0 {
		d.Banned, d.BanLevel = true, level
		d.RetryAfter = max(d.RetryAfter, left)
		d.ResetAfter = max(d.ResetAfter, left)
		d.Remaining = 0
	}
}

// ListBans lists the zone's current bans: fleet-wide (true) when its store
// lists them, else those this instance knows of.
func (z *Zone) ListBans(ctx context.Context, now int64) ([]Ban, bool, error) {
	if l := z.offers.BanList; l != nil && z.state.Bans != nil {
		bans, err := l.ListBans(ctx, z.Name)
		return bans, true, err
	}
	return z.Bans(now), false, nil
}

// BanSyncStart is where a LearnBans starts: read it before the bans.
func (z *Zone) BanSyncStart() uint64 { return z.state.forgets.Load() }

// LearnBans records bans read from the store's list (how an async instance
// hears of others' bans), unless a key was reset since start: a list read
// before a lift must not bring the ban back.
func (z *Zone) LearnBans(start uint64, bans []Ban, now int64) {
	if z.state.Bans == nil || z.state.forgets.Load() != start {
		return
	}
	for _, b := range bans {
		if _, _, banned := z.banIn(b.Key, now); !banned {
			z.learnBan(b.Key, now+int64(b.Left), b.Level, now)
		}
	}
}

// BannedKeys is the number of running bans in this instance's table (all
// enforced, at most max_keys). It reads the whole table: for a scrape.
func (z *Zone) BannedKeys(now int64) int {
	if z.state.Bans == nil {
		return 0
	}
	// Running: past the memory of a ban ending now (to banLevels ns).
	return z.state.Bans.kt.CountAbove(satAdd(banEnded(now, z.BanMemory()), banLevels-1))
}

// droppedBans tells OnBanDropped of n bans not kept.
func (z *Zone) droppedBans(fromList bool, n int64) {
	if f := z.OnBanDropped; f != nil && n > 0 {
		f(fromList, n)
	}
}

// MaxListedBans bounds the bans a zone lists, locally and in a store (the
// longest-lasting kept). Bans past it are enforced but not listed: in async
// mode only where they started (and counted: Zone.OnBanDropped).
const MaxListedBans = 1000
