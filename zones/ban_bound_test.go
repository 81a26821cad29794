package zones

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// banZoneOf is banZone with max_keys.
func banZoneOf(t *testing.T, maxKeys int64, events int64, window, ban, banMax time.Duration) *Zone {
	t.Helper()
	c := Config{Name: "z", Events: events, Window: window, Ban: ban, BanMax: banMax, MaxKeys: maxKeys}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	s := NewState(c, time.Hour)
	t.Cleanup(func() { _ = s.Destruct() })
	return mustNew(c, s, nil)
}

// countDropped counts the bans z reports it did not keep in its table.
func countDropped(t *testing.T, z *Zone) *int64 {
	var table int64
	z.OnBanDropped = func(fromList bool, n int64) {
		if fromList {
			t.Errorf("a local zone reported a ban dropped from a list")
		}
		table += n
	}
	return &table
}

// banKey spends key's one event and starts its ban, at now.
func banKey(t *testing.T, z *Zone, key string, now int64) Decision {
	t.Helper()
	ctx := context.Background()
	z.Decide(ctx, key, now)
	return z.Decide(ctx, key, now)
}

// The D4 in local mode: max_keys 200, the victim banned for 10
// minutes, then 2,000 other keys banned. The victim's ban holds (a running
// ban is never evicted), the gauge says the 200 enforced, the rate's keys
// stay within max_keys, and the 1,801 bans that found no room are counted.
func TestFloodOfBannedKeysNeverLiftsARunningBan(t *testing.T) {
	z := banZoneOf(t, 200, 1, time.Minute, 10*time.Minute, 0)
	now := 100 * sec
	var dropped []int64
	z.OnBanDropped = func(fromList bool, n int64) {
		if fromList {
			t.Errorf("a local zone reported a ban dropped from a list")
		}
		dropped = append(dropped, n)
	}
	if d := banKey(t, z, "victim", now); !d.Banned || d.BanStarted != 10*time.Minute {
		t.Fatalf("victim: %+v, want a 10m ban", d)
	}
	for i := range 2000 {
		now += int64(time.Millisecond)
		banKey(t, z, fmt.Sprintf("flood-%d", i), now)
	}
	now += sec
	d := z.Decide(context.Background(), "victim", now)
	if d.Allowed || !d.Banned || d.RetryAfter < 9*time.Minute {
		t.Fatalf("victim a second after the flood: %+v, want still banned for about 9m55s", d)
	}
	if got := z.BannedKeys(now); got != 200 {
		t.Errorf("BannedKeys = %d, want the 200 bans enforced", got)
	}
	if got := z.Keys(); got > 200 {
		t.Errorf("Keys = %d, want at most max_keys 200", got)
	}
	var table int64
	for _, n := range dropped {
		table += n
	}
	if table != 1801 || len(dropped) != 1801 {
		t.Errorf("OnBanDropped called %d times for %d bans, want 1801 from the table", len(dropped), table)
	}
	// A key whose ban found no room still has the zone's rate.
	if d := z.Decide(context.Background(), "flood-1999", now); d.Allowed || d.Banned {
		t.Errorf("a flood key without room for its ban: %+v, want denied by the rate, not banned", d)
	}
}

// A full ban table makes room from the bans that have ended (remembered
// for escalation, which lose their level) and refuses a ban only when
// every entry it samples is a running ban.
func TestFullBanTableEvictsEndedBansBeforeRefusing(t *testing.T) {
	z := banZoneOf(t, 2, 1, time.Second, 10*time.Second, time.Hour)
	table := countDropped(t, z)
	now := 100 * sec
	banKey(t, z, "a", now)
	banKey(t, z, "b", now)
	now += 11 * sec // both ended, remembered for an hour
	if d := banKey(t, z, "c", now); !d.Banned || d.BanStarted != 10*time.Second {
		t.Fatalf("c, with only ended bans in the table: %+v, want a first ban", d)
	}
	if d := banKey(t, z, "d", now); !d.Banned {
		t.Fatalf("d, with one ended ban left: %+v, want banned", d)
	}
	if d := banKey(t, z, "e", now); d.Banned {
		t.Fatalf("e, with two running bans: %+v, want no ban (no room)", d)
	}
	for _, k := range []string{"c", "d"} {
		if _, ok := z.BanOf(k, now+sec); !ok {
			t.Errorf("%s's running ban was evicted", k)
		}
	}
	if *table != 1 {
		t.Errorf("dropped from the table: %d, want 1", *table)
	}
}

// Bans learnt from the fleet-wide list (async mode) never evict the running
// bans either, and the gauge counts what the table enforces.
func TestLearntBansNeverEvictRunningBans(t *testing.T) {
	z := banZoneOf(t, 200, 1, time.Minute, 10*time.Minute, 0)
	table := countDropped(t, z)
	now := 100 * sec
	banKey(t, z, "victim", now)
	bans := make([]Ban, 300)
	for i := range bans {
		bans[i] = Ban{Key: fmt.Sprintf("other-%d", i), Left: 20 * time.Minute, Level: 1}
	}
	z.LearnBans(z.BanSyncStart(), bans, now+sec)
	if _, ok := z.BanOf("victim", now+2*sec); !ok {
		t.Fatal("the victim's ban was evicted by bans learnt from the list")
	}
	if got := z.BannedKeys(now + 2*sec); got != 200 {
		t.Errorf("BannedKeys = %d, want 200", got)
	}
	if *table != 101 {
		t.Errorf("dropped from the table: %d, want 101", *table)
	}
}

// The gauge counts running bans only: not the ones that ended, even while
// they are remembered for escalation.
func TestBannedKeysCountsRunningBansOnly(t *testing.T) {
	z := banZoneOf(t, 100, 1, time.Second, 10*time.Second, time.Hour)
	now := 100 * sec
	banKey(t, z, "a", now)
	banKey(t, z, "b", now+5*sec)
	for _, c := range []struct {
		at   int64
		want int
	}{{now + sec, 2}, {now + 10*sec + sec/10, 1}, {now + 15*sec + sec/10, 0}} {
		if got := z.BannedKeys(c.at); got != c.want {
			t.Errorf("at +%v: BannedKeys = %d, want %d", time.Duration(c.at-now), got, c.want)
		}
	}
}
