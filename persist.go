package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tally/ratelimit/internal/live"
)

// RestoreTimeout bounds how long provisioning waits for snapshots and
// stored overrides.
const RestoreTimeout = live.RestoreTimeout

// newPersister sets up persist for h's zones that persist.
func newPersister(ctx caddy.Context, h *Handler) (*live.Persister, int, error) {
	if err := h.Persist.Validate(); err != nil {
		return nil, 0, err
	}
	var zs []*live.PersistedZone
	for _, zh := range h.zones {
		if !zh.Persists() {
			continue
		}
		pz := &live.PersistedZone{Zone: zh.Zone, ID: snapshotID(zh), Fresh: zh.freshState}
		if !h.DisableMetrics {
			pz.M = live.SnapshotMetrics{
				Duration:        snapshotSecondsVec.WithLabelValues(zh.Name),
				KeysWritten:     snapshotKeysVec.WithLabelValues(zh.Name),
				KeysRestored:    restoredKeysVec.WithLabelValues(zh.Name),
				WriteFailures:   writeFailsVec.WithLabelValues(zh.Name),
				RestoreFailures: restoreFailsVec.WithLabelValues(zh.Name),
			}
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

// snapshotID identifies a zone definition in its snapshots: everything
// its TATs (and bans) depend on, so that a zone whose limits changed does
// not resume from the old ones. A zone without ban keeps the identity it
// had before bans were persisted.
func snapshotID(zh *httpZone) string {
	l := zh.Limit()
	v := zh.vars
	id := fmt.Sprintf("zone=%s interval=%d burst=%d plans=%q,%q,%q,%d,%d,%d",
		zh.Name, l.EmissionInterval, l.Burst, v.events, v.window, v.burst, v.eventsMax, v.burstMax, v.windowMin)
	if zh.Ban > 0 {
		id += fmt.Sprintf(" ban=%d,%d", zh.Ban, zh.BanMax)
	}
	return id
}

type eventHandler func()

func (f eventHandler) Handle(context.Context, caddy.Event) error { f(); return nil }
