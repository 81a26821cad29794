package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// putOverride PUTs body as zone's override id and returns the status and
// answer.
func putOverride(t testing.TB, c *caddyInstance, zone, id, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, c.AdminURL+"/rate_limit/zones/"+zone+"/overrides/"+id, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return c.admin(req)
}

func mustPutOverride(t testing.TB, c *caddyInstance, zone, id, body string) {
	t.Helper()
	if status, answer := putOverride(t, c, zone, id, body); status/100 != 2 {
		t.Fatalf("PUT override %s: %d %s", id, status, answer)
	}
}

type overrideList struct {
	Zone      string `json:"zone"`
	View      string `json:"view"`
	Overrides []struct {
		ID    string `json:"id"`
		Match struct {
			Key    string `json:"key"`
			Prefix string `json:"prefix"`
			CIDR   string `json:"cidr"`
		} `json:"match"`
		Events  int64  `json:"events"`
		Window  string `json:"window"`
		Exempt  bool   `json:"exempt"`
		Deny    bool   `json:"deny"`
		Expires string `json:"expires"`
		Reason  string `json:"reason"`
		SetBy   string `json:"set_by"`
		SetAt   string `json:"set_at"`
	} `json:"overrides"`
}

func listOverrides(t testing.TB, c *caddyInstance, zone string) overrideList {
	t.Helper()
	var l overrideList
	c.adminJSON("/rate_limit/zones/"+zone+"/overrides", &l)
	return l
}

// admitted sends up to n requests with r and counts the allowed ones
// before the first denial.
func admitted(c *caddyInstance, r request, n int) int {
	for i := range n {
		if c.Do(r).Status != http.StatusOK {
			return i
		}
	}
	return n
}

const overrideLocalSite = `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}
		headers %s
	}
	respond "ok"
}
`

// A local zone's override is enforced at once, shown by the admin API and
// the headers, survives a reload that changes an unrelated setting and a
// `caddy stop` then start, and its removal puts the zone's limit back.
func TestOverrideLocalZoneSurvivesReloadAndRestart(t *testing.T) {
	c := newCaddyInstance(t)
	c.Start(c.Caddyfile("metrics", fmt.Sprintf(overrideLocalSite, "both")), "caddyfile")
	if n := admitted(c, withKey("vip"), 10); n != 3 {
		t.Fatalf("before the override: %d admitted, want 3", n)
	}
	mustPutOverride(t, c, "api", "vip", `{"match":{"key":"vip"},"events":20,"window":"1m","reason":"pays more"}`)
	mustPutOverride(t, c, "api", "partners", `{"match":{"prefix":"partner-"},"exempt":true}`)
	mustPutOverride(t, c, "api", "abuser", `{"match":{"key":"bad"},"deny":true,"expires":"1h"}`)

	// vip spent 3 of 3: 0 of 20 at once, and (20/min) one more per 3s.
	r := c.Do(withKey("vip"))
	if r.Status != http.StatusTooManyRequests || !strings.Contains(r.Header.Get("RateLimit-Policy"), "q=20") {
		t.Fatalf("vip after its raise: %d, policy %q; want 429 (its debt carried) under q=20", r.Status, r.Header.Get("RateLimit-Policy"))
	}
	if n := admitted(c, withKey("partner-1"), 50); n != 50 {
		t.Errorf("an exempt partner: %d of 50 admitted", n)
	}
	r = c.Do(withKey("bad"))
	if ra := r.Header.Get("Retry-After"); r.Status != http.StatusTooManyRequests || ra < "3500" || len(ra) != 4 {
		t.Errorf("denied key: %d, Retry-After %q; want 429 until its override expires (~3600)", r.Status, ra)
	}
	var k struct {
		Events   int64 `json:"events"`
		Override *struct {
			ID string `json:"id"`
		} `json:"override"`
	}
	c.adminJSON("/rate_limit/zones/api/keys/vip", &k)
	if k.Events != 20 || k.Override == nil || k.Override.ID != "vip" {
		t.Errorf("GET key vip: events %d, override %+v; want 20 and the override vip", k.Events, k.Override)
	}
	l := listOverrides(t, c, "api")
	if len(l.Overrides) != 3 || l.View != "instance" || l.Overrides[2].ID != "vip" || l.Overrides[2].Reason != "pays more" ||
		!strings.HasPrefix(l.Overrides[2].SetBy, "127.0.0.1:") || l.Overrides[2].SetAt == "" {
		t.Fatalf("list: %+v", l)
	}
	if v, ok := metricValue(c.scrape(), "caddy_rate_limit_overrides", map[string]string{"zone": "api"}); !ok || v != 3 {
		t.Errorf("caddy_rate_limit_overrides{zone=api} = %v (%v), want 3", v, ok)
	}
	if !strings.Contains(c.Output(), "rate limit override set") {
		t.Error("no INFO line for the change")
	}

	// A reload changing an unrelated setting keeps the overrides.
	load(t, c, "metrics", fmt.Sprintf(overrideLocalSite, "ietf"))
	if n := len(listOverrides(t, c, "api").Overrides); n != 3 {
		t.Fatalf("after a reload: %d overrides, want 3", n)
	}
	if n := admitted(c, withKey("partner-2"), 20); n != 20 {
		t.Errorf("after a reload an exempt partner: %d of 20 admitted", n)
	}
	// And so does a stop and start.
	c.stopWith("stop", syscall.SIGTERM)
	c.Start(c.Caddyfile("metrics", fmt.Sprintf(overrideLocalSite, "ietf")), "caddyfile")
	l = listOverrides(t, c, "api")
	if len(l.Overrides) != 3 {
		t.Fatalf("after a restart: %+v, want the 3 overrides", l)
	}
	if n := admitted(c, withKey("fresh-vip"), 30); n != 3 {
		t.Fatalf("an unrelated key: %d admitted, want the zone's 3", n)
	}
	if n := admitted(c, withKey("partner-3"), 20); n != 20 {
		t.Errorf("after a restart an exempt partner: %d of 20 admitted", n)
	}
	if c.Do(withKey("bad")).Status != http.StatusTooManyRequests {
		t.Error("after a restart the denied key is admitted")
	}
	if status, _ := c.adminDo(http.MethodDelete, "/rate_limit/zones/api/overrides/abuser"); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d", status)
	}
	if c.Do(withKey("bad")).Status != http.StatusOK {
		t.Error("after its override went the key is still denied")
	}
	if status, _ := c.adminDo(http.MethodDelete, "/rate_limit/zones/api/overrides/abuser"); status != http.StatusNotFound {
		t.Errorf("DELETE of a removed override: %d, want 404", status)
	}
}

// Hostile or malformed bodies are each a clear 4xx that names the field,
// and change nothing.
func TestOverrideHostileBodiesChangeNothing(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(overrideLocalSite, "both"))
	mustPutOverride(t, c, "api", "keep", `{"match":{"key":"k"},"events":5,"window":"1m"}`)
	for _, tc := range []struct {
		name, id, body, want string
	}{
		{"huge", "a", `{"match":{"key":"` + strings.Repeat("x", 20_000) + `"},"exempt":true}`, "body"},
		{"binary", "a", "\x00\x01\xff\xfe", "body"},
		// Go's mux cleans the path: the PUT reaches no override.
		{"traversal id", "..", `{"match":{"key":"k"},"exempt":true}`, "unknown path"},
		{"escaped traversal id", "..%2Fx", `{"match":{"key":"k"},"exempt":true}`, "id"},
		{"negative events", "a", `{"match":{"key":"k"},"events":-5,"window":"1m"}`, "events"},
		{"bad window", "a", `{"match":{"key":"k"},"events":5,"window":"soon"}`, "window"},
		{"control key", "a", `{"match":{"key":"a\u0007b"},"exempt":true}`, "match.key"},
		{"two matches", "a", `{"match":{"key":"k","prefix":"p"},"exempt":true}`, "match"},
		{"bad cidr", "a", `{"match":{"cidr":"10.0.0.0/99"},"exempt":true}`, "match.cidr"},
		{"exempt and deny", "a", `{"match":{"key":"k"},"exempt":true,"deny":true}`, "exempt"},
		{"past expiry", "a", `{"match":{"key":"k"},"deny":true,"expires":"2001-01-01T00:00:00Z"}`, "expires"},
		{"unknown field", "a", `{"match":{"key":"k"},"exempt":true,"admin":true}`, "body"},
		{"quota field on a rate zone", "a", `{"match":{"key":"k"},"limit":5}`, "events"},
	} {
		status, answer := putOverride(t, c, "api", tc.id, tc.body)
		if status < 400 || status > 499 || !strings.Contains(answer, tc.want) {
			t.Errorf("%s: %d %s; want a 4xx naming %s", tc.name, status, answer, tc.want)
		}
	}
	l := listOverrides(t, c, "api")
	if len(l.Overrides) != 1 || l.Overrides[0].ID != "keep" {
		t.Errorf("after the bad bodies: %+v, want only keep", l.Overrides)
	}
}

// A zone holds at most 10,000 overrides: the 10,001st is refused, and
// replacing one still works.
func TestOverrideBound(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf(overrideLocalSite, "both"))
	deadline := time.Now().Add(3 * time.Minute)
	for i := range 10_000 {
		mustPutOverride(t, c, "api", fmt.Sprint("o", i), fmt.Sprintf(`{"match":{"prefix":"t%05d-"},"exempt":true}`, i))
		if time.Now().After(deadline) {
			t.Fatalf("only %d overrides put in 3 minutes", i)
		}
	}
	status, answer := putOverride(t, c, "api", "one-more", `{"match":{"key":"k"},"exempt":true}`)
	if status != http.StatusConflict || !strings.Contains(answer, "10000") {
		t.Fatalf("the 10,001st: %d %s; want 409 saying the bound", status, answer)
	}
	mustPutOverride(t, c, "api", "o0", `{"match":{"key":"k"},"deny":true}`)
	if c.Do(withKey("k")).Status != http.StatusTooManyRequests || c.Do(withKey("t00042-x")).Status != http.StatusOK {
		t.Error("the full set is not enforced")
	}
	var l overrideList
	c.adminJSON("/rate_limit/zones/api/overrides", &l)
	if len(l.Overrides) != 10_000 {
		t.Errorf("%d overrides listed, want 10000", len(l.Overrides))
	}
	_ = json.Valid
}
