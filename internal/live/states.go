package live

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// states holds every zone's state, shared by the modules that define the
// zone alike and kept across reloads (the new config takes its references
// before the old one lets go).
var states = caddy.NewUsagePool()

// StateID identifies a zone definition: modules with the same one share
// state, the same name with another one in one config is an error, and a
// changed limit starts from a fresh state rather than reinterpreting old
// TATs under new limits. A concurrency zone is the exception (see pooled).
type StateID struct {
	name                  string
	events, window, burst int64
	maxKeys               int64
	vars                  any // what the handler reads its limits from per request (nil: nothing)
	// Quota zones: the period and its time zone (the quota is burst).
	period   algorithms.Period
	timeZone string
	// A concurrency zone (burst is its concurrency), adaptive or not.
	concurrency, adaptive bool
	ban, banMax           time.Duration // ban's first and longest length
	delay                 time.Duration // how long a request may wait
	queue                 int64         // how many wait at once
}

// NewStateID is the definition of cfg whose per-request limits are read as
// vars says (nil: none; otherwise comparable).
func NewStateID(cfg zones.Config, vars any) StateID {
	id := StateID{name: cfg.Name, events: cfg.Events, window: int64(cfg.Window), burst: cfg.Limit().Burst, maxKeys: cfg.MaxKeys, vars: vars,
		concurrency: cfg.IsConcurrency(), adaptive: cfg.IsAdaptive(), ban: cfg.Ban, banMax: cfg.BanMax, delay: cfg.Delay, queue: cfg.Queue}
	if cfg.IsQuota() {
		id.period, id.timeZone = cfg.Period, cfg.Location.String()
	}
	return id
}

// pooled is the key of the definition's state in states. A concurrency
// zone's is its name alone: requests still in flight when a reload changes
// its concurrency or max_keys must go on being counted (a fresh table
// would let more in flight than the limit).
func (id StateID) pooled() StateID {
	if id.concurrency {
		return StateID{name: id.name, concurrency: true, adaptive: id.adaptive}
	}
	return id
}

// limit describes the definition's limit for people.
func (id StateID) limit() string {
	if id.period != 0 {
		s := fmt.Sprintf("a quota of %d per %v", id.burst, id.period)
		if id.timeZone != time.UTC.String() {
			s += " in " + id.timeZone // e.g. "a quota of 100000 per month in Europe/Paris"
		}
		return s
	}
	s := fmt.Sprintf("%d per %v", id.events, time.Duration(id.window))
	switch {
	case id.banMax > id.ban:
		s += fmt.Sprintf(" with ban %v %v", id.ban, id.banMax)
	case id.ban > 0:
		s += fmt.Sprintf(" with ban %v", id.ban)
	}
	if id.delay > 0 {
		s += fmt.Sprintf(" with delay %v", id.delay)
		if id.queue > 0 {
			s += fmt.Sprintf(" queue %d", id.queue)
		}
	}
	return s
}

// DefaultSweepInterval is how often a zone's expired keys are swept unless
// its handler says otherwise (connection zones always).
const DefaultSweepInterval = time.Minute

// LoadState returns the state of cfg's definition (vars as NewStateID), its
// key for ReleaseState, and whether it was created (no live state to merge
// a snapshot with).
func LoadState(cfg zones.Config, vars any, sweep time.Duration) (*zones.State, StateID, bool, error) {
	id := NewStateID(cfg, vars).pooled()
	v, loaded, err := states.LoadOrNew(id, func() (caddy.Destructor, error) {
		return zones.NewState(cfg, sweep), nil
	})
	if err != nil {
		return nil, id, false, err
	}
	return v.(*zones.State), id, !loaded, nil
}

// ReleaseState gives back a reference LoadState took.
func ReleaseState(id StateID) { _, _ = states.Delete(id) }

// LogAfresh logs, when LoadState has just created id's state, the other
// definition of its name a loaded config holds: the one a reload replaces.
func LogAfresh(logger *zap.Logger, id StateID) {
	states.Range(func(k, _ any) bool {
		o, ok := k.(StateID)
		if ok && o.name == id.name && o != id && !o.concurrency {
			logger.Info("zone starts afresh: a reload changed its limits, so every key has its full limit again",
				zap.String("zone", id.name), zap.String("changed", id.changesFrom(o)))
			return false
		}
		return true
	})
}

// changesFrom says, for people, what differs between old and id: why a
// reload starts the zone afresh (e.g. "events 3 → 5, burst 3 → 5").
func (id StateID) changesFrom(old StateID) string {
	var out []string
	add := func(what string, from, to any) {
		if from != to {
			out = append(out, fmt.Sprintf("%s %v → %v", what, from, to))
		}
	}
	add("events", old.events, id.events)
	add("window", time.Duration(old.window), time.Duration(id.window))
	add("burst", old.burst, id.burst)
	add("max_keys", old.maxKeys, id.maxKeys)
	add("period", old.period, id.period)
	add("time zone", old.timeZone, id.timeZone)
	add("ban", old.ban, id.ban)
	add("ban's longest", old.banMax, id.banMax)
	add("delay", old.delay, id.delay)
	add("queue", old.queue, id.queue)
	if old.vars != id.vars {
		out = append(out, "the placeholders of its limits or their bounds")
	}
	if len(out) == 0 {
		return "its definition"
	}
	return strings.Join(out, ", ")
}

// stores and regions pool a Redis store per setting and a Region per setting
// and store across reloads; the last handler to let go closes it.
var stores, regions = caddy.NewUsagePool(), caddy.NewUsagePool()

// Backend is what a handler needs of its pooled store besides zones.Store
// and its Offers, set where the store is made: no code asks what it is.
type Backend struct {
	Health StoreHealth
	Resets ResetNotifier
	Async  *distributed.Async // async mode: its zones' bans are read from it
}

// StoreHealth is what a store tells of its health, for the admin API.
type StoreHealth interface {
	Health() (ok bool, openSince time.Time)
	LastProblem() (string, time.Time)
	Outages() []distributed.NodeOutage
}

// ResetNotifier is a store that tells of every reset of a key, made on any
// instance sharing its Redis: each zone forgets the key too.
type ResetNotifier interface {
	OnReset(zone string, l distributed.ResetListener) (remove func())
}

type pooledStore struct {
	store interface {
		zones.Store
		caddy.Destructor
	}
	backend Backend
}

func (p pooledStore) Destruct() error { return p.store.Destruct() }

// OpenStore returns the pooled store of opts, a *distributed.Strict or (in
// async mode) a *distributed.Async, what else a handler needs of it, and
// the key to release it with (ReleaseStore). Its errors say "distributed:".
func OpenStore(opts distributed.Options, logger *zap.Logger) (zones.Store, Backend, string, error) {
	distributed.RouteClientLogs(caddy.Log().Named("redis"))
	key := opts.Key()
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		if opts.Mode == "async" {
			s, err := distributed.OpenAsync(opts, logger.Named("redis"))
			if err != nil {
				return nil, err
			}
			return pooledStore{s, Backend{Health: s, Resets: s, Async: s}}, nil
		}
		s, err := distributed.Open(opts, logger.Named("redis"))
		if err != nil {
			return nil, err
		}
		return pooledStore{s, Backend{Health: s, Resets: s}}, nil
	})
	if err != nil {
		if !strings.HasPrefix(err.Error(), "distributed: ") {
			err = fmt.Errorf("distributed: %v", err)
		}
		return nil, Backend{}, "", err
	}
	p := v.(pooledStore)
	return p.store, p.backend, key, nil
}

// ReleaseStore lets go of a handler's reference to a pooled store.
func ReleaseStore(key string) { _, _ = stores.Delete(key) }

// OpenRegion opens (or shares) the region of opts over store, the pooled
// store of storeKey, and its key for ReleaseRegion.
func OpenRegion(store zones.Store, storeKey string, opts distributed.RegionOptions, logger *zap.Logger) (*distributed.Region, string, error) {
	key := opts.Key(storeKey)
	v, _, err := regions.LoadOrNew(key, func() (caddy.Destructor, error) {
		return distributed.OpenRegion(store, opts, logger.Named("global"))
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*distributed.Region), key, nil
}

// ReleaseRegion lets go of a handler's reference to region r (pooled as
// key), first releasing the zones the handler made global in it.
func ReleaseRegion(r *distributed.Region, key string, globalZones []string) {
	for _, name := range globalZones {
		r.ReleaseZone(name)
	}
	_, _ = regions.Delete(key)
}
