package ratelimit

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// A snapshot loaded under a zone's name that is of another definition (its
// identity differs) is ignored, with a WARN: the file name holds only 8
// bytes of the identity's hash, the identity written inside is what
// decides. The same snapshot under its own identity is restored.
func TestSnapshotOfAnotherDefinitionIsNotRestored(t *testing.T) {
	cfg := zones.Config{Name: "login", Events: 3, Window: time.Hour}
	old := mustZone(cfg, zones.NewState(cfg, time.Hour), nil)
	defer old.State().Destruct()
	ctx, now := context.Background(), monotime.Now()
	for old.Decide(ctx, "10.0.0.1", now).Allowed {
	}
	data, _ := old.State().AppendSnapshot(nil, "zone=login interval=1 burst=99", now, time.Now())
	for _, c := range []struct {
		id       string
		restored bool
	}{
		{"zone=login interval=1200000000000 burst=3", false},
		{"zone=login interval=1 burst=99", true},
	} {
		snap, err := zones.DecodeSnapshot(data)
		if err != nil {
			t.Fatal(err)
		}
		st := zones.NewState(cfg, time.Hour)
		defer st.Destruct()
		z := mustZone(cfg, st, nil)
		core, logs := observer.New(zap.InfoLevel)
		p := &persister{logger: zap.New(core), maxAge: time.Hour}
		p.apply(restored{pz: &persistedZone{zh: &zoneHandler{Zone: z}, id: c.id}, snap: snap})
		denied := !z.Decide(ctx, "10.0.0.1", monotime.Now()).Allowed
		if denied != c.restored {
			t.Errorf("zone %q, snapshot of %q: 10.0.0.1 denied %v, want %v", c.id, snap.ID, denied, c.restored)
		}
		if warned := logs.FilterMessageSnippet("snapshot ignored: it is of another zone definition").Len() == 1; warned == c.restored {
			t.Errorf("zone %q, snapshot of %q: WARN of another definition %v, want %v; log: %v", c.id, snap.ID, warned, !c.restored, logs.All())
		}
	}
}
