package tests

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-tally/ratelimit/challenge"
)

// challengeZone is the issue's zone block, as written.
const challengeZone = `		zone visitors {
			key {client_ip}
			ipv6_prefix 64
			events 30
			window 1m
			challenge {
				difficulty 4
				valid 24h
				events 600
				window 1h
			}
		}
`

const challengeSite = `http:// {
	rate_limit {
` + challengeZone + `	}
	respond "id={http.rate_limit.visitors.identity}"
}
`

var browserAccept = map[string]string{"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}

// spend sends the zone's 30 requests of the client's key, each allowed.
func spend(t *testing.T, c *caddyInstance, r request) {
	t.Helper()
	for i := range 30 {
		if res := c.Do(r); res.Status != http.StatusOK {
			t.Fatalf("request %d of the zone's 30: %d, want 200", i+1, res.Status)
		}
	}
}

// challenged GETs path as a browser navigates and returns the challenge
// the page carries, failing the test when it is no challenge page.
func challenged(t *testing.T, c *caddyInstance, path string, client *http.Client) (token string, d int, action string) {
	t.Helper()
	res := c.Do(request{Path: path, Header: browserAccept, Client: client})
	token, d, action, ok := pageChallenge(res.Body)
	if res.Status != http.StatusTooManyRequests || !ok {
		t.Fatalf("a browser's GET %s past the limit: %d %q, want 429 with the challenge page", path, res.Status, tail(res.Body, 3))
	}
	return token, d, action
}

// solvedCookie solves a challenge of c from client and returns the cookie
// the submission set.
func solvedCookie(t *testing.T, c *caddyInstance, client *http.Client) *http.Cookie {
	t.Helper()
	token, d, action := challenged(t, c, "/", client)
	res := submitChallenge(t, client, c.URL, action, token, solveChallenge(t, token, d), "/")
	if res.Status != http.StatusSeeOther {
		t.Fatalf("a solved challenge: %d %q, want 303", res.Status, res.Body)
	}
	for _, ck := range (&http.Response{Header: res.Header}).Cookies() {
		if ck.Name == "tally_visitors" {
			return ck
		}
	}
	t.Fatalf("a solved challenge set no tally_visitors cookie: %v", res.Header["Set-Cookie"])
	return nil
}

func withCookie(ck *http.Cookie) request {
	return request{Header: map[string]string{"Cookie": ck.Name + "=" + ck.Value}}
}

func challengeMetric(t *testing.T, c *caddyInstance, name string, labels map[string]string) float64 {
	t.Helper()
	labels["zone"] = "visitors"
	v, _ := metricValue(c.scrape(), "caddy_rate_limit_"+name, labels)
	return v
}

// A browser's navigation past the limit gets the challenge page, anything
// else the zone's 429; solving it returns to the page with its query and
// sets a cookie whose identity has the block's budget, exactly.
func TestChallengePageThenTheCookiesOwnBudget(t *testing.T) {
	c := startCaddyWith(t, "metrics", challengeSite)
	spend(t, c, request{})

	for _, r := range []request{{}, {Header: map[string]string{"Accept": "application/json"}}} {
		if res := c.Do(r); res.Status != http.StatusTooManyRequests || strings.Contains(res.Body, "tally-challenge") {
			t.Fatalf("a GET with Accept %q past the limit: %d %q, want the zone's 429 without a challenge", r.Header["Accept"], res.Status, res.Body)
		}
	}
	post, _ := http.NewRequest(http.MethodPost, c.URL+"/form", strings.NewReader("a=1"))
	post.Header.Set("Accept", browserAccept["Accept"])
	if res, err := c.client.Do(post); err != nil || res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a browser's POST past the limit: %v %v, want the zone's 429 (a POST is never challenged)", res, err)
	} else {
		res.Body.Close()
	}

	res := c.Do(request{Path: "/page?x=1&y=2", Header: browserAccept})
	token, d, action, ok := pageChallenge(res.Body)
	switch {
	case res.Status != http.StatusTooManyRequests || !ok:
		t.Fatalf("a browser's GET past the limit: %d %q, want 429 with the challenge page", res.Status, res.Body)
	case !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") || res.Header.Get("Cache-Control") != "no-store" || res.Header.Get("Retry-After") == "":
		t.Fatalf("the challenge page's headers: %v, want text/html, Cache-Control: no-store and Retry-After", res.Header)
	case d != 4 || action != challenge.VerifyPath || !strings.Contains(res.Body, "may take a second or two"):
		t.Fatalf("the page's challenge: difficulty %d action %q, want 4 and %s, and the page saying it may take a second or two", d, action, challenge.VerifyPath)
	}

	sub := submitChallenge(t, c.client, c.URL, action, token, solveChallenge(t, token, d), "/page?x=1&y=2")
	if sub.Status != http.StatusSeeOther || sub.Header.Get("Location") != "/page?x=1&y=2" {
		t.Fatalf("a solved challenge: %d Location %q, want 303 to /page?x=1&y=2", sub.Status, sub.Header.Get("Location"))
	}
	set := strings.Join(sub.Header["Set-Cookie"], "\n")
	for _, attr := range []string{"tally_visitors=", "Path=/", "HttpOnly", "SameSite=Lax", "Max-Age=86400"} {
		if !strings.Contains(set, attr) {
			t.Fatalf("the cookie %q lacks %s", set, attr)
		}
	}
	if strings.Contains(set, "Secure") {
		t.Fatalf("the cookie %q is Secure on plain HTTP: the browser would not send it back", set)
	}
	ck := (&http.Response{Header: sub.Header}).Cookies()[0]

	var identity string
	for i := range 600 {
		res := c.Do(withCookie(ck))
		if res.Status != http.StatusOK || !strings.HasPrefix(res.Body, "id=cookie:") {
			t.Fatalf("request %d of the cookie's 600: %d %q, want 200 with the cookie's identity in the placeholder", i+1, res.Status, res.Body)
		}
		identity = strings.TrimPrefix(res.Body, "id=")
	}
	if res := c.Do(withCookie(ck)); res.Status != http.StatusTooManyRequests {
		t.Fatalf("the cookie's 601st request: %d, want 429", res.Status)
	}

	// The identity is a key as any other: top shows it, and a deny
	// override of it refuses its browser without a new challenge.
	var top adminTop
	c.adminJSON("/rate_limit/zones/visitors/top", &top)
	if !strings.Contains(fmt.Sprint(top.Keys), identity) {
		t.Errorf("top of zone visitors: %+v, want the cookie's identity %s", top.Keys, identity)
	}
	spentBrowser := withCookie(ck)
	spentBrowser.Header["Accept"] = browserAccept["Accept"]
	if _, _, _, ok := pageChallenge(c.Do(spentBrowser).Body); !ok {
		t.Fatalf("a spent cookie's browser: no challenge page, want one (a new identity for new work)")
	}
	mustPutOverride(t, c, "visitors", "crawler", `{"match":{"key":"`+identity+`"},"deny":true,"expires":"1h"}`)
	waitFor(t, 5*time.Second, "the deny override of the cookie's identity to refuse its browser with the zone's 429, no challenge", func() bool {
		res := c.Do(spentBrowser)
		_, _, _, page := pageChallenge(res.Body)
		return res.Status == http.StatusTooManyRequests && !page
	})
	// Issued: the page and the spent cookie's (and any while the override
	// was on its way).
	for outcome, want := range map[string]float64{"issued": 2, "solved": 1} {
		if got := challengeMetric(t, c, "challenges_total", map[string]string{"outcome": outcome}); got != want && (outcome == "solved" || got < want) {
			t.Errorf("caddy_rate_limit_challenges_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	if got := challengeMetric(t, c, "challenge_identities", map[string]string{}); got != 1 {
		t.Errorf("caddy_rate_limit_challenge_identities = %v, want 1", got)
	}
	if got := challengeMetric(t, c, "challenge_solve_seconds_count", map[string]string{}); got != 1 {
		t.Errorf("caddy_rate_limit_challenge_solve_seconds_count = %v, want 1", got)
	}
}

// Every way a submission or a cookie can be wrong is refused (403, or 400
// for what is not a form; never a 5xx) and counted by its reason; a bad
// cookie is a request without one.
func TestChallengeRefusalsCountedByReason(t *testing.T) {
	dir := t.TempDir()
	c := startCaddyWith(t, "metrics\n\tstorage file_system "+dir, challengeSite)
	spend(t, c, request{})
	token, d, action := challenged(t, c, "/", nil)
	nonce := solveChallenge(t, token, d)
	refused := func(what string, res response, status int, reason string) {
		t.Helper()
		if res.Status != status || !strings.Contains(res.Body, reason) {
			t.Errorf("%s: %d %q, want %d naming %s", what, res.Status, res.Body, status, reason)
		}
	}

	wrong := "0"
	for challenge.Solves(token, wrong, d) {
		wrong += "0"
	}
	refused("a wrong nonce", submitChallenge(t, c.client, c.URL, action, token, wrong, "/"), 403, "bad_nonce")
	refused("a nonce that is no number", submitChallenge(t, c.client, c.URL, action, token, "1e9", "/"), 403, "malformed")
	refused("a body over 4 KiB", postForm(t, c.client, c.URL+action, "challenge="+strings.Repeat("A", 1<<20)), 400, "malformed")
	refused("bad percent-encoding", postForm(t, c.client, c.URL+action, "challenge=%zz&nonce=1"), 400, "malformed")
	forged := []byte(token)
	forged[20] = map[bool]byte{true: 'B', false: 'A'}[forged[20] == 'A'] // in its random id
	refused("a forged challenge", submitChallenge(t, c.client, c.URL, action, string(forged), nonce, "/"), 403, "forged")
	refused("a challenge issued to another address", submitChallenge(t, clientFrom(t, "127.0.0.2"), c.URL, action, token, nonce, "/"), 403, "wrong_key")

	// An expired challenge, signed with the site's own secret from the
	// shared storage.
	secrets, err := challenge.LoadSecrets(context.Background(), &certmagic.FileStorage{Path: dir}, 0)
	if err != nil {
		t.Fatal(err)
	}
	old := secrets.Issue("visitors", "127.0.0.1", 1, time.Now().Add(-time.Hour), 5*time.Minute)
	refused("an expired challenge", submitChallenge(t, c.client, c.URL, action, old, solveChallenge(t, old, 1), "/"), 403, "expired")

	good := submitChallenge(t, c.client, c.URL, action, token, nonce, "https://elsewhere.example/")
	if good.Status != http.StatusSeeOther || good.Header.Get("Location") != "/" {
		t.Fatalf("a solved challenge returning to another site: %d Location %q, want 303 to /", good.Status, good.Header.Get("Location"))
	}
	refused("the same challenge again", submitChallenge(t, c.client, c.URL, action, token, nonce, "/"), 403, "replayed")

	ck := (&http.Response{Header: good.Header}).Cookies()[0]
	if res := c.Do(withCookie(ck)); res.Status != http.StatusOK {
		t.Fatalf("the solved cookie: %d, want 200", res.Status)
	}
	flipped := []byte(ck.Value)
	flipped[3] = map[bool]byte{true: 'B', false: 'A'}[flipped[3] == 'A']
	foreign, _ := challenge.NewSecrets([]byte("another site's secret, 32 bytes!")).Mint("visitors", time.Now().Add(time.Hour))
	for what, value := range map[string]string{"forged": string(flipped), "truncated": ck.Value[:len(ck.Value)-4], "another site's": foreign} {
		if res := c.Do(withCookie(&http.Cookie{Name: ck.Name, Value: value})); res.Status != http.StatusTooManyRequests {
			t.Errorf("a %s cookie: %d, want the address's 429 (a request without a cookie)", what, res.Status)
		}
	}

	// A flood of replays: each refused, none a server error.
	var wg sync.WaitGroup
	statuses := make(chan int, 400)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				res := submitChallenge(t, c.client, c.URL, action, token, nonce, "/")
				statuses <- res.Status
			}
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusForbidden {
			t.Fatalf("a flood of submissions of a used challenge: a %d, want every one 403", s)
		}
	}
	if res := c.Do(request{Path: action}); res.Status != http.StatusMethodNotAllowed {
		t.Errorf("GET %s: %d, want 405", action, res.Status)
	}

	for reason, want := range map[string]float64{"bad_nonce": 1, "malformed": 3, "forged": 1, "wrong_key": 1, "expired": 1, "forged_cookie": 3} {
		if got := challengeMetric(t, c, "challenge_failures_total", map[string]string{"reason": reason}); got != want {
			t.Errorf("caddy_rate_limit_challenge_failures_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	if got := challengeMetric(t, c, "challenge_failures_total", map[string]string{"reason": "replayed"}); got < 1 {
		t.Errorf("caddy_rate_limit_challenge_failures_total{reason=\"replayed\"} = %v, want at least 1", got)
	}
}

// Two instances sharing Caddy's storage and, in strict mode, Redis: a
// cookie solved on either is accepted on both, its budget counted once
// for the fleet, and a challenge solved on one cannot be used again on the
// other.
func TestChallengeCookieAcrossInstancesSharingStorage(t *testing.T) {
	rs := startRedis(t)
	// A 1s store timeout: a race-built Caddy on a small machine misses
	// the default now and then, which hands the decision to fail_policy
	// local (each instance's share) and the count would not be exact.
	site, storage := distributedSite(rs.Addr, challengeZone, "\t\t\ttimeout 1s"), "storage file_system "+t.TempDir()
	fleet := []*caddyInstance{startCaddyWith(t, storage, site), startCaddyWith(t, storage, site)}
	a, b := fleet[0], fleet[1]
	spend(t, a, request{})

	token, d, action := challenged(t, b, "/", nil)
	nonce := solveChallenge(t, token, d)
	if res := submitChallenge(t, a.client, a.URL, action, token, nonce, "/"); res.Status != http.StatusSeeOther {
		t.Fatalf("a challenge issued by one instance, solved on the other: %d %q, want 303", res.Status, res.Body)
	}
	if res := submitChallenge(t, b.client, b.URL, action, token, nonce, "/"); res.Status != http.StatusForbidden || !strings.Contains(res.Body, "replayed") {
		t.Fatalf("the same solution on the instance that issued it: %d %q, want 403 replayed", res.Status, res.Body)
	}
	ck := solvedCookie(t, a, a.client)
	counts := sendAcross(t, fleet, 601, 8, withCookie(ck), 5*time.Second)
	if counts[200] != 600 || counts[429] != 1 {
		t.Fatalf("601 requests with one cookie over two instances: %v, want exactly 600×200 1×429", counts)
	}
}

// With difficulty 1 2, the difficulty rises with the challenges issued to
// the same network, a digit per 16-fold, up to the upper bound; another
// network starts at the lower one. (Its fall back when calm is the
// challenge package's TestPressureRisesAndCalms.)
func TestChallengeDifficultyFollowsPressure(t *testing.T) {
	c := startCaddy(t, `http:// {
	rate_limit {
		zone visitors {
			key {client_ip}
			events 1
			window 1m
			challenge {
				difficulty 1 2
				events 5
				window 1h
			}
		}
	}
	respond "ok"
}
`)
	c.Do(request{})
	first := map[int]int{}
	for i := 1; i <= 40; i++ {
		_, d, _ := challenged(t, c, "/", nil)
		if _, seen := first[d]; !seen {
			first[d] = i
		}
	}
	// The count decays by half every 30s: the 16th comes a little later on
	// a slow machine, never sooner.
	if first[1] != 1 || first[2] < 16 || first[2] > 20 || len(first) != 2 {
		t.Fatalf("the first challenge of each difficulty: %v, want 1 at the 1st, 2 from about the 16th, never more", first)
	}
	other := clientFrom(t, "127.0.0.2")
	c.Do(request{Client: other})
	if _, d := pressureAt(t, c, other); d != 1 {
		t.Errorf("another address's first challenge: difficulty %d, want 1", d)
	}
}

func pressureAt(t *testing.T, c *caddyInstance, client *http.Client) (string, int) {
	t.Helper()
	token, d, _ := challenged(t, c, "/", client)
	return token, d
}

// On HTTPS the cookie is Secure as well.
func TestChallengeCookieSecureOnHTTPS(t *testing.T) {
	e := newEdge(t).start("", `	rate_limit {
		zone visitors {
			key {client_ip}
			events 1
			window 1h
			challenge {
				difficulty 1
				events 5
				window 1h
			}
		}
	}
	respond "ok"`)
	tr := &http.Transport{TLSClientConfig: e.clientConf}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	base := "https://" + e.tlsAddr
	get := func() (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
		req.Header.Set("Accept", browserAccept["Accept"])
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, res.Body)
		return res.StatusCode, b.String()
	}
	get()
	status, body := get()
	token, d, action, ok := pageChallenge(body)
	if status != http.StatusTooManyRequests || !ok {
		t.Fatalf("a browser's GET past the limit on HTTPS: %d, want 429 with the challenge page", status)
	}
	res := submitChallenge(t, client, base, action, token, solveChallenge(t, token, d), "/")
	if set := strings.Join(res.Header["Set-Cookie"], "\n"); res.Status != http.StatusSeeOther || !strings.Contains(set, "; Secure") || !strings.Contains(set, "HttpOnly") {
		t.Fatalf("a solved challenge on HTTPS: %d Set-Cookie %q, want 303 and a Secure, HttpOnly cookie", res.Status, set)
	}
}

// Without Redis, two instances sharing Caddy's storage share the secret
// (created once, whichever starts first): a cookie solved on one is a
// cookie on the other, whose budget there is the other's own.
func TestChallengeCookieAcrossLocalInstancesSharingStorage(t *testing.T) {
	storage := "storage file_system " + t.TempDir()
	a, b := startCaddyWith(t, storage, challengeSite), startCaddyWith(t, storage, challengeSite)
	spend(t, a, request{})
	ck := solvedCookie(t, a, a.client)
	if res := b.Do(withCookie(ck)); res.Status != http.StatusOK || !strings.HasPrefix(res.Body, "id=cookie:") {
		t.Fatalf("a cookie solved on the other instance: %d %q, want 200 under the cookie's identity", res.Status, res.Body)
	}
}

// keyIDs are the ids of the secrets in storage dir, newest first.
func keyIDs(t *testing.T, st *certmagic.FileStorage) []string {
	t.Helper()
	raw, err := st.Load(context.Background(), challenge.StorageKey)
	var keys []struct{ ID []byte }
	if err == nil {
		err = json.Unmarshal(raw, &keys)
	}
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = string(k.ID)
	}
	return ids
}

// signedBy is the id of the secret that signed a challenge token or a
// cookie value (docs/challenges-protocol.md: after the token's version,
// expiry, difficulty, id and key fingerprint; after the cookie's version,
// expiry and identity).
func signedBy(t *testing.T, value string, token bool) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(value)
	at := 1 + 8 + 16
	if token {
		at = 1 + 8 + 1 + 12 + 8
	}
	if err != nil || len(b) < at+4 {
		t.Fatalf("%q is no token or cookie", value)
	}
	return string(b[at : at+4])
}

// A Caddy that runs past the secret's rotation period replaces it at its
// next signing, with no reload: a failed rotation (the storage's locks
// broken) keeps the current key signing and warns once, the next try
// rotates, the replaced key's cookies still verify, and the other instance
// takes the new key rather than make another.
func TestChallengeSecretRotatesWhileCaddyRuns(t *testing.T) {
	dir := t.TempDir()
	st := &certmagic.FileStorage{Path: dir}
	secrets, err := challenge.LoadSecrets(context.Background(), st, 0)
	if err != nil {
		t.Fatal(err)
	}
	old, oldID := secrets.Mint("visitors", time.Now().Add(time.Hour))
	first := keyIDs(t, st)[0]
	// Age the key to 10s short of the period, then start the fleet.
	due := time.Now().Add(10 * time.Second)
	raw, _ := st.Load(context.Background(), challenge.StorageKey)
	var keys []map[string]any
	_ = json.Unmarshal(raw, &keys)
	keys[0]["created"] = due.Add(-challenge.MinRotation)
	raw, _ = json.Marshal(keys)
	_ = st.Store(context.Background(), challenge.StorageKey, raw)
	storage := "storage file_system " + dir
	a, b := startCaddyWith(t, storage, challengeSite), startCaddyWith(t, storage, challengeSite)
	if time.Now().After(due) {
		t.Fatal("the instances took over 10s to start: they rotated at their load")
	}
	time.Sleep(time.Until(due))
	// page is c's next challenge page, past the zone's limit (which
	// refills while the test waits).
	page := func(c *caddyInstance) string {
		t.Helper()
		for range 40 {
			res := c.Do(request{Header: browserAccept})
			if token, _, _, ok := pageChallenge(res.Body); ok {
				return token
			}
		}
		t.Fatal("40 browser GETs and no challenge page")
		return ""
	}

	locks := filepath.Join(dir, "locks")
	if err := os.RemoveAll(locks); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(locks, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	const failed = "rotating the challenge secret failed"
	tried := time.Now()
	for i := 0; !strings.Contains(a.stderr.String(), failed); i++ {
		if signedBy(t, page(a), true) != first {
			t.Fatal("a token signed by another key while the rotation fails")
		}
		if i == 50 {
			t.Fatalf("a signing past the period with the storage's locks broken logged no warning %q", failed)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.Remove(locks); err != nil {
		t.Fatal(err)
	}

	// Tried again 10s after the failure, at a signing.
	time.Sleep(time.Until(tried.Add(10 * time.Second)))
	for i := 0; len(keyIDs(t, st)) != 2; i++ {
		page(a)
		if i == 50 {
			t.Fatal("no rotation 10s after the failed one")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ids := keyIDs(t, st)
	if ids[1] != first {
		t.Fatalf("after the rotation the storage keeps %x, want the new key and the replaced one", ids)
	}
	ck := solvedCookie(t, a, a.client)
	if signedBy(t, ck.Value, false) != ids[0] {
		t.Fatal("a cookie solved after the rotation is not signed by the new key")
	}
	if res := a.Do(withCookie(&http.Cookie{Name: "tally_visitors", Value: old})); res.Status != http.StatusOK || res.Body != "id="+oldID {
		t.Errorf("a cookie of the replaced key: %d %q, want 200 under its identity", res.Status, res.Body)
	}
	if res := b.Do(withCookie(ck)); res.Status != http.StatusOK || !strings.HasPrefix(res.Body, "id=cookie:") {
		t.Errorf("a cookie of the new key on the other instance: %d %q, want 200 under the cookie's identity", res.Status, res.Body)
	}

	// The other instance, past the period too, takes the new key.
	for i := 0; ; i++ {
		if signedBy(t, page(b), true) == ids[0] {
			break
		}
		if i == 50 {
			t.Fatal("the other instance never signed with the new key")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := keyIDs(t, st); len(got) != 2 || got[0] != ids[0] || got[1] != first {
		t.Errorf("after both instances rotated: keys %x, want %x (one new key)", got, ids)
	}
	var warned []string
	for _, line := range strings.Split(a.stderr.String(), "\n") {
		if strings.Contains(line, failed) {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], `"level":"warn"`) || !strings.Contains(warned[0], `"logger":"http.handlers.rate_limit"`) {
		t.Errorf("the failed rotation logged %q, want one warning of the handler's logger", warned)
	}
	if strings.Contains(b.stderr.String(), failed) {
		t.Error("the other instance's rotation warned")
	}
}
