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
	z.mu.Lock()
	z.shares["k"] = granted
	z.mu.Unlock()
	z.read.Store(true)
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
