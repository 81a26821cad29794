package tests

// The admin API admin.api.rate_limit, under /rate_limit/ on Caddy's admin
// address.

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// adminZone is a zone as GET /rate_limit/zones lists it.
type adminZone struct {
	Name       string `json:"name"`
	Events     int64  `json:"events"`
	Window     string `json:"window"`
	Burst      int64  `json:"burst"`
	Mode       string `json:"mode"`
	FailPolicy string `json:"fail_policy"`
	DryRun     bool   `json:"dry_run"`
	LocalKeys  int    `json:"local_keys"`
	Store      *struct {
		OK        bool `json:"ok"`
		Instances int  `json:"instances"`
	} `json:"store"`
}

// adminKey is a key as GET /rate_limit/zones/<zone>/keys/<key> shows it.
type adminKey struct {
	Zone       string  `json:"zone"`
	Key        string  `json:"key"`
	Remaining  int64   `json:"remaining"`
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
	Events     int64   `json:"events"`
	Window     string  `json:"window"`
	Burst      int64   `json:"burst"`
}

const adminSite = `http:// {
	rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 3
			window 1h
		}
		zone login {
			match {
				path /login
			}
			key {client_ip}
			events 5
			window 1m
			burst 2
			fail_policy closed
			dry_run
		}
	}
	respond "ok"
}
`

func keyPath(zone, key string) string {
	return "/rate_limit/zones/" + url.PathEscape(zone) + "/keys/" + url.PathEscape(key)
}

func TestAdminListsZonesWithTheirLimits(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	var zones []adminZone
	c.adminJSON("/rate_limit/zones", &zones)
	if len(zones) != 2 {
		t.Fatalf("GET /rate_limit/zones: %+v, want zones api and login", zones)
	}
	api, login := zones[0], zones[1]
	if api.Name != "api" || api.Events != 3 || api.Window != "1h0m0s" || api.Burst != 3 ||
		api.Mode != "local" || api.FailPolicy != "local" || api.DryRun || api.Store != nil {
		t.Errorf("zone api listed as %+v", api)
	}
	if login.Name != "login" || login.Events != 5 || login.Window != "1m0s" || login.Burst != 2 ||
		login.Mode != "local" || login.FailPolicy != "closed" || !login.DryRun {
		t.Errorf("zone login listed as %+v", login)
	}

	c.Send(2, withKey("alice"))
	c.adminJSON("/rate_limit/zones", &zones)
	if zones[0].LocalKeys != 1 {
		t.Errorf("after one key was used, zone api has local_keys %d, want 1", zones[0].LocalKeys)
	}
}

func TestAdminShowsAUsedKey(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	// A key with a space and a slash, path-escaped in the URL.
	key := "team a/1"
	c.Send(2, withKey(key))

	var k adminKey
	c.adminJSON(keyPath("api", key), &k)
	// 2 of 3 used, at one per 20 minutes: one left, full again in 40m.
	if k.Zone != "api" || k.Key != key || k.Remaining != 1 || k.RetryAfter != 0 ||
		k.ResetAfter < 2390 || k.ResetAfter > 2400 {
		t.Fatalf("GET %s: %+v, want remaining 1, retry_after 0, reset_after about 2400", keyPath("api", key), k)
	}

	c.Send(2, withKey(key)) // the third is allowed, the fourth denied
	c.adminJSON(keyPath("api", key), &k)
	if k.Remaining != 0 || k.RetryAfter < 1190 || k.RetryAfter > 1200 || k.ResetAfter < 3590 || k.ResetAfter > 3600 {
		t.Fatalf("exhausted key: %+v, want remaining 0, retry_after about 1200, reset_after about 3600", k)
	}
}

func TestAdminAnswersUnknownZoneAndUnusedKeyWith404(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	for _, path := range []string{keyPath("nope", "alice"), keyPath("api", "never-seen"), "/rate_limit/nothing"} {
		for _, method := range []string{http.MethodGet, http.MethodDelete} {
			status, body := c.adminDo(method, path)
			var e struct {
				Error string `json:"error"`
			}
			if status != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s: %d %s, want 404 with a JSON error", method, path, status, body)
			}
		}
	}
}

func TestAdminDeleteResetsABlockedKey(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	if got := c.Send(4, withKey("alice")); got[3] != 429 {
		t.Fatalf("alice: %v, want the fourth denied", got)
	}
	c.Send(1, withKey("bob"))

	status, body := c.adminDo(http.MethodDelete, keyPath("api", "alice"))
	if status != http.StatusNoContent {
		t.Fatalf("DELETE %s: %d %s, want 204", keyPath("api", "alice"), status, body)
	}
	if got := c.Send(4, withKey("alice")); len(got) != 4 || got[0] != 200 || got[2] != 200 || got[3] != 429 {
		t.Fatalf("alice after DELETE: %v, want a full limit again: 3×200 then 429", got)
	}
	// Other keys keep their state.
	if got := c.Send(3, withKey("bob")); got[2] != 429 {
		t.Fatalf("bob after alice's reset: %v, want 2 more allowed, then 429", got)
	}
}

func TestAdminRejectsOtherMethods(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, adminSite)
	c.Send(1, withKey("alice"))
	cases := []struct{ method, path, allow string }{
		{http.MethodPost, keyPath("api", "alice"), "GET, DELETE"},
		{http.MethodPut, keyPath("api", "alice"), "GET, DELETE"},
		{http.MethodDelete, "/rate_limit/zones", "GET"},
		{http.MethodPost, "/rate_limit/zones", "GET"},
	}
	for _, tc := range cases {
		req, err := http.NewRequest(tc.method, c.AdminURL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.EqualFold(resp.Header.Get("Allow"), tc.allow) {
			t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
		}
	}
	// A refused method changed nothing.
	var k adminKey
	c.adminJSON(keyPath("api", "alice"), &k)
	if k.Remaining != 2 {
		t.Errorf("alice after refused requests: remaining %d, want 2", k.Remaining)
	}
}
