package zones

import (
	"context"
	"testing"
	"time"
)

const sec = int64(time.Second)

func banZone(t *testing.T, events int64, window, ban, banMax time.Duration) *Zone {
	t.Helper()
	c := Config{Name: "z", Events: events, Window: window, Ban: ban, BanMax: banMax}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	s := NewState(c, time.Hour)
	t.Cleanup(func() { _ = s.Destruct() })
	return mustNew(c, s, nil)
}

// The local case, on a clock of our own: events 3 window 3s ban 5s.
func TestBanHoldsPastWhatTheRateGivesBack(t *testing.T) {
	z := banZone(t, 3, 3*time.Second, 5*time.Second, 0)
	ctx, now := context.Background(), 100*sec
	for i := range 3 {
		if d := z.Decide(ctx, "k", now); !d.Allowed {
			t.Fatalf("request %d denied", i+1)
		}
	}
	d := z.Decide(ctx, "k", now)
	if d.Allowed || !d.Banned || d.BanStarted != 5*time.Second || d.RetryAfter != 5*time.Second {
		t.Fatalf("4th: %+v, want denied and banned for 5s", d)
	}
	d = z.Decide(ctx, "k", now+2*sec) // the plain zone would allow 2
	if d.Allowed || !d.Banned || d.RetryAfter != 3*time.Second || d.BanStarted != 0 {
		t.Fatalf("2s later: %+v, want banned with 3s left", d)
	}
	if !z.Denies("k", now+2*sec) {
		t.Fatal("Denies says no during the ban")
	}
	for i := range 3 {
		if d := z.Decide(ctx, "k", now+5*sec+sec/2); !d.Allowed {
			t.Fatalf("after the ban, request %d denied: %+v", i+1, d)
		}
	}
}

// A ban shorter than the rate's own retry time admits nothing the plain
// zone would not: both zones see the same requests, every 100ms for 20s,
// and the banned one never has allowed more so far.
func TestShortBanIsNoLoophole(t *testing.T) {
	for _, ban := range []time.Duration{time.Second / 2, time.Second} {
		banned := banZone(t, 3, 3*time.Second, ban, 0)
		plain := banZone(t, 3, 3*time.Second, 0, 0)
		ctx := context.Background()
		var nb, np int
		for i := range int64(200) {
			now := 100*sec + i*sec/10
			if banned.Decide(ctx, "k", now).Allowed {
				nb++
			}
			if plain.Decide(ctx, "k", now).Allowed {
				np++
			}
			if nb > np {
				t.Fatalf("ban %v: by %dms the banned zone allowed %d, the plain one %d", ban, i*100, nb, np)
			}
		}
	}
}

func TestBansEscalateAndStartOverAfterTheMemory(t *testing.T) {
	z := banZone(t, 1, time.Second, 10*time.Second, 40*time.Second)
	ctx, now := context.Background(), 100*sec
	banAt := func(want time.Duration, level int) {
		t.Helper()
		for z.Decide(ctx, "k", now).Allowed {
		}
		d := z.Decide(ctx, "k", now)
		if !d.Banned {
			t.Fatalf("not banned: %+v", d)
		}
		if got := time.Duration(d.RetryAfter); got < want || got > want+time.Microsecond || d.BanLevel != level {
			t.Fatalf("ban of %v level %d, want %v level %d", got, d.BanLevel, want, level)
		}
		now += int64(d.RetryAfter)
	}
	banAt(10*time.Second, 1)
	banAt(20*time.Second, 2)
	banAt(40*time.Second, 3)
	banAt(40*time.Second, 4) // capped
	now += 40*sec + sec      // not banned for the memory (max)
	banAt(10*time.Second, 1)
	if err := z.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d := z.Decide(ctx, "k", now); !d.Allowed {
		t.Fatalf("after a reset: %+v", d)
	}
	banAt(10*time.Second, 1) // a lifted ban forgets the level
}

func TestDryRunBansNothing(t *testing.T) {
	c := Config{Name: "z", Events: 1, Window: time.Second, Ban: time.Hour, DryRun: true}
	s := NewState(c, time.Hour)
	defer func() { _ = s.Destruct() }()
	z := mustNew(c, s, nil)
	ctx, now := context.Background(), 100*sec
	z.Decide(ctx, "k", now)
	if d := z.Decide(ctx, "k", now); d.Banned || d.BanStarted != time.Hour {
		t.Fatalf("dry run: %+v, want a would-be ban of 1h and no ban", d)
	}
	if d := z.Decide(ctx, "k", now+2*sec); !d.Allowed {
		t.Fatalf("dry run banned the key: %+v", d)
	}
}

// A dry-run zone reports each ban that would start once, not every
// would-deny of a key whose would-be ban is running: the dry-run bans
// counter counts bans, as the real one does.
func TestDryRunReportsEachWouldBeBanOnce(t *testing.T) {
	c := Config{Name: "z", Events: 1, Window: time.Minute, Ban: 10 * time.Second, DryRun: true}
	s := NewState(c, time.Hour)
	defer func() { _ = s.Destruct() }()
	z := mustNew(c, s, nil)
	ctx, now := context.Background(), 100*sec
	started := func(at int64, n int) int {
		count := 0
		for range n {
			if d := z.Decide(ctx, "k", at); d.BanStarted > 0 {
				count++
			}
		}
		return count
	}
	if n := started(now, 5); n != 1 {
		t.Fatalf("1 allowed and 4 would-denies in one would-be ban reported %d bans, want 1", n)
	}
	if n := started(now+9*sec, 3); n != 0 {
		t.Fatalf("would-denies 9s into the 10s would-be ban reported %d bans, want 0", n)
	}
	if n := started(now+10*sec, 3); n != 1 {
		t.Fatalf("would-denies once the would-be ban ended reported %d bans, want 1", n)
	}
	z.Forget("k")
	if n := started(now+11*sec, 2); n != 1 {
		t.Fatalf("a reset key's next would-deny reported %d bans, want 1 (the reset forgets the would-be ban)", n)
	}
}

func TestBanEntryRoundTrips(t *testing.T) {
	for _, end := range []int64{1, 63, 64, 65, 1 << 40, 1<<62 + 7} {
		for _, level := range []int{1, 2, 17, 63} {
			for _, mem := range []time.Duration{0, time.Hour} {
				e, l := ParseBanEntry(BanEntry(end, level, mem), mem)
				if l != level || e < end || e >= end+banLevels {
					t.Errorf("end %d level %d memory %v: got %d level %d", end, level, mem, e, l)
				}
			}
		}
	}
}

func TestBanRefusedInConcurrencyAndQuotaZones(t *testing.T) {
	for _, c := range []Config{
		{Name: "c", Concurrency: 2, Ban: time.Hour},
		{Name: "q", Quota: 10, Period: 1, Ban: time.Hour},
		{Name: "r", Events: 1, Window: time.Second, Ban: time.Hour, BanMax: time.Minute},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
