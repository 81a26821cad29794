package tests

// GET /rate_limit/zones/<zone>/top: the keys a zone denied most, from a
// fixed-size sketch fed by the deny path.

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// adminTop is GET /rate_limit/zones/<zone>/top.
type adminTop struct {
	Zone     string          `json:"zone"`
	View     string          `json:"view"`
	Since    time.Time       `json:"since"`
	Denials  uint64          `json:"denials"`
	Capacity int             `json:"capacity"`
	Floor    uint64          `json:"floor"`
	DryRun   bool            `json:"dry_run"`
	Keys     []adminOffender `json:"keys"`
}

// adminOffender is one key of the top list.
type adminOffender struct {
	Key        string  `json:"key"`
	KeyBase64  string  `json:"key_base64"` // keys that are not UTF-8
	Denials    uint64  `json:"denials"`
	Error      uint64  `json:"error"`
	Limited    bool    `json:"limited"`
	Remaining  int64   `json:"remaining"`
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
	StateError string  `json:"state_error"`
}

// raw is the key itself: key_base64's bytes when it is there.
func (k adminOffender) raw(t *testing.T) string {
	t.Helper()
	if k.KeyBase64 == "" {
		return k.Key
	}
	b, err := base64.StdEncoding.DecodeString(k.KeyBase64)
	if err != nil {
		t.Fatalf("key_base64 %q: %v", k.KeyBase64, err)
	}
	return string(b)
}

// skewedKey is the key of request i of the flood: half the requests
// from heavy-0, a tenth each from heavy-1..heavy-4, the last tenth spread
// over 10,000 keys.
func skewedKey(i int) string {
	switch r := i % 10; {
	case r < 5:
		return "heavy-0"
	case r < 9:
		return "heavy-" + strconv.Itoa(r-4)
	default:
		return "spread-" + strconv.Itoa((i*7919)%10_000)
	}
}

// floodSkewed sends n requests of the skewed flood and returns how many of
// each key were denied.
func floodSkewed(t *testing.T, c *caddyInstance, n int) map[string]uint64 {
	t.Helper()
	statuses := make([]int, n)
	sendConcurrently(t, n, 8, func(i int) (response, error) {
		res, err := c.try(withKey(skewedKey(i)))
		statuses[i] = res.Status
		return res, err
	}, nil)
	denied := map[string]uint64{}
	for i, s := range statuses {
		if s == http.StatusTooManyRequests {
			denied[skewedKey(i)]++
		}
	}
	return denied
}

// checkTopFive checks that top names the five heavy keys, heavy-0 first,
// with bounds that hold the true denial counts.
func checkTopFive(t *testing.T, top adminTop, denied map[string]uint64) {
	t.Helper()
	var total uint64
	for _, n := range denied {
		total += n
	}
	if top.Denials != total || top.View != "instance" || top.Capacity < 5 {
		t.Errorf("top counted %d denials (view %q, capacity %d), want %d, view instance", top.Denials, top.View, top.Capacity, total)
	}
	if len(top.Keys) != 5 || top.Keys[0].Key != "heavy-0" {
		t.Fatalf("top 5 = %+v, want heavy-0 first", top.Keys)
	}
	seen := map[string]bool{}
	for _, k := range top.Keys {
		seen[k.Key] = true
		if tc := denied[k.Key]; tc > k.Denials || tc < k.Denials-k.Error {
			t.Errorf("%s: %d denials ± %d reported, %d true", k.Key, k.Denials, k.Error, tc)
		}
		// One request per hour: a key that was denied is still blocked.
		if !k.Limited || k.Remaining != 0 || k.RetryAfter < 3000 || k.RetryAfter > 3600 || k.StateError != "" {
			t.Errorf("%s state: %+v, want limited, remaining 0, retry_after about 3600", k.Key, k)
		}
	}
	for i := 0; i < 5; i++ {
		if k := "heavy-" + strconv.Itoa(i); !seen[k] {
			t.Errorf("%s is missing from the top 5: %+v", k, top.Keys)
		}
	}
}

const topSite = `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 1
			window 1h
		}
	}
	respond "ok"
}
`

func TestTopNamesTheHeavyKeysOfASkewedFlood(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, topSite)
	before := time.Now()
	denied := floodSkewed(t, c, 3000)

	var top adminTop
	c.adminJSON("/rate_limit/zones/api/top?n=5", &top)
	checkTopFive(t, top, denied)
	if top.Zone != "api" || top.Since.After(before) || top.Since.Before(before.Add(-10*time.Minute)) {
		t.Errorf("zone %q since %v, want api and a window start in the 10 minutes before the flood (%v)", top.Zone, top.Since, before)
	}

	// Without n, up to 20 keys; a reset key is shown back at its full limit.
	for i := 0; i < 30; i++ {
		if got := c.Send(2, withKey("extra-"+strconv.Itoa(i))); got[1] != http.StatusTooManyRequests {
			t.Fatalf("extra-%d: %v, want the second denied", i, got)
		}
	}
	if status, body := c.adminDo(http.MethodDelete, keyPath("api", "heavy-4")); status != http.StatusNoContent {
		t.Fatalf("DELETE heavy-4: %d %s", status, body)
	}
	c.adminJSON("/rate_limit/zones/api/top", &top)
	if len(top.Keys) != 20 {
		t.Errorf("GET .../top without n: %d keys, want 20", len(top.Keys))
	}
	for _, k := range top.Keys {
		if k.Key == "heavy-4" && (k.Limited || k.Remaining != 1) {
			t.Errorf("heavy-4 after its reset: %+v, want not limited, remaining 1", k)
		}
	}
}

func TestTopRejectsBadRequests(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, topSite)
	cases := []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/rate_limit/zones/nope/top", http.StatusNotFound},
		{http.MethodGet, "/rate_limit/zones/api/top?n=0", http.StatusBadRequest},
		{http.MethodGet, "/rate_limit/zones/api/top?n=ten", http.StatusBadRequest},
		{http.MethodPost, "/rate_limit/zones/api/top", http.StatusMethodNotAllowed},
	}
	for _, tc := range cases {
		if status, body := c.adminDo(tc.method, tc.path); status != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, status, body, tc.status)
		}
	}
	// A zone nobody was denied in has an empty list, not null.
	status, body := c.adminDo(http.MethodGet, "/rate_limit/zones/api/top")
	if status != http.StatusOK || !strings.Contains(body, `"keys":[]`) || !strings.Contains(body, `"denials":0`) {
		t.Errorf("GET top of a quiet zone: %d %s, want an empty list", status, body)
	}
}

// In strict mode the denials this instance answered from its deny cache count
// too, and the state shown is Redis's.
func TestTopInStrictModeCountsDenyCacheDenialsAndShowsRedisState(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	// A timeout long enough that the race-built Caddy on a loaded machine
	// does not fall back to its fail policy in the middle of the flood.
	c := startCaddy(t, `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 1
			window 1h
		}
		distributed {
			redis redis://`+r.Addr+`
			timeout 2s
		}
	}
	respond "ok"
}
`)
	denied := floodSkewed(t, c, 1000)
	var top adminTop
	c.adminJSON("/rate_limit/zones/api/top?n=5", &top)
	checkTopFive(t, top, denied)
}

// A concurrency zone's denials are counted too, and its keys' state is their
// slots: limited while the key's requests hold every slot.
func TestTopAndCLIShowAConcurrencyZonesSlots(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	c := startCaddy(t, concurrencySite(u, `
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 1
		}`, ""))
	// The held request waits through every CLI call below, which take
	// seconds each on a loaded machine: more than the default client's 10 s.
	hold := keyRequest("alice", "/held?gate=g")
	hold.Client = &http.Client{Timeout: 2 * time.Minute}
	held := inBackground(c, hold)
	u.waitInFlight(1)
	if got := c.Send(3, withKey("alice")); countStatuses(got)[429] != 3 {
		t.Fatalf("alice while her one slot is held: %v, want 3×429", got)
	}

	var top adminTop
	c.adminJSON("/rate_limit/zones/uploads/top", &top)
	if len(top.Keys) != 1 || top.Keys[0].Key != "alice" || top.Keys[0].Denials != 3 || !top.Keys[0].Limited || top.Keys[0].Remaining != 0 {
		t.Fatalf("top of the concurrency zone: %+v, want alice, 3 denials, limited", top.Keys)
	}
	lines := rateLimitCLI(t, c, "top", "uploads").ok(t, "top uploads")
	if got := strings.Join(row(lines, `"alice"`), " "); got != `"alice" 3 LIMITED` {
		t.Errorf("top uploads row %q, want \"alice\" 3 LIMITED\n%s", got, strings.Join(lines, "\n"))
	}
	if out := rateLimitCLI(t, c, "key", "uploads", "alice").ok(t, "key uploads alice")[0]; out != `zone uploads, key "alice": LIMITED, 1 of 1 slots in use` {
		t.Errorf("key uploads alice: %q", out)
	}
	if got := strings.Join(row(rateLimitCLI(t, c, "zones").ok(t, "zones"), "uploads"), " "); !strings.HasPrefix(got, "uploads 1 in flight - local local") {
		t.Errorf("zones row %q, want uploads 1 in flight - local local ...", got)
	}

	// Slots end with their requests: the API refuses to reset them, and
	// the CLI passes its reason on.
	if r := rateLimitCLI(t, c, "reset", "uploads", "alice"); r.code != 1 || !strings.Contains(r.stderr, "HTTP 400: a concurrency zone's slots cannot be reset") {
		t.Errorf("reset uploads alice: exit %d, stderr %q", r.code, r.stderr)
	}

	u.open("g")
	if res := <-held; res.Status != http.StatusOK {
		t.Fatalf("the held request: %d", res.Status)
	}
	waitFor(t, 5*time.Second, "alice's slot to be free in the top list", func() bool {
		c.adminJSON("/rate_limit/zones/uploads/top", &top)
		return len(top.Keys) == 1 && !top.Keys[0].Limited && top.Keys[0].Remaining == 1
	})
	if out := rateLimitCLI(t, c, "key", "uploads", "alice").ok(t, "key uploads alice")[0]; out != `zone uploads, key "alice": not limited, 0 of 1 slots in use` {
		t.Errorf("key uploads alice after her request ended: %q", out)
	}
}

// floor is the most any key left out of the list was denied, which is what
// lets `caddy rate-limit top` merge instances soundly: in a top 20 of 30 keys
// denied 1 to 30 times, the first key cut off was denied 10 times, so floor
// is at least 10 (and at most 11, the least listed).
func TestTopFloorBoundsTheKeysItCutOff(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, topSite)
	for i := 0; i < 30; i++ {
		key := "k-" + strconv.Itoa(i)
		if got := countStatuses(c.Send(i+2, withKey(key))); got[429] != i+1 {
			t.Fatalf("%s: %v, want %d denials", key, got, i+1)
		}
	}
	var top adminTop
	c.adminJSON("/rate_limit/zones/api/top?n=20", &top)
	if len(top.Keys) != 20 || top.Keys[0].Key != "k-29" || top.Keys[19].Key != "k-10" || top.Keys[19].Denials != 11 {
		t.Fatalf("top 20 of 30: %+v, want k-29 (30 denials) down to k-10 (11)", top.Keys)
	}
	if top.Floor < 10 || top.Floor > 11 {
		t.Errorf("floor %d, want 10 or 11: k-9, cut off, was denied 10 times", top.Floor)
	}
}

// A dry-run zone's clients see RateLimit-Remaining: 0 on 200s; top tells the
// same story: it counts the would-be denials, marked as a dry run's.
func TestTopCountsADryRunZonesWouldBeDenials(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, strings.Replace(topSite, "window 1h", "window 1h\n\t\t\tdry_run", 1))
	for i, res := range []response{c.Do(withKey("alice")), c.Do(withKey("alice")), c.Do(withKey("alice"))} {
		if res.Status != 200 {
			t.Fatalf("request %d of alice to a dry-run zone: %d, want 200", i+1, res.Status)
		}
	}
	var top adminTop
	c.adminJSON("/rate_limit/zones/api/top", &top)
	if !top.DryRun || top.Denials != 2 || len(top.Keys) != 1 || top.Keys[0].Key != "alice" || top.Keys[0].Denials != 2 {
		t.Fatalf("top of a dry-run zone after 3 requests of alice at 1 per hour: %+v, want dry_run, alice with 2 would-be denials", top)
	}
	lines := rateLimitCLI(t, c, "top", "api").ok(t, "top api")
	if !strings.Contains(lines[0], "2 would-be denials (dry run)") || row(lines, `"alice"`) == nil || row(lines, `"alice"`)[1] != "2" {
		t.Errorf("caddy rate-limit top api:\n%s\nwant 2 would-be denials (dry run), alice 2", strings.Join(lines, "\n"))
	}
}
