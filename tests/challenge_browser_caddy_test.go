package tests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/caddy-tally/ratelimit/challenge"
)

// A real browser against the challenge: Debian's chromium (make deps
// installs it), headless, driven through the DevTools protocol (chromedp).
// It reaches Caddy only on loopback; the name tally.test is mapped to
// 127.0.0.1 inside the browser so that one page is not a secure context.

// browserSite is a site behind a zone of one request per hour per client
// address, with a challenge of difficulty d whose cookie allows 3 requests
// per hour; each page says its URI and the identity it was admitted under.
// The favicon chromium fetches after each page is outside the zone, so
// that the cookie's budget counts the pages alone. Every response carries
// the strict Content-Security-Policy of docs/challenges.md, under which the
// page's script must run.
func browserSite(tb testing.TB, d int) string {
	return fmt.Sprintf(`http:// {
	header Content-Security-Policy %q
	handle /favicon.ico {
		respond 204
	}
	handle {
		rate_limit {
			zone visitors {
				key {client_ip}
				events 1
				window 1h
				challenge {
					difficulty %d
					valid 1h
					events 3
					window 1h
				}
			}
		}
		respond "page={http.request.uri} id={http.rate_limit.visitors.identity}"
	}
}
`, docsCSP(tb), d)
}

// docsCSP is the Content-Security-Policy of docs/challenges.md's site,
// which must allow the challenge page's script by its hash.
func docsCSP(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile("../docs/challenges.md")
	if err != nil {
		tb.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*header Content-Security-Policy "([^"]+)"$`).FindSubmatch(b)
	if m == nil {
		tb.Fatal("docs/challenges.md's site has no header Content-Security-Policy line")
	}
	if !strings.Contains(string(m[1]), "script-src 'self' "+challenge.ScriptHash+";") {
		tb.Fatalf("docs/challenges.md's Content-Security-Policy %s does not allow the challenge page's script, %s", m[1], challenge.ScriptHash)
	}
	return string(m[1])
}

// browser is one headless chromium with one tab, and the status of every
// document (page) response the tab received, by URL, in order.
type browser struct {
	ctx  context.Context // the tab's; bounded by the browser's whole life
	mu   sync.Mutex
	docs []docResponse
}

type docResponse struct {
	url    string
	status int64
}

// startBrowser starts chromium, whose whole life (and so every wait on it)
// is bounded by life; it is closed with the test.
func startBrowser(tb testing.TB, life time.Duration) *browser {
	tb.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		tb.Fatalf("no chromium on PATH (make deps installs Debian's): %v", err)
	}
	parent, cancelLife := context.WithTimeout(context.Background(), life)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root, where chromium's sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.Flag("host-resolver-rules", "MAP tally.test 127.0.0.1"),
		chromedp.Flag("disable-features", "HttpsUpgrades,HttpsFirstBalancedModeAutoEnable"),
		chromedp.Flag("no-proxy-server", true),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	tab, cancelTab := chromedp.NewContext(alloc)
	b := &browser{ctx: tab}
	tb.Cleanup(func() { cancelTab(); cancelAlloc(); cancelLife() })
	err = chromedp.Listen(tab, func(ev any) { // starts the browser
		if e, ok := ev.(*network.EventResponseReceived); ok && e.Type == network.ResourceTypeDocument {
			b.mu.Lock()
			b.docs = append(b.docs, docResponse{e.Response.URL, e.Response.Status})
			b.mu.Unlock()
		}
	})
	if err != nil {
		tb.Fatalf("starting chromium: %v", err)
	}
	return b
}

// statuses are the statuses of the document responses for url since the
// first n recorded.
func (b *browser) statuses(url string, n int) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int64
	for _, d := range b.docs[n:] {
		if d.url == url {
			out = append(out, d.status)
		}
	}
	return out
}

func (b *browser) recorded() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.docs)
}

// open navigates to url and waits, at most limit, until the page's text
// starts with want (the challenge, if any, solved by the page itself on
// the way); it returns the text and how long it took.
func (b *browser) open(tb testing.TB, url, want string, limit time.Duration) (string, time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, limit)
	defer cancel()
	start := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		tb.Fatalf("navigating to %s: %v", url, err)
	}
	var text string
	for {
		// Fails while the page is replaced (the form's POST, the
		// redirect): the next poll reads the new one.
		text, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		if strings.HasPrefix(text, want) {
			return text, time.Since(start)
		}
		select {
		case <-ctx.Done():
			at, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href`))
			tb.Fatalf("waited %v for %s to show %q; the browser is at %s, showing %q", limit, url, want, at, text)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cookie is the browser's cookie name, HttpOnly ones included.
func (b *browser) cookie(tb testing.TB, name string) *network.Cookie {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		tb.Fatalf("reading the browser's cookies: %v", err)
	}
	for _, c := range res.Cookies {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// clearCookies forgets every cookie: the browser is a new visitor.
func (b *browser) clearCookies(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if _, err := chromedp.Call(ctx, network.ClearBrowserCookies, struct{}{}); err != nil {
		tb.Fatalf("clearing the browser's cookies: %v", err)
	}
}

var pageIdentity = regexp.MustCompile(`id=(cookie:[A-Za-z0-9_-]+)`)

// TestChallengeBrowserSolvesAndLandsWithItsOwnBudget: chromium opens a page
// (with a query string) behind a spent zone, gets the challenge page (429),
// solves it with crypto.subtle (127.0.0.1 is a secure context) and lands
// on the page it asked for with an HttpOnly, SameSite=Lax cookie; the
// cookie's identity admits its next requests under the block's 3 per hour,
// and past them the browser is challenged again and earns a new identity.
func TestChallengeBrowserSolvesAndLandsWithItsOwnBudget(t *testing.T) {
	c := startCaddy(t, browserSite(t, 4))
	if res := c.Do(request{Path: "/"}); res.Status != http.StatusOK {
		t.Fatalf("the zone's one request per hour: %d, want 200", res.Status)
	}
	b := startBrowser(t, 3*time.Minute)

	url := c.URL + "/article?id=7&lang=en"
	n := b.recorded()
	text, took := b.open(t, url, "page=/article?id=7&lang=en id=cookie:", time.Minute)
	t.Logf("chromium solved difficulty 4 (crypto.subtle) and landed in %v", took.Round(time.Millisecond))
	if got := b.statuses(url, n); len(got) != 2 || got[0] != http.StatusTooManyRequests || got[1] != http.StatusOK {
		t.Fatalf("the page's responses: %v, want [429 200]: the challenge page, then the page after solving", got)
	}
	first := pageIdentity.FindStringSubmatch(text)[1]
	ck := b.cookie(t, "tally_visitors")
	if ck == nil || !ck.HTTPOnly || ck.SameSite != network.CookieSameSiteLax || ck.Path != "/" {
		t.Fatalf("the solved challenge's cookie: %+v, want tally_visitors, HttpOnly, SameSite=Lax, Path=/", ck)
	}

	// The landing was the cookie's first request of 3.
	for i := 2; i <= 3; i++ {
		n := b.recorded()
		text, _ := b.open(t, url, "page=", 30*time.Second)
		if got := b.statuses(url, n); len(got) != 1 || got[0] != http.StatusOK || !strings.Contains(text, "id="+first) {
			t.Fatalf("the cookie's request %d of 3: %v %q, want 200 under %s", i, got, text, first)
		}
	}
	n = b.recorded()
	text, _ = b.open(t, url, "page=/article?id=7&lang=en id=cookie:", time.Minute)
	if got := b.statuses(url, n); len(got) != 2 || got[0] != http.StatusTooManyRequests {
		t.Fatalf("past the cookie's 3: the page's responses %v, want the challenge (429) first", got)
	}
	if again := pageIdentity.FindStringSubmatch(text)[1]; again == first {
		t.Fatalf("a spent cookie's browser solved again and kept its identity %s", first)
	}
}

// TestChallengeBrowserSolvesWithoutSecureContext: at http://tally.test
// (not a secure context: no crypto.subtle) the page's own SHA-256 solves.
func TestChallengeBrowserSolvesWithoutSecureContext(t *testing.T) {
	c := startCaddy(t, browserSite(t, 3))
	if res := c.Do(request{Path: "/"}); res.Status != http.StatusOK {
		t.Fatalf("the zone's one request per hour: %d, want 200", res.Status)
	}
	b := startBrowser(t, 2*time.Minute)
	url := strings.Replace(c.URL, "127.0.0.1", "tally.test", 1) + "/plain?x=1"
	n := b.recorded()
	_, took := b.open(t, url, "page=/plain?x=1 id=cookie:", time.Minute)
	if secure, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`window.isSecureContext`)); err != nil || secure {
		t.Fatalf("http://tally.test is a secure context (%v, %v): this test would not reach the page's own SHA-256", secure, err)
	}
	t.Logf("chromium solved difficulty 3 with the page's own SHA-256 and landed in %v", took.Round(time.Millisecond))
	if got := b.statuses(url, n); len(got) != 2 || got[0] != http.StatusTooManyRequests || got[1] != http.StatusOK {
		t.Fatalf("the page's responses: %v, want [429 200]", got)
	}
}

// BenchmarkChallengeBrowserSolve is the time chromium takes from opening a
// page behind a spent zone to landing on it, challenge solved, at
// difficulty 4 and 5 (crypto.subtle, 127.0.0.1): solve-ms/op, and the
// slowest, max-solve-ms (the work is geometric: its spread is wide).
func BenchmarkChallengeBrowserSolve(b *testing.B) {
	for _, d := range []int{4, 5} {
		b.Run(fmt.Sprintf("difficulty=%d", d), func(b *testing.B) {
			c := startCaddy(b, browserSite(b, d))
			if res := c.Do(request{Path: "/"}); res.Status != http.StatusOK {
				b.Fatalf("the zone's one request per hour: %d, want 200", res.Status)
			}
			br := startBrowser(b, 10*time.Minute)
			var total, slowest time.Duration
			for i := 0; b.Loop(); i++ {
				br.clearCookies(b)
				_, took := br.open(b, fmt.Sprintf("%s/p%d", c.URL, i), fmt.Sprintf("page=/p%d id=cookie:", i), 3*time.Minute)
				total += took
				slowest = max(slowest, took)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "solve-ms/op")
			b.ReportMetric(float64(slowest.Milliseconds()), "max-solve-ms")
		})
	}
}
