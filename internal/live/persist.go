package live

import (
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
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

const (
	// RestoreTimeout bounds how long a handler's provisioning waits for its
	// snapshots (load and decode): a slow or unreachable storage delays a
	// start by at most this, and the zones then start empty.
	RestoreTimeout = 2 * time.Second
	// SnapshotTimeout bounds how long one write waits for the storage, so
	// that a hung storage cannot hold Caddy's shutdown.
	SnapshotTimeout = 10 * time.Second
	// staleTempAge is how old a temporary snapshot file must be to be
	// removed at start: a write in flight takes at most SnapshotTimeout.
	staleTempAge = 2 * SnapshotTimeout
	// snapshotPrefix is where snapshots are kept in Caddy's storage:
	// <prefix>/<instance id>/<zone>-<hash of its limits>.
	snapshotPrefix = "tally/snapshots"
)

// Persister snapshots and restores one handler's persisted zones: local
// rate zones that survive a restart. Nothing is written before Start (the
// config has started), so `caddy validate` and a config that fails to load
// change nothing.
type Persister struct {
	logger   *zap.Logger
	storage  certmagic.Storage
	interval time.Duration
	maxAge   time.Duration
	zones    []*PersistedZone

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// PersistedZone is one zone a Persister snapshots.
type PersistedZone struct {
	Zone  *zones.Zone
	ID    string // the definition's identity, written in the snapshot
	Fresh bool   // provision created the zone's state: restore into it
	M     SnapshotMetrics
	file  string // the name under the instance's directory: zone and limits
	size  int    // the last snapshot's size, to allocate the next one at once
}

// SnapshotMetrics are a persisted zone's series; none is bound with
// metrics disabled.
type SnapshotMetrics struct {
	Duration                       prometheus.Observer
	KeysWritten, KeysRestored      prometheus.Counter
	WriteFailures, RestoreFailures prometheus.Counter
}

// add adds n to c, nil without metrics.
func add(c prometheus.Counter, n float64) {
	if c != nil {
		c.Add(n)
	}
}

// NewPersister sets up the snapshots of zs to storage: written every
// interval once started, ignored when older than maxAge at a restore.
func NewPersister(logger *zap.Logger, storage certmagic.Storage, interval, maxAge time.Duration, zs []*PersistedZone) *Persister {
	p := &Persister{logger: logger, storage: storage, interval: interval, maxAge: maxAge, zones: zs,
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, pz := range zs {
		sum := sha256.Sum256([]byte(pz.ID))
		pz.file = pz.Zone.Name + "-" + hex.EncodeToString(sum[:8])
	}
	return p
}

// InstanceID is Caddy's instance id, read without creating it so that a
// restore changes nothing: an instance without one has written nothing.
func InstanceID() (string, bool) {
	b, err := os.ReadFile(filepath.Join(caddy.AppDataDir(), "instance.uuid"))
	id := strings.TrimSpace(string(b))
	if err != nil || id == "" {
		return "", false // none, or one being written
	}
	return id, true
}

// instanceIDMu serialises tally's creations of the instance id.
var instanceIDMu sync.Mutex

// CreateInstanceID returns Caddy's instance id, creating it when there is
// none. caddy.InstanceID writes the file in place, and Caddy's TLS app may
// create it at the same time, so a read that finds it empty is retried for
// a second at most.
func CreateInstanceID() (string, error) {
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

func (p *Persister) key(instance string, pz *PersistedZone) string {
	return snapshotPrefix + "/" + instance + "/" + pz.file
}

type restored struct { // one snapshot loaded
	pz   *PersistedZone
	snap *zones.Snapshot
	err  error
}

// Restore merges the snapshots of the zones whose state provision created,
// waiting at most RestoreTimeout in all; it only reads the storage.
func (p *Persister) Restore() {
	instance, ok := InstanceID()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), RestoreTimeout)
	defer cancel()
	results := make(chan restored, len(p.zones))
	waiting := map[*PersistedZone]bool{}
	for _, pz := range p.zones {
		if !pz.Fresh {
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
				add(pz.M.RestoreFailures, 1)
				p.logger.Warn("snapshot not restored: the storage did not answer in time; the zone starts empty",
					zap.String("zone", pz.Zone.Name), zap.Duration("timeout", RestoreTimeout))
			}
			return
		}
	}
}

// apply merges a loaded snapshot into its zone's state, or says why not.
func (p *Persister) apply(r restored) {
	zone := zap.String("zone", r.pz.Zone.Name)
	switch {
	case errors.Is(r.err, fs.ErrNotExist):
		return
	case errors.Is(r.err, zones.ErrSnapshotCorrupt):
		add(r.pz.M.RestoreFailures, 1)
		p.logger.Warn("snapshot ignored: it is corrupt or truncated; the zone starts empty", zone, zap.Error(r.err))
		return
	case r.err != nil:
		add(r.pz.M.RestoreFailures, 1)
		p.logger.Warn("snapshot not restored: the storage failed; the zone starts empty", zone, zap.Error(r.err))
		return
	case r.snap.ID != r.pz.ID:
		p.logger.Warn("snapshot ignored: it is of another zone definition", zone)
		return
	}
	wall, now := time.Now(), monotime.Now()
	if age := wall.Sub(r.snap.Wall); age > p.maxAge {
		p.logger.Info("snapshot ignored: older than max_age", zone, zap.Duration("age", age), zap.Duration("max_age", p.maxAge))
		return
	}
	n := r.pz.Zone.State().Restore(r.snap, now, wall, r.pz.Zone.MaxDebt())
	add(r.pz.M.KeysRestored, float64(n))
	p.logger.Info("zone restored from its snapshot", zone, zap.Int("keys", n),
		zap.Time("taken", r.snap.Wall), zap.Duration("age", max(0, wall.Sub(r.snap.Wall))))
}

// Start arms the snapshots once the config runs: the periodic writes and
// the final one when a zone's state is dropped.
func (p *Persister) Start() {
	p.startOnce.Do(func() {
		for _, pz := range p.zones {
			pz.Zone.State().SetFinalSnapshot(func(*zones.State) { p.write(pz, "final") })
		}
		go p.run()
	})
}

func (p *Persister) run() {
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

// removeStaleTemps deletes from a file storage the temporary files (named
// by digits only; a snapshot never is) that writes killed mid-way left, each
// as large as a snapshot; one younger than staleTempAge may be in flight.
// It runs once the config has started: provisioning only reads.
func (p *Persister) removeStaleTemps() {
	fsStorage, ok := p.storage.(*certmagic.FileStorage)
	if !ok || len(p.zones) == 0 {
		return
	}
	instance, ok := InstanceID()
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

// WriteAll writes every zone's snapshot concurrently (on the stopping event:
// a hung storage holds Caddy's shutdown one SnapshotTimeout, not one a zone).
func (p *Persister) WriteAll(why string) {
	var wg sync.WaitGroup
	for _, pz := range p.zones {
		wg.Go(func() { p.write(pz, why) })
	}
	wg.Wait()
}

// Close stops the periodic writes (Cleanup), waiting for one in progress.
func (p *Persister) Close() {
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
func (p *Persister) write(pz *PersistedZone, why string) {
	instance, err := CreateInstanceID()
	if err != nil {
		add(pz.M.WriteFailures, 1)
		p.logger.Error("snapshot not written: no instance id", zap.String("zone", pz.Zone.Name), zap.Error(err))
		return
	}
	key := p.key(instance, pz)
	mu, _ := writing.LoadOrStore(key, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()

	start := time.Now()
	data, keys := pz.Zone.State().AppendSnapshot(make([]byte, 0, pz.size+pz.size/8), pz.ID, monotime.Now(), start)
	pz.size = len(data)
	ctx, cancel := context.WithTimeout(context.Background(), SnapshotTimeout)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.storage.Store(ctx, key, data) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		err = fmt.Errorf("the storage did not answer within %v", SnapshotTimeout)
	}
	took := time.Since(start)
	zone := zap.String("zone", pz.Zone.Name)
	if err != nil {
		add(pz.M.WriteFailures, 1)
		p.logger.Error("snapshot not written", zone, zap.String("when", why), zap.Error(err))
		return
	}
	if pz.M.Duration != nil {
		pz.M.Duration.Observe(took.Seconds())
	}
	add(pz.M.KeysWritten, float64(keys))
	level := zap.DebugLevel
	if why != "periodic" {
		level = zap.InfoLevel
	}
	if ce := p.logger.Check(level, "snapshot written"); ce != nil {
		ce.Write(zone, zap.String("when", why), zap.Int("keys", keys), zap.Int("bytes", len(data)), zap.Duration("took", took))
	}
}
