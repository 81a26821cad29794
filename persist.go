package ratelimit

// persist: local rate zones that survive a restart (Persist). Nothing is
// written before the config has started, so `caddy validate` and a config
// that fails to load change nothing.

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
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
	// snapshots (load and decode): a slow or unreachable storage delays a
	// start by at most this, and the zones then start empty.
	RestoreTimeout = 2 * time.Second
	// snapshotTimeout bounds how long one write waits for the storage, so
	// that a hung storage cannot hold Caddy's shutdown.
	snapshotTimeout = 10 * time.Second
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

// persister snapshots and restores one handler's persisted zones.
type persister struct {
	logger   *zap.Logger
	storage  certmagic.Storage
	interval time.Duration
	maxAge   time.Duration
	zones    []*persistedZone

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// persistedZone is one zone a persister snapshots.
type persistedZone struct {
	zh    *zoneHandler
	id    string // the definition's identity, written in the snapshot
	file  string // the name under the instance's directory: zone and limits
	fresh bool   // provision created the zone's state: restore into it
	m     snapshotMetrics
	size  int // the last snapshot's size, to allocate the next one at once
}

// snapshotPrefix is where snapshots are kept in Caddy's storage:
// <prefix>/<instance id>/<zone>-<hash of its limits>.
const snapshotPrefix = "tally/snapshots"

// newPersister sets up persist for the zones of h that persist.
func newPersister(ctx caddy.Context, h *Handler) (*persister, error) {
	if err := h.Persist.validate(); err != nil {
		return nil, err
	}
	p := &persister{
		logger:   h.logger.Named("persist"),
		storage:  ctx.Storage(),
		interval: cmp.Or(time.Duration(h.Persist.Interval), DefaultPersistInterval),
		maxAge:   cmp.Or(time.Duration(h.Persist.MaxAge), DefaultPersistMaxAge),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for _, zh := range h.zones {
		if !zh.Persists() {
			continue
		}
		id := snapshotID(zh)
		sum := sha256.Sum256([]byte(id))
		pz := &persistedZone{zh: zh, id: id, file: zh.Name + "-" + hex.EncodeToString(sum[:8]), fresh: zh.freshState}
		if !h.DisableMetrics {
			pz.m = newSnapshotMetrics(zh.Name)
		}
		p.zones = append(p.zones, pz)
	}
	if len(p.zones) == 0 {
		p.logger.Warn("persist has no zone to snapshot: only local rate zones persist (not distributed, concurrency or quota zones)")
	}
	return p, nil
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

// instanceID is Caddy's instance id (instance.uuid in Caddy's data
// directory), read without creating it: a restore changes nothing. An
// instance without one has written no snapshot yet.
func instanceID() (string, bool) {
	b, err := os.ReadFile(filepath.Join(caddy.AppDataDir(), "instance.uuid"))
	id := strings.TrimSpace(string(b))
	if err != nil || id == "" {
		return "", false // none, or one being written
	}
	return id, true
}

// instanceIDMu serialises tally's creations of the instance id.
var instanceIDMu sync.Mutex

// createInstanceID returns Caddy's instance id, creating it when there is
// none. caddy.InstanceID writes the file in place and Caddy's TLS app reads
// or creates it too (its storage cleaning, at start), so a read can find it
// empty for a moment: that read is retried, for a second at most.
func createInstanceID() (string, error) {
	instanceIDMu.Lock()
	defer instanceIDMu.Unlock()
	deadline := time.Now().Add(time.Second)
	for {
		id, err := caddy.InstanceID()
		if err == nil {
			return id.String(), nil
		}
		if time.Now().After(deadline) {
			return "", err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *persister) key(instance string, pz *persistedZone) string {
	return snapshotPrefix + "/" + instance + "/" + pz.file
}

type restored struct {
	pz   *persistedZone
	snap *zones.Snapshot
	err  error
}

// restore loads and merges the snapshots of the zones whose state
// provision created, waiting for them at most RestoreTimeout in all. It
// only reads the storage.
func (p *persister) restore() {
	instance, ok := instanceID()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), RestoreTimeout)
	defer cancel()
	results := make(chan restored, len(p.zones))
	waiting := map[*persistedZone]bool{}
	for _, pz := range p.zones {
		if !pz.fresh {
			continue
		}
		waiting[pz] = true
		go func() {
			data, err := p.storage.Load(ctx, p.key(instance, pz))
			var snap *zones.Snapshot
			if err == nil {
				snap, err = zones.DecodeSnapshot(data)
			}
			results <- restored{pz: pz, snap: snap, err: err}
		}()
	}
	for len(waiting) > 0 {
		select {
		case r := <-results:
			delete(waiting, r.pz)
			p.apply(r)
		case <-ctx.Done():
			for pz := range waiting {
				add(pz.m.restoreFailures, 1)
				p.logger.Warn("snapshot not restored: the storage did not answer in time; the zone starts empty",
					zap.String("zone", pz.zh.Name), zap.Duration("timeout", RestoreTimeout))
			}
			return
		}
	}
}

// apply merges one loaded snapshot into its zone's state, or says why not.
func (p *persister) apply(r restored) {
	zone := zap.String("zone", r.pz.zh.Name)
	switch {
	case errors.Is(r.err, fs.ErrNotExist):
		return
	case errors.Is(r.err, zones.ErrSnapshotCorrupt):
		add(r.pz.m.restoreFailures, 1)
		p.logger.Warn("snapshot ignored: it is corrupt or truncated; the zone starts empty", zone, zap.Error(r.err))
		return
	case r.err != nil:
		add(r.pz.m.restoreFailures, 1)
		p.logger.Warn("snapshot not restored: the storage failed; the zone starts empty", zone, zap.Error(r.err))
		return
	case r.snap.ID != r.pz.id:
		p.logger.Warn("snapshot ignored: it is of another zone definition", zone)
		return
	}
	wall, now := time.Now(), monotime.Now()
	if age := wall.Sub(r.snap.Wall); age > p.maxAge {
		p.logger.Info("snapshot ignored: older than max_age", zone, zap.Duration("age", age), zap.Duration("max_age", p.maxAge))
		return
	}
	n := r.pz.zh.State().Restore(r.snap, now, wall, r.pz.zh.MaxDebt())
	add(r.pz.m.keysRestored, float64(n))
	p.logger.Info("zone restored from its snapshot", zone, zap.Int("keys", n),
		zap.Time("taken", r.snap.Wall), zap.Duration("age", max(0, wall.Sub(r.snap.Wall))))
}

// start arms the snapshots once the config runs: the periodic writes and
// the final one when a zone's state is dropped.
func (p *persister) start() {
	p.startOnce.Do(func() {
		for _, pz := range p.zones {
			pz.zh.State().SetFinalSnapshot(func(*zones.State) { p.write(pz, "final") })
		}
		go p.run()
	})
}

func (p *persister) run() {
	defer close(p.done)
	p.removeStaleTemps()
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			for _, pz := range p.zones {
				p.write(pz, "periodic")
			}
		}
	}
}

// removeStaleTemps deletes what writes interrupted by a SIGKILL (or a
// crash) left in this instance's snapshot directory of a file storage:
// certmagic writes a snapshot to a temporary file beside it (os.CreateTemp,
// a name of digits only; a snapshot's name never is) and renames it over
// the snapshot, and a process killed in between leaves the temporary file,
// as large as a snapshot, under a new name each time. A file younger than
// staleTempAge may be a write in flight (another handler's, or a process
// sharing the data directory) and stays. Runs once the config has started:
// provisioning only reads the storage.
func (p *persister) removeStaleTemps() {
	fsStorage, ok := p.storage.(*certmagic.FileStorage)
	if !ok || len(p.zones) == 0 {
		return
	}
	instance, ok := instanceID()
	if !ok {
		return
	}
	dir := filepath.Dir(fsStorage.Filename(p.key(instance, p.zones[0])))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return // no directory yet: nothing was ever written
	}
	var removed int
	var bytes int64
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.Trim(e.Name(), "0123456789") != "" {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < staleTempAge {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			removed++
			bytes += info.Size()
		}
	}
	if removed > 0 {
		p.logger.Info("removed the temporary files of snapshot writes that were interrupted (a SIGKILL or a crash during a write)",
			zap.String("dir", dir), zap.Int("files", removed), zap.Int64("bytes", bytes))
	}
}

// staleTempAge is how old a temporary snapshot file must be to be removed
// at start: a write in flight takes at most snapshotTimeout.
const staleTempAge = 2 * snapshotTimeout

// writeAllAtOnce writes every zone's snapshot concurrently and waits for
// them: on the stopping event, so that a storage that hangs holds Caddy's
// shutdown for one snapshotTimeout, not one per zone.
func (p *persister) writeAllAtOnce(why string) {
	var wg sync.WaitGroup
	for _, pz := range p.zones {
		wg.Go(func() { p.write(pz, why) })
	}
	wg.Wait()
}

// close stops the periodic writes (Cleanup), waiting for one in progress.
func (p *persister) close() {
	p.stopOnce.Do(func() {
		close(p.stop)
		p.startOnce.Do(func() { close(p.done) }) // never started: nothing runs
		<-p.done
	})
}

// writing serializes the writes of one snapshot name, so that a periodic
// write never lands after (and over) a later one.
var writing sync.Map // storage key -> *sync.Mutex

// write takes and stores one snapshot of pz; why is for the log.
func (p *persister) write(pz *persistedZone, why string) {
	instance, err := createInstanceID() // created on the first write
	if err != nil {
		add(pz.m.writeFailures, 1)
		p.logger.Error("snapshot not written: no instance id", zap.String("zone", pz.zh.Name), zap.Error(err))
		return
	}
	key := p.key(instance, pz)
	mu, _ := writing.LoadOrStore(key, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()

	start := time.Now()
	data, keys := pz.zh.State().AppendSnapshot(make([]byte, 0, pz.size+pz.size/8), pz.id, monotime.Now(), start)
	pz.size = len(data)
	ctx, cancel := context.WithTimeout(context.Background(), snapshotTimeout)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.storage.Store(ctx, key, data) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		err = fmt.Errorf("the storage did not answer within %v", snapshotTimeout)
	}
	took := time.Since(start)
	zone := zap.String("zone", pz.zh.Name)
	if err != nil {
		add(pz.m.writeFailures, 1)
		p.logger.Error("snapshot not written", zone, zap.String("when", why), zap.Error(err))
		return
	}
	pz.m.written(keys, took)
	level := zap.DebugLevel
	if why != "periodic" {
		level = zap.InfoLevel
	}
	if ce := p.logger.Check(level, "snapshot written"); ce != nil {
		ce.Write(zone, zap.String("when", why), zap.Int("keys", keys), zap.Int("bytes", len(data)), zap.Duration("took", took))
	}
}

// eventHandler adapts a function to caddyevents.Handler.
type eventHandler func()

func (f eventHandler) Handle(context.Context, caddy.Event) error { f(); return nil }
