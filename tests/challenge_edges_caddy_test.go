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

// A site with two rate_limit handlers, each with a challenge zone: the
// first answers the verify URL for its own zones and passes a solution of
// the other's on to it, which sets the other zone's cookie.
func TestChallengeOfALaterHandlersZoneIsSolved(t *testing.T) {
	c := startCaddy(t, `http:// {
	route {
		rate_limit {
			zone site {
				key {client_ip}
				events 100
				window 1m
				challenge {
					difficulty 1
					events 500
					window 1h
				}
			}
		}
		rate_limit {
			zone blog {
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
		respond "id={http.rate_limit.blog.identity}"
	}
}
`)
	c.Do(request{})
	token, d, action := challenged(t, c, "/", nil)
	res := submitChallenge(t, c.client, c.URL, action, token, solveChallenge(t, token, d), "/")
	if res.Status != http.StatusSeeOther || !strings.Contains(strings.Join(res.Header["Set-Cookie"], "\n"), "tally_blog=") {
		t.Fatalf("a solved challenge of the second handler's zone: %d %q Set-Cookie %q, want 303 setting tally_blog", res.Status, res.Body, res.Header["Set-Cookie"])
	}
	ck := (&http.Response{Header: res.Header}).Cookies()[0]
	if got := c.Do(withCookie(ck)); got.Status != http.StatusOK || !strings.HasPrefix(got.Body, "id=cookie:") {
		t.Fatalf("the blog zone's cookie: %d %q, want 200 under its identity", got.Status, got.Body)
	}
}

// The submission's key must be the page's: a zone keyed by what the
// request asks for (its path, query or method), which the submission to
// the verify URL does not share, is refused at its load, naming the fix,
// rather than loaded with a challenge every solution fails as wrong_key.
func TestChallengeZoneKeyedByTheRequestIsRefused(t *testing.T) {
	for _, key := range []string{"{client_ip}{path}", "{client_ip}-{method}", "{http.request.uri}"} {
		c := newCaddyInstance(t)
		err := c.startProcess(c.Caddyfile("", `http:// {
	rate_limit {
		zone v {
			key `+key+`
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
		if err == nil || !strings.Contains(c.stderr.String(), "key of the client") {
			t.Errorf("a challenge zone keyed %q: started (%v), want a load error asking for a key of the client; stderr %q", key, err, tail(c.stderr.String(), 3))
		}
	}
}
