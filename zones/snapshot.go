package zones

// Snapshots of a zone's in-process state, so that a local zone resumes
// after a restart (persist). A snapshot holds each live key's time left,
// which depends on no clock, and the wall time it was taken, the only time
// two processes share; a restore subtracts the wall time that passed.
//
// Layout (integers little-endian, uvarint where said):
//
//	magic     "TALLYSN" + version byte 1
//	id        uvarint length + bytes: the zone definition's identity
//	wall      int64, Unix nanoseconds when the snapshot was taken
//	sections  each: kind byte, count uint64, then count entries of
//	          uvarint key length, key bytes, uvarint nanoseconds left
//	          (a ban section: the time left until the key is forgotten,
//	          rounded up to a multiple of 64, plus the ban's level, as
//	          BanEntry packs them); kind 0 ends the list
//	checksum  uint32, CRC-32C of everything before it
//
// A snapshot is checked whole (length, checksum, every entry) before any of
// it is applied: a truncated or corrupt one is refused, never half-loaded.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
	"unsafe"

	"github.com/caddy-tally/ratelimit/internal/keytable"
)

// SnapshotKind names a table a snapshot section holds.
type SnapshotKind uint8

const (
	snapshotEnd SnapshotKind = iota
	// SnapshotTATs: a local rate zone's TATs (post-charge debt included).
	SnapshotTATs
	// SnapshotBans: a zone's bans and escalation memory (see the layout).
	SnapshotBans
)

const snapshotMagic = "TALLYSN\x01"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshotCorrupt is wrapped by every error DecodeSnapshot returns for
// bytes that are not a whole snapshot.
var ErrSnapshotCorrupt = errors.New("snapshot corrupt or truncated")

// Persists reports whether a snapshot can resume the zone's state: a local
// rate zone's (a concurrency zone's slots belong to requests a restart
// ended; quota counters are not snapshot yet).
func (z *Zone) Persists() bool {
	return z.store == nil && !z.IsConcurrency() && !z.IsQuota()
}

// MaxDebt is the most time a key can have left, Restore's cap: two bursts
// (a post-charge's debt is capped a burst beyond empty); PerRequest: 2·MaxSpan.
func (z *Zone) MaxDebt() time.Duration {
	if z.PerRequest {
		return 2 * MaxSpan
	}
	l := z.plan.limit
	return 2 * time.Duration(l.Burst) * time.Duration(l.EmissionInterval)
}

// banLeft is a ban entry v as a snapshot writes it at now; false: nothing left.
func banLeft(v, now int64) (uint64, bool) {
	left := v - v%banLevels - now
	if left <= 0 {
		return 0, false
	}
	if r := left % banLevels; r != 0 {
		left += banLevels - r
	}
	return uint64(left + v%banLevels), true
}

// AppendSnapshot appends to dst a snapshot, identified by id, of the state
// at now (monotime) and wall (the same instant), and returns it with its
// number of keys. No lock is held longer than a copy of one shard.
func (s *State) AppendSnapshot(dst []byte, id string, now int64, wall time.Time) ([]byte, int) {
	start := len(dst)
	dst = append(dst, snapshotMagic...)
	dst = binary.AppendUvarint(dst, uint64(len(id)))
	dst = append(dst, id...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(wall.UnixNano()))
	var c keytable.Copy
	keys := 0
	for kind, table := range [...]*Table{SnapshotTATs: s.Local, SnapshotBans: s.Bans} {
		if table == nil {
			continue // snapshotEnd, or a zone without ban: no section
		}
		dst = append(dst, byte(kind))
		countAt := len(dst)
		dst = binary.LittleEndian.AppendUint64(dst, 0)
		n := 0
		for i := range table.kt.Shards() {
			c.Reset()
			table.kt.CopyShard(i, now, &c)
			for j := range c.Len() {
				left := uint64(c.Values[j] - now)
				if SnapshotKind(kind) == SnapshotBans {
					var ok bool
					if left, ok = banLeft(c.Values[j], now); !ok {
						continue
					}
				}
				k := c.Key(j)
				dst = binary.AppendUvarint(dst, uint64(len(k)))
				dst = append(dst, k...)
				dst = binary.AppendUvarint(dst, left)
				n++
			}
		}
		binary.LittleEndian.PutUint64(dst[countAt:], uint64(n))
		keys += n
	}
	dst = append(dst, byte(snapshotEnd))
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli)), keys
}

// Snapshot is a decoded, checked snapshot.
type Snapshot struct {
	ID   string    // the zone definition it was taken of
	Wall time.Time // when it was taken
	Keys int       // entries, all sections together

	data     []byte
	sections []snapshotSection
}

type snapshotSection struct {
	kind       SnapshotKind
	count      int
	start, end int // the entries' bytes in data
}

// DecodeSnapshot checks data whole and returns its snapshot, or an error
// wrapping ErrSnapshotCorrupt. The snapshot refers to data: keep it unchanged.
func DecodeSnapshot(data []byte) (*Snapshot, error) {
	corrupt := func(what string) (*Snapshot, error) {
		return nil, fmt.Errorf("%w: %s", ErrSnapshotCorrupt, what)
	}
	if len(data) < len(snapshotMagic)+4 || string(data[:len(snapshotMagic)]) != snapshotMagic {
		return corrupt("not a tally snapshot of this version")
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[len(body):]) {
		return corrupt("checksum mismatch")
	}
	p := len(snapshotMagic)
	idLen, n := binary.Uvarint(body[p:])
	if n <= 0 || idLen > uint64(len(body)-p-n) {
		return corrupt("bad identity")
	}
	p += n
	snap := &Snapshot{ID: string(body[p : p+int(idLen)]), data: data}
	p += int(idLen)
	if len(body)-p < 8 {
		return corrupt("no time")
	}
	snap.Wall = time.Unix(0, int64(binary.LittleEndian.Uint64(body[p:])))
	p += 8
	for {
		if p >= len(body) {
			return corrupt("sections do not end")
		}
		kind := SnapshotKind(body[p])
		p++
		if kind == snapshotEnd {
			break
		}
		if kind != SnapshotTATs && kind != SnapshotBans {
			return corrupt(fmt.Sprintf("unknown section %d", kind))
		}
		if len(body)-p < 8 {
			return corrupt("section without a count")
		}
		count := binary.LittleEndian.Uint64(body[p:])
		p += 8
		sec := snapshotSection{kind: kind, start: p}
		for ; uint64(sec.count) < count; sec.count++ {
			kl, n := binary.Uvarint(body[p:])
			if n <= 0 || kl > MaxKeyLength || kl > uint64(len(body)-p-n) {
				return corrupt("bad key")
			}
			p += n + int(kl)
			left, n := binary.Uvarint(body[p:])
			switch {
			case n <= 0:
				return corrupt("bad time left")
			case kind == SnapshotTATs && left > uint64(MaxSpan)*2:
				return corrupt("bad time left")
			case kind == SnapshotBans && (left%banLevels == 0 || left > uint64(MaxBan)*2+2*banLevels):
				return corrupt("bad ban")
			}
			p += n
		}
		sec.end = p
		snap.sections = append(snap.sections, sec)
		snap.Keys += sec.count
	}
	if p != len(body) {
		return corrupt("bytes after the end")
	}
	return snap, nil
}

// Restore merges snap into the state at now (monotime) and wall and returns
// how many keys it restored. Each key's time left is reduced by the wall
// time passed (none when the clock went back) and capped at maxDebt (a
// ban's: its level's ban and memory), so that a clock moved between runs
// never makes a key owe, or a ban last, longer than it could have. A key
// whose time ran out is skipped; one held already keeps the later entry.
func (s *State) Restore(snap *Snapshot, now int64, wall time.Time, maxDebt time.Duration) int {
	elapsed := max(0, wall.Sub(snap.Wall))
	memory := s.banCfg.BanMemory()
	restored := 0
	for _, sec := range snap.sections {
		bans := sec.kind == SnapshotBans
		t, entry := s.Local, func(left uint64) (int64, bool) {
			rem := min(time.Duration(left), maxDebt) - elapsed
			return now + int64(rem), rem > 0
		}
		if bans {
			if t = s.Bans; t == nil {
				continue // the zone lost its ban: a section to skip
			}
			entry = func(packed uint64) (int64, bool) {
				level := int(packed % banLevels)
				left := min(time.Duration(packed-packed%banLevels), s.banCfg.banLength(level)+memory) - elapsed
				// An end before now: only remembered; left <= 0: forgotten meanwhile.
				return BanEntry(satAdd(now, int64(left-memory)), level, memory), left > 0
			}
			s.banMu.Lock() // ordered with the sweep that clears anyBan
			s.anyBan.Store(true)
		}
		snapshotEntries(snap.data[sec.start:sec.end], func(key string, left uint64) {
			e, ok := entry(left)
			if !ok {
				return
			}
			t.kt.Update(key, now, func(v int64, found bool) (int64, keytable.Op) {
				if found && v >= e {
					return 0, keytable.Keep // what happened since says more
				}
				restored++
				return e, keytable.Store
			})
		})
		if bans {
			s.banMu.Unlock()
		}
	}
	return restored
}

// snapshotEntries calls f with each entry of a checked section's bytes.
func snapshotEntries(body []byte, f func(key string, left uint64)) {
	for p := 0; p < len(body); {
		kl, n := binary.Uvarint(body[p:])
		p += n
		// The table copies a key's bytes when it adds it: no copy here.
		key := unsafe.String(unsafe.SliceData(body[p:]), int(kl))
		p += int(kl)
		left, n := binary.Uvarint(body[p:])
		p += n
		f(key, left)
	}
}
