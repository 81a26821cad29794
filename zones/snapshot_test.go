package zones

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"
)

var snapConfig = Config{Name: "login", Events: 3, Window: time.Hour}

// deny spends key's burst in z at now and returns the denial's Retry-After.
func deny(t *testing.T, z *Zone, key string, now int64) time.Duration {
	t.Helper()
	for range 3 {
		if d := z.Decide(context.Background(), key, now); !d.Allowed {
			t.Fatalf("%s denied before its burst was spent", key)
		}
	}
	d := z.Decide(context.Background(), key, now)
	if d.Allowed {
		t.Fatalf("%s allowed past its burst", key)
	}
	return d.RetryAfter
}

func newSnapZone(t *testing.T) *Zone {
	t.Helper()
	st := NewState(snapConfig, time.Hour)
	t.Cleanup(func() { _ = st.Destruct() })
	return mustNew(snapConfig, st, nil)
}

// A denied key is still denied, with the same Retry-After less the wall time
// that passed, in a fresh state restored from a snapshot of the old one; a
// key that was at full burst is not in the snapshot at all.
func TestRestoredKeyIsDeniedWithTheSameRetryAfter(t *testing.T) {
	old := newSnapZone(t)
	wall := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	retry := deny(t, old, "10.0.0.1", 1_000)
	old.Decide(context.Background(), "10.0.0.2", 1_000) // one request: in the snapshot
	data, keys := old.State().AppendSnapshot(nil, "id", 1_000, wall)
	if keys != 2 {
		t.Fatalf("snapshot holds %d keys, want 2", keys)
	}
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	if snap.ID != "id" || !snap.Wall.Equal(wall) || snap.Keys != 2 {
		t.Fatalf("decoded %q %v %d, want id %v 2", snap.ID, snap.Wall, snap.Keys, wall)
	}

	fresh := newSnapZone(t)
	const now = 77_000_000 // another process's monotonic clock
	if n := fresh.State().Restore(snap, now, wall.Add(10*time.Second), fresh.MaxDebt()); n != 2 {
		t.Fatalf("restored %d keys, want 2", n)
	}
	d := fresh.Decide(context.Background(), "10.0.0.1", now)
	if d.Allowed || d.RetryAfter != retry-10*time.Second {
		t.Fatalf("after the restore: allowed %v, retry %v, want denied with %v", d.Allowed, d.RetryAfter, retry-10*time.Second)
	}
	if d := fresh.Decide(context.Background(), "10.0.0.3", now); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("another key after the restore: %+v, want allowed at full burst", d)
	}
}

// Every truncation and every flipped byte of a snapshot (TATs and bans)
// is refused as corrupt, and nothing of it is applied.
func TestCorruptOrTruncatedSnapshotIsRefusedWhole(t *testing.T) {
	old := newBanSnapZone(t)
	for i := range 5 {
		deny(t, old, "key-"+strconv.Itoa(i), 1_000)
	}
	data, keys := old.State().AppendSnapshot(nil, "zone login 3/1h", 1_000, time.Now())
	if keys != 10 {
		t.Fatalf("snapshot holds %d entries, want 10 (5 TATs, 5 bans)", keys)
	}
	for n := range len(data) {
		if _, err := DecodeSnapshot(data[:n]); !errors.Is(err, ErrSnapshotCorrupt) {
			t.Fatalf("truncated to %d of %d bytes: %v, want ErrSnapshotCorrupt", n, len(data), err)
		}
	}
	for i := range data {
		bad := append([]byte(nil), data...)
		bad[i] ^= 0x20
		if _, err := DecodeSnapshot(bad); !errors.Is(err, ErrSnapshotCorrupt) {
			t.Fatalf("byte %d flipped: %v, want ErrSnapshotCorrupt", i, err)
		}
	}
	if _, err := DecodeSnapshot(append(data, 0)); !errors.Is(err, ErrSnapshotCorrupt) {
		t.Fatalf("a byte appended: %v, want ErrSnapshotCorrupt", err)
	}
}

// A wall clock that went back between the runs is taken as no time passed,
// and a time left longer than the zone's most debt is capped: a key never
// owes more than it could have owed.
func TestRestoreClampsAClockThatMoved(t *testing.T) {
	old := newSnapZone(t)
	wall := time.Now()
	retry := deny(t, old, "a", 0)
	old.State().Local.Set("b", int64(50*time.Hour), 0) // more than two bursts (2h)
	data, _ := old.State().AppendSnapshot(nil, "id", 0, wall)
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	fresh := newSnapZone(t)
	fresh.State().Restore(snap, 0, wall.Add(-time.Hour), fresh.MaxDebt()) // the clock went back an hour
	if d := fresh.Decide(context.Background(), "a", 0); d.Allowed || d.RetryAfter != retry {
		t.Errorf("clock back: %+v, want denied with %v as when the snapshot was taken", d, retry)
	}
	if v, _ := fresh.State().Local.Get("b", 0); time.Duration(v) != 2*time.Hour {
		t.Errorf("a key with 50h left restored with %v, want the zone's most debt, 2h", time.Duration(v))
	}
	// A clock far ahead: everything ran out.
	later := newSnapZone(t)
	if n := later.State().Restore(snap, 0, wall.Add(3*time.Hour), later.MaxDebt()); n != 0 {
		t.Errorf("3h later restored %d keys, want 0", n)
	}
}

// A restore merged into a state that already holds keys keeps, for each
// key, the later of its live and its snapshot time.
func TestRestoreMergesWithLiveStateLaterTimeWins(t *testing.T) {
	old := newSnapZone(t)
	wall := time.Now()
	old.State().Local.Set("snapshot-later", 100, 0)
	old.State().Local.Set("live-later", 100, 0)
	old.State().Local.Set("snapshot-only", 100, 0)
	data, _ := old.State().AppendSnapshot(nil, "id", 0, wall)
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	live := newSnapZone(t)
	live.State().Local.Set("snapshot-later", 1_050, 1_000)
	live.State().Local.Set("live-later", 1_500, 1_000)
	live.State().Local.Set("live-only", 1_500, 1_000)
	if n := live.State().Restore(snap, 1_000, wall, time.Hour); n != 2 {
		t.Errorf("restored %d keys, want 2 (snapshot-later, snapshot-only)", n)
	}
	for key, want := range map[string]int64{"snapshot-later": 1_100, "live-later": 1_500, "snapshot-only": 1_100, "live-only": 1_500} {
		if v, _ := live.State().Local.Get(key, 1_000); v != want {
			t.Errorf("%s = %d, want %d", key, v, want)
		}
	}
}

// A snapshot taken while many goroutines decide holds every key that was
// denied before it started, and takes no lock a request waits on for
// longer than a shard copy (run with -race).
func TestSnapshotWhileRequestsDecide(t *testing.T) {
	z := newSnapZone(t)
	ctx := context.Background()
	for i := range 1000 {
		deny(t, z, "denied-"+strconv.Itoa(i), 0)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				z.Decide(ctx, "churn-"+strconv.Itoa(g)+"-"+strconv.Itoa(i%5000), int64(i))
			}
		}()
	}
	var data []byte
	for range 5 {
		var keys int
		data, keys = z.State().AppendSnapshot(data[:0], "id", 0, time.Now())
		if keys < 1000 {
			t.Errorf("snapshot holds %d keys, want at least the 1000 denied ones", keys)
		}
	}
	close(stop)
	wg.Wait()
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	fresh := newSnapZone(t)
	fresh.State().Restore(snap, 0, snap.Wall, fresh.MaxDebt())
	for i := range 1000 {
		if d := fresh.Decide(ctx, "denied-"+strconv.Itoa(i), 0); d.Allowed {
			t.Fatalf("denied-%d allowed after the restore", i)
		}
	}
}

// Only local rate zones persist.
func TestOnlyLocalRateZonesPersist(t *testing.T) {
	if !newSnapZone(t).Persists() {
		t.Error("a local rate zone does not persist")
	}
	c := Config{Name: "c", Concurrency: 2}
	st := NewState(c, time.Hour)
	defer st.Destruct()
	if mustNew(c, st, nil).Persists() {
		t.Error("a concurrency zone persists")
	}
}

var banSnapConfig = Config{Name: "login", Events: 3, Window: time.Hour, Ban: time.Hour, BanMax: 4 * time.Hour}

func newBanSnapZone(t *testing.T) *Zone {
	t.Helper()
	st := NewState(banSnapConfig, time.Hour)
	t.Cleanup(func() { _ = st.Destruct() })
	return mustNew(banSnapConfig, st, nil)
}

// near reports whether d is within a ban entry's rounding (banLevels ns)
// of want.
func near(d, want time.Duration) bool { return d >= want && d-want < banLevels }

// A banned key is still banned after a snapshot and a restore into another
// process's clock, at the same level, for its time left less the wall time
// that passed; a key whose ban ended but that is still remembered is banned
// one level up when it is denied again; a ban is never lengthened past the
// length of its level, whatever the clocks say.
func TestSnapshotKeepsBansTheirLevelAndMemory(t *testing.T) {
	ctx := context.Background()
	old := newBanSnapZone(t)
	wall := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	hour := int64(time.Hour)
	deny(t, old, "twice", 0)
	deny(t, old, "twice", hour+1) // its first ban ended: the second is level 2, 2h
	deny(t, old, "remembered", 0) // its 1h ban ends at 1h: remembered for 4h more
	now := hour + 1
	if d := old.Decide(ctx, "twice", now); !d.Banned || d.BanLevel != 2 || !near(d.RetryAfter, 2*time.Hour) {
		t.Fatalf("before the snapshot: %+v, want banned at level 2 for 2h", d)
	}
	data, _ := old.State().AppendSnapshot(nil, "id", now, wall)
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}

	fresh := newBanSnapZone(t)
	const other = 77_000_000_123 // another process's monotonic clock
	fresh.State().Restore(snap, other, wall.Add(10*time.Second), fresh.MaxDebt())
	d := fresh.Decide(ctx, "twice", other)
	if !d.Banned || d.BanLevel != 2 || !near(d.RetryAfter, 2*time.Hour-10*time.Second) {
		t.Fatalf("after the restore: %+v, want banned at level 2 for 2h less 10s", d)
	}
	if got := fresh.Bans(other); len(got) != 1 || got[0].Key != "twice" || got[0].Level != 2 {
		t.Errorf("bans listed after the restore: %v, want [twice]", got)
	}
	// "remembered" is not banned (its ban ended) but a denial bans it at level 2.
	if b, banned := fresh.BanOf("remembered", other); banned {
		t.Fatalf("remembered after the restore: %+v, want its ban over", b)
	}
	if d := deny(t, fresh, "remembered", other); !near(d, 2*time.Hour) {
		t.Errorf("remembered denied again after the restore: retry %v, want a level 2 ban of 2h", d)
	}

	// A clock that went back an hour: no time passed, and no longer a ban.
	back := newBanSnapZone(t)
	back.State().Restore(snap, 0, wall.Add(-time.Hour), back.MaxDebt())
	if d := back.Decide(ctx, "twice", 0); !d.Banned || !near(d.RetryAfter, 2*time.Hour) {
		t.Errorf("clock back: %+v, want banned for the 2h left when the snapshot was taken", d)
	}
	// An entry longer than its level's ban (as a clock that moved would
	// leave it) is capped at that length.
	long := newBanSnapZone(t)
	long.State().Bans.Set("long", BanEntry(50*hour, 1, banSnapConfig.BanMemory()), 0)
	data, _ = long.State().AppendSnapshot(nil, "id", 0, wall)
	if snap, err = DecodeSnapshot(data); err != nil {
		t.Fatal(err)
	}
	capped := newBanSnapZone(t)
	capped.State().Restore(snap, 0, wall, capped.MaxDebt())
	if d := capped.Decide(ctx, "long", 0); !d.Banned || !near(d.RetryAfter, time.Hour) {
		t.Errorf("a level 1 ban with 50h left restored as %+v, want capped at 1h", d)
	}
	// Later entry wins: a live ban longer than the snapshot's is kept.
	live := newBanSnapZone(t)
	live.State().Bans.Set("long", BanEntry(3*hour, 3, banSnapConfig.BanMemory()), 0)
	live.State().anyBan.Store(true)
	live.State().Restore(snap, 0, wall, live.MaxDebt())
	if d := live.Decide(ctx, "long", 0); !d.Banned || d.BanLevel != 3 || !near(d.RetryAfter, 3*time.Hour) {
		t.Errorf("a live 3h ban after a restore of a 1h one: %+v, want the live one", d)
	}
}
