package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage" // the storage that keeps the secret

	"github.com/caddy-tally/ratelimit/challenge"
	"github.com/caddy-tally/ratelimit/zones"
)

// In a zone with delay, a solved challenge submitted again near the end of
// its replay guard's period is refused as replayed, and takes no place in
// the zone's queue: the guard is no request to wait for its turn.
func TestChallengeReplayIsRefusedInAZoneWithDelay(t *testing.T) {
	// Provisioned as provisioned does, in a config whose storage keeps
	// the secret (not the user's).
	if err := caddy.Load([]byte(`{"admin":{"disabled":true,"config":{"persist":false}},"storage":{"module":"file_system","root":`+strconv.Quote(t.TempDir())+`}}`), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	ctx, cancel := caddy.NewContext(caddy.ActiveContext())
	t.Cleanup(cancel)
	h := &Handler{RateLimits: map[string]*Zone{
		"visitors": {Key: "{http.request.header.X-A}", MaxEvents: 1, Window: caddy.Duration(time.Minute), Delay: caddy.Duration(time.Minute),
			Challenge: &Challenge{Difficulty: 1, MaxEvents: 5, Window: caddy.Duration(time.Hour)}},
	}}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	z := h.zones[0]
	c := z.challenge
	key := z.Config.Key("a")
	token := c.secrets.Issue(z.Name, key, 1, time.Now(), challengeTTL(1))
	nonce := challenge.Solve(token, 1)
	// The guard's period is 5 minutes and more; a replay in its last 40s
	// is one whose turn is within the zone's delay: so is every replay
	// under a 40s guard.
	var err error
	if c.used, err = zones.NewPlan(1, 40*time.Second, 1); err != nil {
		t.Fatal(err)
	}
	submit := func() *httptest.ResponseRecorder {
		t.Helper()
		form := url.Values{"challenge": {token}, "nonce": {nonce}, "return": {"/"}}
		r := httptest.NewRequest(http.MethodPost, challenge.VerifyPath, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("X-A", "a")
		caddyhttp.NewTestReplacer(r)
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Fatal(err)
		}
		return w
	}
	if w := submit(); w.Code != http.StatusSeeOther {
		t.Fatalf("the solution: %d %q, want 303", w.Code, w.Body.String())
	}
	w := submit()
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "replayed") || w.Header().Get("Set-Cookie") != "" {
		t.Errorf("the same solution again: %d %q Set-Cookie %q, want 403 replayed and no cookie", w.Code, w.Body.String(), w.Header().Get("Set-Cookie"))
	}
	if n := z.Waiting(); n != 0 {
		t.Errorf("%d waiting in the zone's queue after the submission, want 0", n)
	}
}
