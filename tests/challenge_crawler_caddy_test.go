package tests

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A crawler model: the client a challenge is meant to price. It rotates
// through 500 loopback addresses (127.1.y.z, each bound as the source of
// its own connections: Linux routes all of 127.0.0.0/8 to lo, so no
// header or trusted proxy stands in for them), and solves with native Go
// SHA-256, as pow solvers do, not with a browser.

// crawlerSite is the zone (events 30 per minute per /64, here per
// address: an IPv4 key is the whole address) with a challenge whose cookie
// allows 600 pages per 24h, so that the cookie's budget does not refill
// while a test runs (one page per 144 s).
const crawlerSite = `http:// {
	rate_limit {
		zone visitors {
			key {client_ip}
			ipv6_prefix 64
			events 30
			window 1m
			challenge {
				difficulty 4
				valid 24h
				events 600
				window 24h
			}
		}
	}
	respond "page"
}
`

// crawlerAddr is the i-th of the crawler's loopback addresses.
func crawlerAddr(i int) string { return fmt.Sprintf("127.1.%d.%d", i/250, i%250+1) }

// nativeSolve is the crawler's solver: the smallest decimal nonce whose
// SHA-256 with token starts with d zero hex digits, and how many hashes it
// took. It gives up (nonce "") past 64 times the mean work.
func nativeSolve(token string, d int) (nonce string, hashes int64) {
	buf := []byte(token)
	base := len(buf)
	limit := uint64(1) << (4*d + 6)
	for n := uint64(0); n < limit; n++ {
		buf = strconv.AppendUint(buf[:base], n, 10)
		sum := sha256.Sum256(buf)
		hashes++
		if hexZeros(sum[:], d) {
			return string(buf[base:]), hashes
		}
	}
	return "", hashes
}

// hexZeros reports whether sum starts with d zero hex digits.
func hexZeros(sum []byte, d int) bool {
	for i := range d {
		nibble := sum[i/2] >> 4
		if i%2 == 1 {
			nibble = sum[i/2] & 15
		}
		if nibble != 0 {
			return false
		}
	}
	return true
}

// threadCPU is the CPU time of the calling OS thread (the goroutine must be
// locked to it).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1, &ru) // RUSAGE_THREAD
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// crawlerClient is one address of the crawler, without test helpers that
// fail the test: it runs on goroutines.
type crawlerClient struct {
	base   string
	client *http.Client
}

// get GETs path as a browser's navigation (so a denial is the challenge
// page), with cookie if set.
func (cc crawlerClient) get(path, cookie string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, cc.base+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Accept", browserAccept["Accept"])
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	res, err := cc.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	return res.StatusCode, string(b), err
}

// solve solves the challenge a page carries and submits it; it returns the
// cookie it set (as a Cookie header value), the hashes and the CPU time
// the solve took.
func (cc crawlerClient) solve(page string) (cookie string, hashes int64, cpu time.Duration, err error) {
	token, d, action, ok := pageChallenge(page)
	if !ok {
		return "", 0, 0, fmt.Errorf("no challenge in %.200q", page)
	}
	runtime.LockOSThread()
	start := threadCPU()
	nonce, hashes := nativeSolve(token, d)
	cpu = threadCPU() - start
	runtime.UnlockOSThread()
	if nonce == "" {
		return "", hashes, cpu, fmt.Errorf("no nonce solves difficulty %d after %d hashes", d, hashes)
	}
	form := url.Values{"challenge": {token}, "nonce": {nonce}, "elapsed_ms": {strconv.FormatInt(cpu.Milliseconds(), 10)}, "return": {"/"}}
	res, err := noRedirects(cc.client).Post(cc.base+action, "application/x-www-form-urlencoded", strings.NewReader(form.Encode()))
	if err != nil {
		return "", hashes, cpu, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	for _, ck := range res.Cookies() {
		if ck.Name == "tally_visitors" && res.StatusCode == http.StatusSeeOther {
			return ck.Name + "=" + ck.Value, hashes, cpu, nil
		}
	}
	return "", hashes, cpu, fmt.Errorf("the solution got %d and no cookie", res.StatusCode)
}

// crawlResult is what the crawler got and paid.
type crawlResult struct {
	freePages, cookiePages, solves int64
	hashes                         int64
	cpu                            time.Duration // solving, summed over the addresses
	wall                           time.Duration
	minFree, maxFree               int64
}

// crawl runs the crawler model: each of addrs addresses fetches pages until
// it is challenged (its 30 free ones, and the few the minute refills),
// solves, and fetches cookiePages pages under the cookie; workers
// addresses at a time.
func crawl(tb testing.TB, c *caddyInstance, addrs, workers, cookiePages int) crawlResult {
	tb.Helper()
	var (
		res      crawlResult
		mu       sync.Mutex
		firstErr error
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	res.minFree = 1 << 62
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= addrs {
					return
				}
				ip := crawlerAddr(i)
				client := clientFrom(tb, ip)
				cc := crawlerClient{base: c.URL, client: client}
				var free int64
				var page string
				for ; ; free++ {
					status, body, err := cc.get(fmt.Sprintf("/%s/page%d", ip, free), "")
					if err != nil {
						fail(err)
						return
					}
					if status == http.StatusOK {
						if free == 60 {
							fail(fmt.Errorf("%s: 60 pages and no challenge (the zone allows 30 a minute)", ip))
							return
						}
						continue
					}
					if status != http.StatusTooManyRequests {
						fail(fmt.Errorf("%s: page %d: status %d", ip, free+1, status))
						return
					}
					page = body
					break
				}
				cookie, hashes, cpu, err := cc.solve(page)
				if err != nil {
					fail(fmt.Errorf("%s: %v", ip, err))
					return
				}
				for p := range cookiePages {
					status, _, err := cc.get(fmt.Sprintf("/%s/more%d", ip, p), cookie)
					if err == nil && status != http.StatusOK {
						err = fmt.Errorf("status %d", status)
					}
					if err != nil {
						fail(fmt.Errorf("%s: page %d under its cookie: %v", ip, p+1, err))
						return
					}
				}
				client.CloseIdleConnections()
				mu.Lock()
				res.freePages += free
				res.cookiePages += int64(cookiePages)
				res.solves++
				res.hashes += hashes
				res.cpu += cpu
				res.minFree, res.maxFree = min(res.minFree, free), max(res.maxFree, free)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.wall = time.Since(start)
	if firstErr != nil {
		tb.Fatalf("the crawler: %v", firstErr)
	}
	return res
}

// report states what the crawl paid, for the test log and the benchmark.
func (r crawlResult) report() string {
	pages := r.freePages + r.cookiePages
	return fmt.Sprintf("%d addresses: %d free pages (%d to %d each), %d challenges solved with %d hashes (%.0f per solve, 16^4 = 65536 expected), "+
		"%.2f CPU-s of solving (%.1f ms per solve), %d pages under cookies; %d pages in %v: %.0f pages/s; "+
		"a cookie's 600 pages cost %.0f hashes: %.0f hashes per page",
		r.solves, r.freePages, r.minFree, r.maxFree, r.solves, r.hashes, float64(r.hashes)/float64(r.solves),
		r.cpu.Seconds(), float64(r.cpu.Milliseconds())/float64(r.solves), r.cookiePages,
		pages, r.wall.Round(time.Millisecond), float64(pages)/r.wall.Seconds(),
		float64(r.hashes)/float64(r.solves), float64(r.hashes)/float64(r.solves)/600)
}

// TestChallengeCrawlerPaysForEveryAddress: 500 addresses each get the
// zone's 30 free pages (plus what the minute refills while the crawl
// runs), then a challenge each, which the native solver pays for; each
// solved cookie admits its pages. What it paid and got is logged.
func TestChallengeCrawlerPaysForEveryAddress(t *testing.T) {
	c := startCaddy(t, crawlerSite)
	r := crawl(t, c, 500, 8, 3)
	t.Log("crawler model: " + r.report())
	if r.solves != 500 || r.minFree < 30 {
		t.Fatalf("%d solves, fewest free pages %d: want 500 addresses each challenged after at least its 30", r.solves, r.minFree)
	}
	// The minute refills one page per 2 s per address: more than that
	// is pages the zone failed to count.
	if extra := r.maxFree - 30; extra > int64(r.wall/(2*time.Second))+1 {
		t.Fatalf("an address got %d free pages in a crawl of %v: more than its 30 and the refill", r.maxFree, r.wall)
	}
	if mean := float64(r.hashes) / float64(r.solves); mean < 65536/4 || mean > 65536*4 {
		t.Fatalf("%.0f hashes per solve at difficulty 4: far from 16^4", mean)
	}
}

// TestChallengeCrawlerReusingOneCookieGetsItsBudget: the crawler solves
// once and sends the cookie from all 500 addresses: exactly the cookie's
// 600 pages are admitted, whichever address sends them.
func TestChallengeCrawlerReusingOneCookieGetsItsBudget(t *testing.T) {
	c := startCaddy(t, crawlerSite)
	first := crawlerClient{base: c.URL, client: clientFrom(t, crawlerAddr(0))}
	var page string
	for i := range 31 {
		status, body, err := first.get("/", "")
		if err != nil {
			t.Fatal(err)
		}
		if status == http.StatusTooManyRequests {
			page = body
			break
		}
		if i == 30 {
			t.Fatal("31 pages from one address and no challenge")
		}
	}
	cookie, _, _, err := first.solve(page)
	if err != nil {
		t.Fatal(err)
	}
	clients := make([]crawlerClient, 500)
	for i := range clients {
		clients[i] = crawlerClient{base: c.URL, client: clientFrom(t, crawlerAddr(i))}
	}
	var admitted, challenged, other atomic.Int64
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= 700 {
					return
				}
				status, _, err := clients[i%500].get(fmt.Sprintf("/reuse%d", i), cookie)
				switch {
				case err != nil:
					other.Add(1)
					t.Error(err)
				case status == http.StatusOK:
					admitted.Add(1)
				case status == http.StatusTooManyRequests:
					challenged.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("one cookie from 500 addresses: %d of 700 pages admitted, %d challenged", admitted.Load(), challenged.Load())
	if admitted.Load() != 600 || challenged.Load() != 100 || other.Load() != 0 {
		t.Fatalf("one cookie from 500 addresses: %d admitted, %d challenged, %d other; want exactly the cookie's 600, then 100 challenged",
			admitted.Load(), challenged.Load(), other.Load())
	}
}

// caddyCPU is c's CPU time so far (user + system), from /proc.
func caddyCPU(t *testing.T, c *caddyInstance) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// zeros is an endless body of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestChallengeEndpointUnderAttack: the verify URL takes what a hostile
// client sends, and answers each with a 4xx, never a 5xx, in bounded
// memory and a hash's CPU: bodies of 1 MiB and endless ones, a flood of
// wrong nonces, a solution replayed at once from many connections, and
// broken encodings.
func TestChallengeEndpointUnderAttack(t *testing.T) {
	c := startCaddyWith(t, "", crawlerSite)
	verify := c.URL + "/.well-known/tally/challenge"
	client := clientFrom(t, "127.0.0.1")
	post := func(contentType string, body io.Reader) (int, string, error) {
		res, err := noRedirects(client).Post(verify, contentType, body)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		return res.StatusCode, string(b), nil
	}
	const form = "application/x-www-form-urlencoded"
	heapBefore := caddyMemStats(t, c).HeapInuse

	// Bodies past the 4 KiB the form may have: 64 of 1 MiB, 4 endless.
	var wg sync.WaitGroup
	var statuses sync.Map
	for i := range 68 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body io.Reader = io.LimitReader(zeros{}, 1<<20)
			if i >= 64 {
				body = zeros{}
			}
			status, _, err := post(form, body)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Errorf("a huge body: %v", err)
			}
			statuses.Store(i, status)
		}()
	}
	wg.Wait()
	statuses.Range(func(k, v any) bool {
		if s := v.(int); s != 0 && s != http.StatusBadRequest {
			t.Errorf("huge body %d: status %d, want 400 (or the connection closed while it was sent)", k, s)
		}
		return true
	})

	// A flood of wrong nonces for a real challenge: a 403 each, and the
	// CPU of one HMAC and one hash, not of a solve (16^4 hashes, tens of
	// milliseconds).
	cc := crawlerClient{base: c.URL, client: client}
	var page string
	for range 31 {
		if status, body, err := cc.get("/", ""); err == nil && status == http.StatusTooManyRequests {
			page = body
			break
		}
	}
	token, d, _, ok := pageChallenge(page)
	if !ok {
		t.Fatal("no challenge after the zone's 30 pages")
	}
	const flood = 2000
	var wrong []string // nonces that do not solve: checked here, one hash each
	for n := 1; len(wrong) < flood; n++ {
		sum := sha256.Sum256([]byte(token + strconv.Itoa(n)))
		if !hexZeros(sum[:], d) {
			wrong = append(wrong, strconv.Itoa(n))
		}
	}
	cpuBefore := caddyCPU(t, c)
	var bad atomic.Int64
	var next atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < flood; i = next.Add(1) - 1 {
				body := url.Values{"challenge": {token}, "nonce": {wrong[i]}, "return": {"/"}}.Encode()
				if status, _, err := post(form, strings.NewReader(body)); err != nil || status != http.StatusForbidden {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	perSubmission := (caddyCPU(t, c) - cpuBefore) / flood
	t.Logf("%d wrong nonces: %v of Caddy's CPU each (a race-built Caddy)", flood, perSubmission)
	if bad.Load() > 0 {
		t.Errorf("%d of %d wrong nonces were not a 403", bad.Load(), flood)
	}
	if perSubmission > 2*time.Millisecond {
		t.Errorf("a wrong nonce cost Caddy %v of CPU: more than a hash's worth (2 ms bound; a solve at difficulty %d is 16^%d hashes)", perSubmission, d, d)
	}

	// One right solution sent 50 times at once: exactly one cookie.
	nonce, _ := nativeSolve(token, d)
	var solved, replayed atomic.Int64
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body, err := post(form, strings.NewReader(url.Values{"challenge": {token}, "nonce": {nonce}, "return": {"/"}}.Encode()))
			switch {
			case err != nil:
				t.Error(err)
			case status == http.StatusSeeOther:
				solved.Add(1)
			case status == http.StatusForbidden && strings.Contains(body, "replayed"):
				replayed.Add(1)
			default:
				t.Errorf("a replayed solution: %d %q", status, body)
			}
		}()
	}
	wg.Wait()
	if solved.Load() != 1 || replayed.Load() != 49 {
		t.Errorf("one solution sent 50 times at once: %d solved, %d refused as replayed; want 1 and 49", solved.Load(), replayed.Load())
	}

	// Broken encodings: each a 4xx with a short body.
	long := strings.Repeat("9", 100_000)
	for _, b := range []struct{ what, contentType, body string }{
		{"bad percent-encoding", form, "challenge=%zz&nonce=1"},
		{"invalid UTF-8", form, "challenge=\xff\xfe\xfd&nonce=\xc0\xaf"},
		{"a token of garbage", form, "challenge=" + strings.Repeat("A", 3000) + "&nonce=1"},
		{"a token that is not base64url", form, "challenge=!!!!&nonce=1"},
		{"a 100,000-digit nonce", form, "challenge=" + url.QueryEscape(token) + "&nonce=" + long[:3500]},
		{"a negative nonce", form, "challenge=" + url.QueryEscape(token) + "&nonce=-1"},
		{"fields repeated", form, strings.Repeat("challenge=a&nonce=1&", 150)},
		{"no fields", form, ""},
		{"a NUL in the token", form, "challenge=" + url.QueryEscape(token[:10]+"\x00"+token[10:]) + "&nonce=1"},
		{"JSON", "application/json", `{"challenge":"` + token + `","nonce":"1"}`},
		{"multipart", "multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"challenge\"\r\n\r\n" + token + "\r\n--x--\r\n"},
		{"no content type", "", "challenge=" + url.QueryEscape(token) + "&nonce=1"},
	} {
		status, body, err := post(b.contentType, strings.NewReader(b.body))
		if err != nil {
			t.Errorf("%s: %v", b.what, err)
			continue
		}
		if status < 400 || status >= 500 || len(body) > 200 {
			t.Errorf("%s: %d %q, want a 4xx with a short body", b.what, status, body)
		}
	}
	heapAfter := caddyMemStats(t, c).HeapInuse
	t.Logf("Caddy's heap in use: %d KiB before, %d KiB after (64 MiB of bodies, endless ones, %d submissions)", heapBefore>>10, heapAfter>>10, flood+50+12)
	if int64(heapAfter)-int64(heapBefore) > 8<<20 {
		t.Errorf("Caddy's heap grew by %d KiB: the endpoint kept what it was sent", (int64(heapAfter)-int64(heapBefore))>>10)
	}
}

// BenchmarkChallengeCrawler runs the crawler model once per op, each
// against a fresh Caddy: 500 addresses, their free pages, a native solve
// each at difficulty 4 and 3 pages under each cookie. It reports the work
// (hashes/solve, cpu-ms/solve), what a page costs at a cookie's 600
// (hashes/page) and the pages the crawler got per second (pages/s).
func BenchmarkChallengeCrawler(b *testing.B) {
	var total crawlResult
	for b.Loop() {
		r := crawl(b, startCaddy(b, crawlerSite), 500, 8, 3)
		total.freePages += r.freePages
		total.cookiePages += r.cookiePages
		total.solves += r.solves
		total.hashes += r.hashes
		total.cpu += r.cpu
		total.wall += r.wall
	}
	b.ReportMetric(float64(total.hashes)/float64(total.solves), "hashes/solve")
	b.ReportMetric(float64(total.cpu.Microseconds())/1000/float64(total.solves), "cpu-ms/solve")
	b.ReportMetric(float64(total.hashes)/float64(total.solves)/600, "hashes/page")
	b.ReportMetric(float64(total.freePages+total.cookiePages)/total.wall.Seconds(), "pages/s")
}

// TestChallengesDocSiteAsWritten runs docs/challenges.md's site, its
// address, upstream and one let-through range moved to loopback: an address
// gets its 30 pages, then a browser's navigation gets the challenge page
// (429, no-store, Retry-After, the docs' CSP, what a client without
// JavaScript reads) and an API client the plain 429; an address in a
// let-through range is never challenged.
func TestChallengesDocSiteAsWritten(t *testing.T) {
	blocks := caddyfileBlocks(t, "docs/challenges.md")
	if len(blocks) == 0 {
		t.Fatal("docs/challenges.md has no ```caddyfile site")
	}
	site := blocks[0].text
	for _, e := range []struct{ from, to string }{
		{"example.com {", "http:// {"},
		{"192.0.2.0/24", "127.0.0.2/32"},
		{"reverse_proxy 127.0.0.1:9000", `respond "page"`},
	} {
		if !strings.Contains(site, e.from) {
			t.Fatalf("docs/challenges.md's site has no %q: update this test with it", e.from)
		}
		site = strings.ReplaceAll(site, e.from, e.to)
	}
	c := startCaddy(t, site)
	visitor := crawlerClient{base: c.URL, client: clientFrom(t, "127.0.0.1")}
	for i := range 30 {
		if status, _, err := visitor.get("/", ""); err != nil || status != http.StatusOK {
			t.Fatalf("page %d of the free 30: %d %v", i+1, status, err)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, c.URL+"/", nil)
	req.Header.Set("Accept", browserAccept["Accept"])
	res, err := visitor.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if _, _, _, ok := pageChallenge(string(body)); res.StatusCode != http.StatusTooManyRequests || !ok {
		t.Fatalf("a browser's page 31: %d %.300q, want 429 with the challenge page", res.StatusCode, body)
	}
	if got, want := res.Header.Get("Content-Security-Policy"), docsCSP(t); got != want {
		t.Errorf("the challenge page's CSP %q, want the docs' %q", got, want)
	}
	if res.Header.Get("Cache-Control") != "no-store" || res.Header.Get("Retry-After") == "" {
		t.Errorf("the challenge page's Cache-Control %q, Retry-After %q: want no-store and a time", res.Header.Get("Cache-Control"), res.Header.Get("Retry-After"))
	}
	if !strings.Contains(string(body), "<noscript><p>This check needs JavaScript. Without it, try again in") {
		t.Errorf("the challenge page tells a client without JavaScript nothing: %.500q", body)
	}
	api := c.Do(request{Header: map[string]string{"Accept": "application/json"}, Client: visitor.client})
	if _, _, _, ok := pageChallenge(api.Body); api.Status != http.StatusTooManyRequests || ok {
		t.Errorf("an API client past the limit: %d %.200q, want the plain 429", api.Status, api.Body)
	}
	// Paced under its own zone's 10 a second: 35 pages, more than the
	// visitors' 30, none challenged.
	allowed := crawlerClient{base: c.URL, client: clientFrom(t, "127.0.0.2")}
	admitted := 0
	pace := time.NewTicker(150 * time.Millisecond)
	defer pace.Stop()
	for i := range 35 {
		<-pace.C
		status, body, err := allowed.get("/", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, ok := pageChallenge(body); ok {
			t.Fatalf("a let-through crawler was challenged at its request %d", i+1)
		}
		if status == http.StatusOK {
			admitted++
		}
	}
	if admitted != 35 {
		t.Errorf("a let-through crawler pacing under its zone's 10 a second got %d of 35 pages", admitted)
	}
}
