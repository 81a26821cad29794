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

// provisionPersist sets up persist for h's zones that persist and restores
// their snapshots; `started` arms their writes (a config that never starts
// writes nothing), `stopping` writes them before Caddy waits for the
// requests in flight.
func (h *Handler) provisionPersist(ctx caddy.Context) error {
	if err := h.Persist.Validate(); err != nil {
		return err
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
	p := live.NewPersister(logger, ctx.Storage(),
		cmp.Or(time.Duration(h.Persist.Interval), DefaultPersistInterval),
		cmp.Or(time.Duration(h.Persist.MaxAge), DefaultPersistMaxAge), zs)
	h.persister = p
	if len(zs) == 0 {
		logger.Warn("persist has no zone to snapshot: only local rate zones persist (not distributed, concurrency or quota zones)")
		return nil
	}
	p.Restore()
	for event, f := range map[string]func(){
		"started": p.Start,
		// A reload's dropped states write their final snapshot
		// themselves: only an exit needs one now.
		"stopping": func() {
			if caddy.Exiting() {
				p.WriteAll("stopping")
			}
		},
	} {
		if err := h.events.On(event, eventHandler(f)); err != nil {
			return fmt.Errorf("persist: subscribing to the %s event: %v", event, err)
		}
	}
	return nil
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
