package tests

import (
	"net/http"
	"testing"
	"time"
)

// A reload that drops a persisted zone writes its final snapshot (a
// reload is no exit: the stopping event writes nothing), and a later
// reload that brings the zone back resumes from it: the key denied before
// is denied again, with what was left of its Retry-After. The periodic
// snapshot (1h) never ran.
func TestZoneDroppedByAReloadResumesFromItsFinalSnapshot(t *testing.T) {
	c := newCaddyInstance(t)
	site := persistSite(3, "1h", "24h", "")
	c.Start(c.Caddyfile("", site), "caddyfile")
	before := denyLogin(t, c)
	denied := time.Now()
	if files := snapshotFiles(t, c); len(files) != 0 {
		t.Fatalf("snapshots before any was due: %v", files)
	}
	load(t, c, "", "http:// {\n\trespond \"ok\"\n}\n")
	if r := c.Do(request{Path: "/login"}); r.Status != http.StatusOK {
		t.Fatalf("with the zone dropped: %d, want 200", r.Status)
	}
	waitFor(t, 5*time.Second, "the dropped zone's final snapshot", func() bool { return len(snapshotFiles(t, c)) == 1 })
	load(t, c, "", site)
	r := c.Do(request{Path: "/login"})
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("the zone back, the key denied before: %d, want 429 (resumed from the final snapshot)", r.Status)
	}
	want := before - int(time.Since(denied).Seconds())
	if got := retryAfter(t, r); got < want-2 || got > want+2 {
		t.Errorf("Retry-After %d with the zone back, want %d ± 2 (what the denial had left)", got, want)
	}
}
