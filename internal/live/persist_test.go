package live

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

func mustZone(c zones.Config, s *zones.State) *zones.Zone {
	z, err := zones.New(c, s, nil)
	if err != nil {
		panic(err)
	}
	return z
}

// A snapshot loaded under a zone's name that is of another definition (its
// identity differs) is ignored, with a WARN: the file name holds only 8
// bytes of the identity's hash, the identity written inside is what
// decides. The same snapshot under its own identity is restored.
func TestSnapshotOfAnotherDefinitionIsNotRestored(t *testing.T) {
	cfg := zones.Config{Name: "login", Events: 3, Window: time.Hour}
	old := mustZone(cfg, zones.NewState(cfg, time.Hour))
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
		z := mustZone(cfg, st)
		core, logs := observer.New(zap.InfoLevel)
		p := &Persister{logger: zap.New(core), maxAge: time.Hour}
		p.apply(restored{pz: &PersistedZone{Zone: z, ID: c.id}, snap: snap})
		denied := !z.Decide(ctx, "10.0.0.1", monotime.Now()).Allowed
		if denied != c.restored {
			t.Errorf("zone %q, snapshot of %q: 10.0.0.1 denied %v, want %v", c.id, snap.ID, denied, c.restored)
		}
		if warned := logs.FilterMessageSnippet("snapshot ignored: it is of another zone definition").Len() == 1; warned == c.restored {
			t.Errorf("zone %q, snapshot of %q: WARN of another definition %v, want %v; log: %v", c.id, snap.ID, warned, !c.restored, logs.All())
		}
	}
}

// slowStorage is a certmagic.Storage whose Load answers only when its
// context ends.
type slowStorage struct{ certmagic.Storage }

func (slowStorage) Load(ctx context.Context, _ string) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A storage that does not answer delays the restore by RestoreTimeout, not
// more; the zone then starts empty, with a WARN.
func TestRestoreFromASlowStorageGivesUpAfterTheBound(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", dir)
	if err := os.MkdirAll(filepath.Join(dir, "caddy"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "caddy", "instance.uuid"), []byte("8c5d3e5e-0000-4000-8000-000000000000"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := zones.Config{Name: "login", Events: 3, Window: time.Hour}
	st := zones.NewState(cfg, time.Hour)
	defer st.Destruct()
	core, logs := observer.New(zap.WarnLevel)
	p := &Persister{logger: zap.New(core), storage: slowStorage{}, maxAge: time.Hour}
	p.zones = []*PersistedZone{{Zone: mustZone(cfg, st), Fresh: true}}

	start := time.Now()
	p.Restore()
	if took := time.Since(start); took < RestoreTimeout || took > RestoreTimeout+time.Second {
		t.Errorf("restore took %v, want the %v bound", took, RestoreTimeout)
	}
	if logs.FilterMessageSnippet("the storage did not answer in time").Len() != 1 {
		t.Errorf("no WARN for the storage that did not answer: %v", logs.All())
	}
}
