package tests

import (
	"net/http"
	"strings"
	"testing"
)

// A zone's name is in every challenge token it issues: a zone with a
// challenge whose name is longer than a token can carry is refused at its
// load, naming the bound, rather than loaded with a challenge no solution
// can pass.
func TestChallengeZoneNameTooLongForItsTokensIsRefused(t *testing.T) {
	long := strings.Repeat("z", 200)
	c := newCaddyInstance(t)
	err := c.startProcess(c.Caddyfile("", `http:// {
	rate_limit {
		zone `+long+` {
			key {client_ip}
			events 1
			window 1m
			challenge {
				difficulty 1
				events 5
				window 1h
			}
		}
	}
	respond "ok"
}
`), "caddyfile")
	if err == nil || !strings.Contains(c.stderr.String(), "128") {
		t.Fatalf("a challenge zone named with 200 characters: started (%v), want a load error naming the 128-character bound; stderr %q", err, tail(c.stderr.String(), 5))
	}
}

// A submission that is not a form (JSON, no Content-Type, multipart) is the
// protocol's 400 malformed, as one that does not parse is.
func TestChallengeSubmissionThatIsNoFormIs400(t *testing.T) {
	c := startCaddy(t, challengeSite)
	for _, ct := range []string{"application/json", "", "multipart/form-data; boundary=x", "text/plain"} {
		req, _ := http.NewRequest(http.MethodPost, c.URL+"/.well-known/tally/challenge", strings.NewReader(`{"challenge":"x","nonce":"1"}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		res, err := noRedirects(c.client).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("a submission of Content-Type %q: %d, want 400 malformed (not a form)", ct, res.StatusCode)
		}
	}
}

// A browser that sends the zone's cookie twice (a stale or a parent
// domain's one first) with one valid is decided under the valid one's
// identity, not challenged again for ever.
func TestChallengeValidCookieCountsBesideAnotherOfTheSameName(t *testing.T) {
	c := startCaddy(t, challengeSite)
	spend(t, c, request{})
	ck := solvedCookie(t, c, c.client)
	for _, header := range []string{
		ck.Name + "=junk; " + ck.Name + "=" + ck.Value,
		ck.Name + "=" + ck.Value + "; " + ck.Name + "=junk",
	} {
		res := c.Do(request{Header: map[string]string{"Cookie": header}})
		if res.Status != http.StatusOK || !strings.HasPrefix(res.Body, "id=cookie:") {
			t.Errorf("Cookie: %s: %d %q, want 200 under the valid cookie's identity", header, res.Status, res.Body)
		}
	}
}
