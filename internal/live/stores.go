package live

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// stores and regions pool one Redis store per setting, and one Region per
// setting and store, across reloads; the last handler to let go closes it.
var stores, regions = caddy.NewUsagePool(), caddy.NewUsagePool()

// Backend is what a handler needs of its pooled store besides zones.Store
// and its Offers, set where the store is made: no code asks a store what
// it is.
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
// store of storeKey, and returns it with the key to release it with
// (ReleaseRegion).
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
