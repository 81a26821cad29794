package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The challenge protocol as a client without a browser speaks it
// (docs/challenges-protocol.md): the page's meta element, a native
// solver, the form POST to the verify URL.

var challengeMeta = regexp.MustCompile(`<meta name="tally-challenge" content="([^"]*)" data-difficulty="(\d+)" data-action="([^"]*)">`)

// pageChallenge is the challenge a page carries: its token, difficulty and
// verify URL; ok false when the body is no challenge page.
func pageChallenge(body string) (token string, difficulty int, action string, ok bool) {
	m := challengeMeta.FindStringSubmatch(body)
	if m == nil {
		return "", 0, "", false
	}
	d, _ := strconv.Atoi(m[2])
	return html.UnescapeString(m[1]), d, html.UnescapeString(m[3]), true
}

// solveChallenge is a native solver: the smallest decimal nonce whose
// hex(SHA-256(token + nonce)) starts with difficulty zeros. It gives up
// (fails the test) after a bound far above the expected 16^difficulty.
func solveChallenge(t testing.TB, token string, difficulty int) string {
	t.Helper()
	zeros := strings.Repeat("0", difficulty)
	limit := uint64(1) << (4*difficulty + 6) // 64 times the mean
	for n := uint64(0); n < limit; n++ {
		nonce := strconv.FormatUint(n, 10)
		sum := sha256.Sum256([]byte(token + nonce))
		if strings.HasPrefix(hex.EncodeToString(sum[:]), zeros) {
			return nonce
		}
	}
	t.Fatalf("no nonce below %d solves the challenge at difficulty %d", limit, difficulty)
	return ""
}

// noRedirects is a client that returns redirects instead of following them.
func noRedirects(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
}

// submitChallenge POSTs a solution to baseURL's verify URL action, with
// client (its redirects not followed), and returns the response, its body
// read.
func submitChallenge(t testing.TB, client *http.Client, baseURL, action, token, nonce, ret string) response {
	t.Helper()
	form := url.Values{"challenge": {token}, "nonce": {nonce}, "elapsed_ms": {"120"}, "return": {ret}}
	return postForm(t, client, baseURL+action, form.Encode())
}

// postForm POSTs a form-urlencoded body, redirects not followed.
func postForm(t testing.TB, client *http.Client, u, body string) response {
	t.Helper()
	res, err := noRedirects(client).Post(u, "application/x-www-form-urlencoded", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer res.Body.Close()
	var b strings.Builder
	_, _ = io.Copy(&b, res.Body)
	return response{Status: res.StatusCode, Header: res.Header, Body: b.String()}
}
