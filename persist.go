package ratelimit

// persist: local rate zones that survive a restart (Persist), snapshot by
// internal/live's Persister.

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tally/ratelimit/internal/live"
)

// Persist snapshots the handler's local rate zones to Caddy's storage so
// that they resume after a restart: a key denied before it is denied after,
// with the same Retry-After. Snapshots are written when Caddy stops (`caddy
// stop`, SIGINT, SIGTERM), every interval, and when a zone's state is
// dropped; Caddy writes nothing on SIGKILL, on a second SIGINT or on
// SIGQUIT, so there the last periodic snapshot is what survives. The keys
// stored are personal data (IP addresses, API keys). Distributed zones
// keep their state in Redis and concurrency and quota zones are not
// snapshot.
type Persist struct {
	// How often each zone's snapshot is written while Caddy runs: what a
	// kill that leaves no time to clean up can lose. At least 1s.
	// Default: 30s.
	Interval caddy.Duration `json:"interval,omitempty"`

	// A snapshot older than this when Caddy starts is ignored. Default: 24h.
	MaxAge caddy.Duration `json:"max_age,omitempty"`
}

// Defaults and bounds of persist.
const (
	DefaultPersistInterval = 30 * time.Second
	DefaultPersistMaxAge   = 24 * time.Hour
	MinPersistInterval     = time.Second
	// RestoreTimeout bounds how long a handler's provisioning waits for its
	// snapshots (live.RestoreTimeout); the runtime overrides kept in the
	// storage are bound by it too.
	RestoreTimeout = live.RestoreTimeout
)

func (p *Persist) validate() error {
	if p.Interval != 0 && time.Duration(p.Interval) < MinPersistInterval {
		return fmt.Errorf("persist: interval must be at least %v, not %v", MinPersistInterval, time.Duration(p.Interval))
	}
	if p.MaxAge < 0 {
		return fmt.Errorf("persist: max_age must be positive, not %v", time.Duration(p.MaxAge))
	}
	return nil
}

// newPersister sets up persist for the zones of h that persist
// (live.Persister).
func newPersister(ctx caddy.Context, h *Handler) (*live.Persister, int, error) {
	if err := h.Persist.validate(); err != nil {
		return nil, 0, err
	}
	var zs []*live.PersistedZone
	for _, zh := range h.zones {
		if !zh.Persists() {
			continue
		}
		pz := &live.PersistedZone{Zone: zh.Zone, ID: snapshotID(zh), Fresh: zh.freshState}
		if !h.DisableMetrics {
			pz.M = newSnapshotMetrics(zh.Name)
		}
		zs = append(zs, pz)
	}
	logger := h.logger.Named("persist")
	if len(zs) == 0 {
		logger.Warn("persist has no zone to snapshot: only local rate zones persist (not distributed, concurrency or quota zones)")
	}
	return live.NewPersister(logger, ctx.Storage(),
		cmp.Or(time.Duration(h.Persist.Interval), DefaultPersistInterval),
		cmp.Or(time.Duration(h.Persist.MaxAge), DefaultPersistMaxAge), zs), len(zs), nil
}

// snapshotID identifies a zone definition in its snapshots: its name and
// everything its TATs depend on, so that a zone whose limits changed does
// not resume from a snapshot of the old ones. A zone with ban adds its ban
// settings (its bans' entries depend on them); a zone without keeps the
// identity it had before bans were persisted.
func snapshotID(zh *zoneHandler) string {
	l := zh.Limit()
	v := zh.vars
	id := fmt.Sprintf("zone=%s interval=%d burst=%d plans=%q,%q,%q,%d,%d,%d",
		zh.Name, l.EmissionInterval, l.Burst, v.events, v.window, v.burst, v.eventsMax, v.burstMax, v.windowMin)
	if zh.Ban > 0 {
		id += fmt.Sprintf(" ban=%d,%d", zh.Ban, zh.BanMax)
	}
	return id
}

// eventHandler adapts a function to caddyevents.Handler.
type eventHandler func()

func (f eventHandler) Handle(context.Context, caddy.Event) error { f(); return nil }
