package tests

// Budgets in dollars (charge usd) through a real Caddy in front of the
// model LLM upstream: three models' responses, JSON and streamed, priced
// to the micro-dollar, locally, across three strict instances, and across
// a reload.

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/tests/internal/llmupstream"
)

// usdZones is the price table with a budget of one cent a day,
// and, for the fallback, a zone whose table has no default.
const usdZones = `
		zone spend {
			key {http.request.header.Authorization}
			quota 0.01 usd per day
			charge usd {
				model gpt-4.1-mini*    input 0.40 cached_input 0.10 output 1.60
				model claude-sonnet-4* input 3.00 cached_input 0.30 output 15.00
				default                input 5.00 output 15.00
			}
		}`

// usdSite serves the status endpoint at /rate_limit, /gen (the config's
// generation) and everything else through the zones to upstream.
func usdSite(upstream, zones, distributed string, gen int) string {
	return fmt.Sprintf(`http:// {
	handle /rate_limit {
		rate_limit_status spend
	}
	handle /gen {
		respond "%d"
	}
	handle {
		rate_limit {`+zones+distributed+`
		}
		reverse_proxy %s
	}
}
`, gen, upstream)
}

// usdCall is one LLM request: an API, streamed or not, and the usage the
// upstream reports.
type usdCall struct {
	path, body string
	usage      llmupstream.Usage
}

// usdPrices are the test's own copy of the table, in dollars per million
// tokens: input, cached input, output.
var usdPrices = map[string][3]float64{
	"gpt-4.1-mini":    {0.40, 0.10, 1.60},
	"claude-sonnet-4": {3.00, 0.30, 15.00},
	"":                {5.00, 5.00, 15.00},
}

// microDollars is what the prices say c costs: nano-dollars exactly (the
// prices have 3 decimals), rounded up to the micro-dollar.
func (c usdCall) microDollars() int64 {
	p := usdPrices[""]
	for prefix, pp := range usdPrices {
		if prefix != "" && strings.HasPrefix(c.usage.Model, prefix) {
			p = pp
		}
	}
	nano := func(tokens int64, perMillion float64) int64 { return tokens * int64(perMillion*1000+0.5) }
	n := nano(c.usage.Input-c.usage.Cached, p[0]) + nano(c.usage.Cached, p[1]) + nano(c.usage.Output, p[2])
	return (n + 999) / 1000
}

// usdCalls are three models through four APIs' shapes. The fourth makes
// the spend exactly one cent only when every response is rounded up: its
// cost is 2645.3 micro-dollars.
var usdCalls = []usdCall{
	{"/v1/chat/completions", `{"model":"gpt-4.1-mini"}`,
		llmupstream.Usage{Input: 1234, Cached: 200, Output: 321, Model: "gpt-4.1-mini-2025-04-14"}},
	{"/v1/messages", `{"model":"claude-sonnet-4-5","stream":true}`,
		llmupstream.Usage{Input: 517, Output: 233, Model: "claude-sonnet-4-5-20250929"}},
	{"/v1beta/models/gemini-2.5-flash:generateContent", `{}`,
		llmupstream.Usage{Input: 101, Output: 57, Model: "gemini-2.5-flash"}},
	{"/v1/chat/completions", `{"model":"gpt-4.1-mini","stream":true,"stream_options":{"include_usage":true}}`,
		llmupstream.Usage{Input: 2614, Cached: 1, Output: 1000, Model: "gpt-4.1-mini-2025-04-14"}},
}

// send makes call c with key's Authorization through caddy.
func (c usdCall) send(t *testing.T, caddy *caddyInstance, key string) (int, http.Header) {
	t.Helper()
	status, h, err := c.try(caddy, key)
	if err != nil {
		t.Fatal(err)
	}
	return status, h
}

// try makes call c with key's Authorization through caddy, reading the
// whole body.
func (c usdCall) try(caddy *caddyInstance, key string) (int, http.Header, error) {
	req, err := http.NewRequest(http.MethodPost, caddy.URL+c.path, strings.NewReader(c.body))
	if err != nil {
		return 0, nil, err
	}
	c.usage.SetHeaders(req.Header)
	req.Header.Set("Authorization", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := caddy.client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: %v", c.path, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, nil, fmt.Errorf("POST %s: reading the body: %v", c.path, err)
	}
	return resp.StatusCode, resp.Header, nil
}

// usdStatus is the status endpoint's answer for the spend zone.
type usdStatus struct {
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	Used         *int64 `json:"used"`
	Unit         string `json:"unit"`
	LimitUSD     string `json:"limit_usd"`
	RemainingUSD string `json:"remaining_usd"`
	UsedUSD      string `json:"used_usd"`
}

func spendStatus(t *testing.T, c *caddyInstance, key string) usdStatus {
	t.Helper()
	res := c.Do(request{Path: "/rate_limit", Header: map[string]string{"Authorization": key}})
	var out struct {
		Zones []usdStatus `json:"zones"`
	}
	if err := json.Unmarshal([]byte(res.Body), &out); err != nil || len(out.Zones) != 1 {
		t.Fatalf("status %d %q: %v", res.Status, res.Body, err)
	}
	return out.Zones[0]
}

// checkCent spends key's cent over fleet, one call per instance in turn:
// after each the spend is the prices' to the micro-dollar, on the next
// instance too; every call passes while spend is left (the last reaching
// exactly one cent), and the next, on every instance, is 429 without
// reaching the upstream.
func checkCent(t *testing.T, fleet []*caddyInstance, key string, u *llmupstream.Server) {
	checkCentWith(t, fleet, key, u, "w=86400")
}

// checkCentWith is checkCent for a spend zone whose RateLimit-Policy
// says window (w=...): a quota zone's status also says what was used.
func checkCentWith(t *testing.T, fleet []*caddyInstance, key string, u *llmupstream.Server, window string) {
	t.Helper()
	var spent int64
	deniedAt := -1
	for i, call := range usdCalls {
		if spent >= 10_000 && deniedAt < 0 {
			deniedAt = i
		}
		spent += call.microDollars()
	}
	if spent != 10_000 || deniedAt != -1 {
		t.Fatalf("the calls cost %d micro-dollars, want exactly 10000 after the last", spent)
	}
	before := len(u.Requests())
	spent = 0
	for i, call := range usdCalls {
		c := fleet[i%len(fleet)]
		if status, _ := call.send(t, c, key); status != 200 {
			t.Fatalf("call %d (%s, %s) with %d of 10000 micro-dollars spent: %d, want 200", i+1, call.usage.Model, call.path, spent, status)
		}
		spent += call.microDollars()
		next := fleet[(i+1)%len(fleet)]
		waitCharged(t, next, "spend", key, 10_000-spent)
	}
	for i, c := range fleet {
		status, h := usdCalls[0].send(t, c, key)
		if status != 429 {
			t.Fatalf("instance %d after one cent spent: %d, want 429", i, status)
		}
		if p := h.Get("RateLimit-Policy"); !strings.Contains(p, `"spend";q=10000;`+window+`;tally-cost;tally-post-charged;tally-unit="usd-micro"`) {
			t.Errorf("RateLimit-Policy %q does not say the quota is 10000 micro-dollars a day", p)
		}
	}
	if n := len(u.Requests()) - before; n != len(usdCalls) {
		t.Errorf("%d requests reached the upstream, want %d", n, len(usdCalls))
	}
	st := spendStatus(t, fleet[0], key)
	if st.Unit != "usd-micro" || st.Limit != 10_000 || st.LimitUSD != "0.010000" || st.Remaining != 0 || st.RemainingUSD != "0.000000" {
		t.Errorf("status %+v, want none of one cent left, in micro-dollars and dollars", st)
	}
	if quota := window == "w=86400"; quota && (st.Used == nil || *st.Used != 10_000 || st.UsedUSD != "0.010000") {
		t.Errorf("status %+v, want one cent used, in micro-dollars and dollars", st)
	}
}

// A rate in dollars (events <amount> usd, window) counts the same
// micro-dollars: a cent a month refills one micro-dollar every 259 s, so
// the calls' cent is spent to the micro-dollar as the quota's is.
func TestChargeUSDRateInDollars(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	zones := strings.Replace(usdZones, "quota 0.01 usd per day", "events 0.01 usd\n\t\t\twindow 720h", 1)
	if zones == usdZones {
		t.Fatal("the rate zone is the quota zone")
	}
	c := startCaddy(t, usdSite(u.Addr, zones, "", 1))
	checkCentWith(t, []*caddyInstance{c}, "Bearer rate", u, "w=2592000")
}

func TestChargeUSDDeniesAtTheRequestThePricesSay(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	c := startCaddyWith(t, "metrics", usdSite(u.Addr, usdZones, "", 1))
	checkCent(t, []*caddyInstance{c}, "Bearer local", u)
	if v, _ := metricValue(c.scrape(), "caddy_rate_limit_spend_usd_total", map[string]string{"zone": "spend"}); math.Abs(v-0.01) > 1e-9 {
		t.Errorf("spend_usd_total = %v, want the cent spent", v)
	}
	// The admin key view and the CLI say it in dollars too.
	_, body := c.adminDo(http.MethodGet, keyPath("spend", "Bearer local"))
	for _, want := range []string{`"unit":"usd-micro"`, `"remaining":0,`, `"remaining_usd":"0.000000"`, `"used_usd":"0.010000"`, `"limit_usd":"0.010000"`} {
		if !strings.Contains(body, want) {
			t.Errorf("admin key view %s does not say %s", body, want)
		}
	}
	if out := rateLimitCLI(t, c, "key", "spend", "Bearer local").ok(t, "key spend")[0]; !strings.Contains(out, "LIMITED, $0.010000 of $0.010000 used, $0.000000 remaining") {
		t.Errorf("caddy rate-limit key: %q, want the spend in dollars", out)
	}

	// A reload keeps the spend.
	load(t, c, "metrics", usdSite(u.Addr, usdZones, "", 2))
	waitFor(t, 5*time.Second, "the reloaded config to serve", func() bool {
		res, err := c.try(request{Path: "/gen"})
		return err == nil && res.Body == "2"
	})
	if st := spendStatus(t, c, "Bearer local"); st.Used == nil || *st.Used != 10_000 {
		t.Errorf("after a reload: %+v, want the cent spent", st)
	}
	if status, _ := usdCalls[2].send(t, c, "Bearer local"); status != 429 {
		t.Errorf("after a reload: %d, want 429", status)
	}

	// A model with no price, in a table without default, charges the
	// zone's cost (1 micro-dollar), counted as no_price.
	noDefault := strings.Replace(usdZones, "default                input 5.00 output 15.00\n", "", 1)
	if noDefault == usdZones {
		t.Fatal("the zone without a default price is the zone with one")
	}
	load(t, c, "metrics", usdSite(u.Addr, noDefault, "", 3))
	waitFor(t, 5*time.Second, "the config without a default price to serve", func() bool {
		res, err := c.try(request{Path: "/gen"})
		return err == nil && res.Body == "3"
	})
	if status, _ := usdCalls[2].send(t, c, "Bearer no-price"); status != 200 {
		t.Fatalf("a model without a price: %d, want 200", status)
	}
	waitCharged(t, c, "spend", "Bearer no-price", 10_000-1)
	if v, _ := metricValue(c.scrape(), "caddy_rate_limit_charge_fallbacks_total", map[string]string{"zone": "spend", "reason": "no_price"}); v != 1 {
		t.Errorf("charge_fallbacks_total{reason=no_price} = %v, want 1", v)
	}
}

func TestChargeUSDIsExactAcrossThreeStrictInstances(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	u := llmupstream.Start(t)
	site := usdSite(u.Addr, usdZones, strictBlock(rs.Addr), 1)
	fleet := []*caddyInstance{startCaddy(t, site), startCaddy(t, site), startCaddy(t, site)}
	checkCent(t, fleet, "Bearer fleet", u)
	rs.requireEveryKeyExpires(t, 1)
}

// 48 calls of one key at once, the four calls' models and formats in turn,
// each priced by its own response (the writers and scanners a request is
// served through are pooled and reused): the spend is their exact sum.
func TestChargeUSDPricesConcurrentResponsesOfOneKeyExactly(t *testing.T) {
	t.Parallel()
	u := llmupstream.Start(t)
	c := startCaddy(t, usdSite(u.Addr, strings.Replace(usdZones, "quota 0.01 usd", "quota 1 usd", 1), "", 1))
	const n = 48
	var (
		wg   sync.WaitGroup
		want int64
		errs = make(chan error, n)
	)
	for i := range n {
		call := usdCalls[i%len(usdCalls)]
		want += call.microDollars()
		wg.Go(func() {
			status, _, err := call.try(c, "Bearer many")
			if err == nil && status != 200 {
				err = fmt.Errorf("call %d (%s): %d, want 200", i, call.usage.Model, status)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	waitCharged(t, c, "spend", "Bearer many", 1_000_000-want)
}
