package ratelimit

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-tally/ratelimit/zones"
)

// The syntax, as written, gives the JSON it documents.
func TestCaddyfilePersistBlock(t *testing.T) {
	// The /login matcher is httpcaddyfile's, tested with Caddy in tests/.
	h, err := parse(t, `rate_limit {
		zone login_ip {
			key {client_ip}
			events 5
			window 15m
		}
		persist {
			interval 30s        # periodic snapshot; default 30s
			max_age  24h        # a snapshot older than this is ignored
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if h.Persist == nil || time.Duration(h.Persist.Interval) != 30*time.Second || time.Duration(h.Persist.MaxAge) != 24*time.Hour {
		t.Fatalf("persist = %+v, want interval 30s, max_age 24h", h.Persist)
	}
	b, _ := json.Marshal(h.Persist)
	if string(b) != `{"interval":30000000000,"max_age":86400000000000}` {
		t.Errorf("JSON %s", b)
	}
	if h, err := parse(t, "rate_limit {\nzone a {\nkey {client_ip}\nevents 1\nwindow 1m\n}\npersist\n}"); err != nil || h.Persist == nil || *h.Persist != (Persist{}) {
		t.Errorf("a bare persist: %+v, %v; want the defaults", h.Persist, err)
	}
	for input, want := range map[string]string{
		"persist {\ninterval 100ms\n}":           "at least 1s",
		"persist {\ninterval 1s\ninterval 2s\n}": "given twice",
		"persist {\nmax_age 0\n}":                "positive duration",
		"persist {\nkeep 1\n}":                   "expected interval or max_age",
		"persist 30s":                            "wrong argument count",
	} {
		_, err := parse(t, "rate_limit {\nzone a {\nkey {client_ip}\nevents 1\nwindow 1m\n}\n"+input+"\n}")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", input, err, want)
		}
	}
}

// A zone's snapshot name and identity change with its limits, so that a
// zone whose limits changed does not resume from the old snapshot, and do
// not change with anything else.
func TestSnapshotNameFollowsTheLimits(t *testing.T) {
	name := func(events int64, window time.Duration, dryRun bool) string {
		zh := &zoneHandler{Zone: mustZone(zones.Config{Name: "login", Events: events, Window: window, DryRun: dryRun}, nil, nil)}
		return snapshotID(zh)
	}
	base := name(3, time.Hour, false)
	if name(3, time.Hour, true) != base {
		t.Error("dry_run changed the snapshot's identity")
	}
	for _, other := range []string{name(4, time.Hour, false), name(3, 2*time.Hour, false)} {
		if other == base {
			t.Errorf("changed limits keep the snapshot identity %s", base)
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
	p := &persister{logger: zap.New(core), storage: slowStorage{}, maxAge: time.Hour}
	p.zones = []*persistedZone{{zh: &zoneHandler{Zone: mustZone(cfg, st, nil)}, fresh: true}}

	start := time.Now()
	p.restore()
	if took := time.Since(start); took < RestoreTimeout || took > RestoreTimeout+time.Second {
		t.Errorf("restore took %v, want the %v bound", took, RestoreTimeout)
	}
	if logs.FilterMessageSnippet("the storage did not answer in time").Len() != 1 {
		t.Errorf("no WARN for the storage that did not answer: %v", logs.All())
	}
}
