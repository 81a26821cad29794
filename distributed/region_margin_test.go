package distributed

import (
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// An instance whose poll of its region's shares failed once keeps the
// share it read until the next poll has had its round trip: the margin a
// cut waits is two polls (one may fail) and twice the regional timeout.
// Only an instance that has not read the shares for longer holds its
// floor. Polls every 250 ms (sync_interval 1s), regional timeout 100 ms.
func TestGlobalInstanceThatMissesOnePollKeepsItsShare(t *testing.T) {
	const (
		P   = 250 * time.Millisecond // the poll interval
		tau = 100 * time.Millisecond // the regional timeout
	)
	r := &Region{zones: map[string]*regionZone{}, prefix: "tally:", timeout: tau,
		opts: RegionOptions{SyncInterval: 4 * P}, weight: ShareScale / 2, floor: ShareScale / 20}
	if got := r.pollInterval(); got != P {
		t.Fatalf("poll interval %v, want %v", got, P)
	}
	r.AddZone("api", algorithms.NewLimit(600, int64(time.Minute), 20))
	z := r.zone("api")
	granted := int64(ShareScale * 9 / 10)
	z.shares.Store(&map[string]int64{"k": granted})
	for _, c := range []struct {
		name  string
		stale time.Duration // since the last successful poll began
		want  int64
	}{
		{"the next poll on time", P + tau, granted},
		{"one poll refused at once, the next in its round trip", 2*P + tau/2, granted},
		{"one poll timed out, the next just sent", 2*P + tau, granted},
		{"one poll timed out, the next at the end of its round trip", 2*P + 2*tau - 10*time.Millisecond, granted},
		{"past the margin: a cut may have been missed", 2*P + 2*tau + 10*time.Millisecond, r.floor},
	} {
		r.polled.Store(monotime.Now() - int64(c.stale))
		if got := r.Share("api", "k"); got != c.want {
			t.Errorf("%s (shares read %v ago): share %d, want %d", c.name, c.stale, got, c.want)
		}
	}
}

// A coordinator that syncs at a poll (a raise waits on another region's
// cut) collects about one poll's counts, and its instances push theirs
// once a poll on tickers of their own: such a window may hold no push of
// a key whose demand goes on. It must not report that demand gone, which
// would drop it in the global store and start the move over. A window of
// a whole interval with no counts does say it is gone.
func TestGlobalSyncAtAPollKeepsADemandItHeardNoCountOf(t *testing.T) {
	const interval = 6 * time.Second
	r := &Region{zones: map[string]*regionZone{}, prefix: "tally:", timeout: 200 * time.Millisecond,
		opts: RegionOptions{SyncInterval: interval, Refresh: 15 * time.Second}, weight: ShareScale / 2, floor: ShareScale / 20}
	r.AddZone("api", algorithms.NewLimit(600, int64(time.Minute), 20))
	now := monotime.Now()
	noCounts := []any{int64(0)} // the collect: no key counted in zone api
	for _, c := range []struct {
		name    string
		elapsed time.Duration
		atPoll  bool
		gone    bool
	}{
		{"a sync at a poll", r.pollInterval(), true, false},
		{"a sync an interval after the last", interval, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.coord.held = map[string]*coordZone{}
			// us holds its floor and last reported demand for k; a held
			// key, and one it holds nothing of (at its weight)
			api := r.coord.zone("api")
			api.held["k"] = &holding{cur: r.floor}
			api.sent["k"] = &lastReport{wants: ShareScale, held: r.floor, at: now}
			api.sent["j"] = &lastReport{wants: ShareScale, held: r.weight, at: now}
			reps := r.reports(r.set.Load().zones, now+int64(c.elapsed), noCounts, int64(c.elapsed), false, c.atPoll)
			withdrawn := map[string]bool{}
			for _, rep := range reps {
				for k, s := range rep.keys {
					if s.wants < 0 {
						withdrawn[k] = true
					}
				}
			}
			for _, k := range []string{"k", "j"} {
				if withdrawn[k] != c.gone {
					t.Errorf("key %s: reported gone %v, want %v", k, withdrawn[k], c.gone)
				}
			}
		})
	}
}

// During a cut's confirmation margin the region reports the old, larger
// share as held, in full syncs and in syncs of the keys due alike: the
// global store must not hand what was cut to another region while an
// instance may still spend it. Once the margin ends it reports the cut.
func TestGlobalCutReportsTheOldShareUntilItsMarginEnds(t *testing.T) {
	r := &Region{zones: map[string]*regionZone{}, prefix: "tally:", timeout: 100 * time.Millisecond,
		opts: RegionOptions{SyncInterval: time.Second, Refresh: 10 * time.Second}, weight: ShareScale / 2, floor: ShareScale / 20}
	r.AddZone("api", algorithms.NewLimit(600, int64(time.Minute), 20))
	const old, cut = ShareScale * 9 / 10, ShareScale / 10
	now := monotime.Now()
	end := now + int64(r.confirmMargin())
	noCounts := []any{int64(0)}
	for _, c := range []struct {
		name string
		at   int64
		full bool
		want int64
	}{
		{"full sync within the margin", now + 1, true, old},
		{"sync of the keys due within the margin", now + 1, false, old},
		{"full sync after the margin", end + 1, true, cut},
		{"sync of the keys due after the margin", end + 1, false, cut},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.coord.held = map[string]*coordZone{}
			api := r.coord.zone("api")
			api.held["k"] = &holding{cur: cut, prev: old, prevUntil: end}
			api.sent["k"] = &lastReport{wants: -1, held: old, at: now}
			r.coord.full = c.full
			reps := r.reports(r.set.Load().zones, c.at, noCounts, int64(time.Second), false, false)
			held := int64(old) // not reported: the global store keeps what it last heard
			for _, rep := range reps {
				if s := rep.keys["k"]; s != nil {
					held = s.held
				}
			}
			if held != c.want {
				t.Errorf("the global store counts k's share as %d, want %d", held, c.want)
			}
		})
	}
}
