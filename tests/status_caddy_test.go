package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

type statusAnswer struct {
	Zones []struct {
		Zone      string `json:"zone"`
		Limit     int64  `json:"limit"`
		Window    int64  `json:"window"`
		Remaining int64  `json:"remaining"`
		Reset     int64  `json:"reset"`
		BannedFor int64  `json:"banned_for"`
		Period    string `json:"period"`
		Used      *int64 `json:"used"`
		InFlight  *int64 `json:"in_flight"`
		Error     string `json:"error"`
	} `json:"zones"`
}

func statusSite(distributed string) string {
	return `http:// {
	handle /rate_limit {
		rate_limit_status api_key monthly conc
	}
	handle {
		rate_limit {
			zone api_key {
				key {http.request.header.X-API-Key}
				events 10
				window 1m
			}
			zone monthly {
				key {http.request.header.X-API-Key}
				quota 1000 per month
			}
			zone conc {
				key {http.request.header.X-API-Key}
				concurrency 4
			}
` + distributed + `
		}
		respond "ok"
	}
}
`
}

func askStatus(t testing.TB, c *caddyInstance, key string) statusAnswer {
	t.Helper()
	r := c.Do(request{Path: "/rate_limit", Header: map[string]string{"X-API-Key": key}})
	if r.Status != http.StatusOK || r.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("status endpoint: %d, Cache-Control %q: %s", r.Status, r.Header.Get("Cache-Control"), r.Body)
	}
	var a statusAnswer
	if err := json.Unmarshal([]byte(r.Body), &a); err != nil || len(a.Zones) != 3 {
		t.Fatalf("status endpoint: %v in %s", err, r.Body)
	}
	failedReads(t, a)
	return a
}

// failedReads fails the test at once when a zone of the answer could not
// be read (its read of the store, waiting for the zones' batch, did not
// come back within the handler's second): a status test that went on
// would ask again and again, a second each, for a minute.
func failedReads(t testing.TB, a statusAnswer) {
	t.Helper()
	for _, z := range a.Zones {
		if z.Error != "" {
			t.Fatalf("status endpoint: zone %s answered an error, %q: its read of the key failed (a read batched with the other zones' that never came back ends at the handler's deadline)", z.Zone, z.Error)
		}
	}
}

// The status endpoint's numbers equal the headers of the next real
// request, and it consumes nothing: after 1,000 status calls the whole
// burst is still admitted. Local and strict.
func TestStatusEndpointMatchesHeadersAndConsumesNothing(t *testing.T) {
	for _, mode := range []string{"local", "strict"} {
		t.Run(mode, func(t *testing.T) {
			dist := ""
			if mode == "strict" {
				// A timeout of 2s, not the default 50ms: what is tested is
				// the status's numbers, not a loaded machine's Redis round
				// trip, which 1,000 status calls give 1,000 chances to pass
				// 50ms.
				dist = "\t\t\tdistributed {\n\t\t\t\tredis redis://" + startRedis(t).Addr + "\n\t\t\t\ttimeout 2s\n\t\t\t}"
			}
			c := startCaddy(t, statusSite(dist))
			a := askStatus(t, c, "alice")
			api, monthly, conc := a.Zones[0], a.Zones[1], a.Zones[2]
			if api.Zone != "api_key" || api.Limit != 10 || api.Window != 60 || api.Remaining != 10 || api.Reset != 0 || api.BannedFor != 0 || api.Error != "" {
				t.Errorf("a fresh key: %+v, want limit 10, window 60, remaining 10, reset 0", api)
			}
			if monthly.Period != "month" || monthly.Used == nil || *monthly.Used != 0 || monthly.Limit != 1000 || monthly.Remaining != 1000 {
				t.Errorf("quota zone: %+v", monthly)
			}
			if conc.InFlight == nil || *conc.InFlight != 0 || conc.Limit != 4 {
				t.Errorf("concurrency zone: %+v", conc)
			}
			for i := range 3 {
				r := c.Do(withKey("alice"))
				after := askStatus(t, c, "alice").Zones[0]
				if r.Status != http.StatusOK {
					t.Fatalf("request %d: %d", i, r.Status)
				}
				var rem int64 = -1
				if _, after, ok := strings.Cut(r.Header.Get("RateLimit"), `"api_key";r=`); ok {
					rem, _ = strconv.ParseInt(strings.FieldsFunc(after, func(c rune) bool { return c == ';' || c == ',' })[0], 10, 64)
				}
				policy := r.Header.Get("RateLimit-Policy")
				if rem != after.Remaining || !strings.Contains(policy, `"api_key";q=10;w=60`) {
					t.Errorf("status says remaining %d after a request whose headers said r=%d (RateLimit %q), policy %q", after.Remaining, rem, r.Header.Get("RateLimit"), policy)
				}
			}
			deadline := time.Now().Add(time.Minute)
			for i := 0; i < 1000 && time.Now().Before(deadline); i++ {
				askStatus(t, c, "bob")
			}
			if n := admitted(c, withKey("bob"), 20); n != 10 {
				t.Errorf("after 1,000 status calls: %d admitted, want the whole burst, 10", n)
			}
			after := askStatus(t, c, "bob").Zones
			if after[0].Remaining != 0 || after[0].Reset < 59 || *after[1].Used != 10 {
				t.Errorf("a spent key: %+v / %+v, want remaining 0, reset ~60, used 10", after[0], after[1])
			}
			// An override shows in the status.
			mustPutOverride(t, c, "api_key", "vip", `{"match":{"key":"carol"},"events":50,"window":"1m"}`)
			if s := askStatus(t, c, "carol").Zones[0]; s.Limit != 50 || s.Remaining != 50 {
				t.Errorf("under an override: %+v, want limit 50, remaining 50", s)
			}
		})
	}
}

// The status of several strict zones reads Redis in one batch: a PTTL of
// each rate zone's key, the quota zone's quota.lua call and the
// concurrency zone's count beside them, one pipeline for all the zones.
func TestStatusEndpointReadsStrictZonesInOneBatch(t *testing.T) {
	rs := startRedis(t)
	proxy := startRedisProxy(t, rs.Addr)
	c := startCaddy(t, `http:// {
	handle /rate_limit {
		rate_limit_status first second monthly conc
	}
	handle {
		rate_limit {
			zone first {
				key {http.request.header.X-API-Key}
				events 10
				window 1m
			}
			zone second {
				key {http.request.header.X-API-Key}
				events 20
				window 1h
			}
			zone monthly {
				key {http.request.header.X-API-Key}
				quota 1000 per month
			}
			zone conc {
				key {http.request.header.X-API-Key}
				concurrency 4
			}
			distributed {
				redis redis://`+proxy.Addr+`
				timeout 2s      # through the proxy, on a loaded machine
			}
		}
		respond "ok"
	}
}
`)
	if r := c.Do(withKey("dave")); r.Status != http.StatusOK {
		t.Fatalf("a request: %d", r.Status)
	}
	// Its concurrency slot is released off the response path: a write of
	// its own, which must not fall among the status's.
	waitFor(t, 5e9, "the request's concurrency slot released", func() bool {
		return rs.Client().ZCard(context.Background(), "tally:conc:dave").Val() == 0
	})
	logEveryCommand(t, rs)
	proxy.Record()
	r := c.Do(request{Path: "/rate_limit", Header: map[string]string{"X-API-Key": "dave"}})
	var trips []string
	for _, b := range proxy.Sent() {
		if bytes.Contains(b, []byte("dave")) {
			trips = append(trips, strings.ReplaceAll(string(b), "\r\n", " "))
		}
	}
	if len(trips) != 1 || !strings.Contains(trips[0], "first") || !strings.Contains(trips[0], "monthly") || !strings.Contains(trips[0], "conc") {
		t.Errorf("Caddy wrote %d times about the key, want once (one pipeline of every zone's read):\n%s", len(trips), strings.Join(trips, "\n"))
	}
	var a statusAnswer
	if err := json.Unmarshal([]byte(r.Body), &a); err != nil || len(a.Zones) != 4 {
		t.Fatalf("status: %d %s", r.Status, r.Body)
	}
	failedReads(t, a)
	if a.Zones[0].Remaining != 9 || a.Zones[1].Remaining != 19 || a.Zones[2].Used == nil || *a.Zones[2].Used != 1 || a.Zones[3].InFlight == nil || *a.Zones[3].InFlight != 0 {
		t.Errorf("after one request: %+v, want remaining 9 and 19, used 1, none in flight", a.Zones)
	}
	calls := scriptsLogged(t, rs, "dave")
	if len(calls) != 2 || slices.ContainsFunc(calls, func(l string) bool { return strings.Contains(l, "first") || strings.Contains(l, "second") }) {
		t.Errorf("Redis ran %d scripts about the key, want 2 (the quota zone's, the slots' count; the rate zones' reads are PTTLs):\n%s", len(calls), strings.Join(calls, "\n"))
	}
	if len(trips) == 1 && (!strings.Contains(trips[0], "PTTL $16 tally:first:dave") || !strings.Contains(trips[0], "PTTL $17 tally:second:dave")) {
		t.Errorf("the rate zones' reads are not a PTTL each in the status's one pipeline: %s", trips[0])
	}
}

// A status directive naming a zone no rate_limit handler defines is
// refused when the config loads, the error naming its Caddyfile line.
func TestStatusEndpointUnknownZoneIsAConfigError(t *testing.T) {
	c := newCaddyInstance(t)
	caddyfile := c.Caddyfile("", `http:// {
	handle /rate_limit {
		rate_limit_status api_key nope
	}
	rate_limit {
		zone api_key {
			key {remote_host}
			events 10
			window 1m
		}
	}
	respond "ok"
}
`)
	line := 1 + strings.Count(caddyfile[:strings.Index(caddyfile, "rate_limit_status")], "\n")
	err := c.startProcess(caddyfile, "caddyfile")
	if want := fmt.Sprintf("Caddyfile:%d: rate_limit_status nope: no rate_limit handler of this config has a zone nope", line); err == nil || !strings.Contains(c.Output()+err.Error(), want) {
		t.Fatalf("Caddy started, or said otherwise: %v\n%s", err, tail(c.Output(), 10))
	}
}

// At a site's top level with a path matcher, the status directive runs
// before rate_limit (its place in Caddy's order): asking never counts.
func TestStatusEndpointAtTopLevelIsNotLimited(t *testing.T) {
	c := startCaddy(t, `http:// {
	rate_limit_status /rate_limit api_key
	rate_limit {
		zone api_key {
			key {http.request.header.X-API-Key}
			events 3
			window 1m
		}
	}
	respond "ok"
}
`)
	for i := range 5 {
		r := c.Do(request{Path: "/rate_limit", Header: map[string]string{"X-API-Key": "erin"}})
		if r.Status != http.StatusOK || !strings.Contains(r.Body, `"remaining":3,`) || r.Header.Get("RateLimit") != "" {
			t.Fatalf("ask %d: %d %q, RateLimit %q; want 200, remaining 3, no RateLimit header", i, r.Status, r.Body, r.Header.Get("RateLimit"))
		}
	}
	if n := admitted(c, withKey("erin"), 5); n != 3 {
		t.Errorf("after 5 asks: %d admitted, want the whole burst, 3", n)
	}
}

// rateLimitParam is parameter p of zone's item in a RateLimit or
// RateLimit-Policy header ("rate";r=4;t=12, "quota";r=3), false when absent.
func rateLimitParam(header, zone, p string) (int64, bool) {
	for item := range strings.SplitSeq(header, ",") {
		params := strings.Split(strings.TrimSpace(item), ";")
		if params[0] != strconv.Quote(zone) {
			continue
		}
		for _, kv := range params[1:] {
			if v, ok := strings.CutPrefix(kv, p+"="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// The one read agrees with the headers: in every zone kind, for a plain
// key and under a limit, an exempt and a deny override, the status
// handler's and the admin key view's remaining and limit are the RateLimit
// r and RateLimit-Policy q of the key's request, read while it is in flight
// (a concurrency zone's slot is held). A fresh key reads its whole limit.
func TestReadAgreesWithHeadersForEveryKindAndOverride(t *testing.T) {
	u := startCountingUpstream(t)
	c := startCaddy(t, `http:// {
	handle /rate_limit {
		rate_limit_status rate quota conc adapt
	}
	handle {
		rate_limit {
			zone rate {
				key {http.request.header.X-rate}
				events 5
				window 1m
			}
			zone quota {
				key {http.request.header.X-quota}
				quota 4 per day
			}
			zone conc {
				key {http.request.header.X-conc}
				concurrency 3
			}
			zone adapt {
				key {http.request.header.X-adapt}
				adaptive {
					latency 1s
					min 3
				}
			}
		}
		reverse_proxy `+u.Addr+`
	}
}
`)
	limits := map[string]string{"rate": `"events":50,"window":"1m"`, "quota": `"limit":40`, "conc": `"n":7`}
	zoneNames := []string{"rate", "quota", "conc", "adapt"}
	for zi, zone := range zoneNames {
		for _, kind := range []string{"plain", "limit", "exempt", "deny"} {
			key := zone + "-" + kind
			switch body := limits[zone]; {
			case kind == "limit" && body == "":
				continue // an adaptive zone's limit follows the upstream: no limit override
			case kind == "limit":
				mustPutOverride(t, c, zone, key, `{"match":{"key":"`+key+`"},`+body+`}`)
			case kind != "plain":
				mustPutOverride(t, c, zone, key, `{"match":{"key":"`+key+`"},"`+kind+`":true}`)
			}
			header := map[string]string{}
			for _, z := range zoneNames {
				header["X-"+z] = key
			}
			read := func() (status, admin, limit, adminLimit int64) {
				r := c.Do(request{Path: "/rate_limit", Header: header})
				var a statusAnswer
				if err := json.Unmarshal([]byte(r.Body), &a); err != nil || len(a.Zones) != 4 {
					t.Fatalf("%s: status %d %s", key, r.Status, r.Body)
				}
				var k struct {
					Remaining                  int64
					Events, Quota, Concurrency int64
				}
				if code, body := c.adminDo(http.MethodGet, keyPath(zone, key)); code != http.StatusOK || json.Unmarshal([]byte(body), &k) != nil {
					admin = -1
				} else {
					admin, adminLimit = k.Remaining, max(k.Events, k.Quota, k.Concurrency)
				}
				return a.Zones[zi].Remaining, admin, a.Zones[zi].Limit, adminLimit
			}
			if kind == "plain" {
				full := map[string]int64{"rate": 5, "quota": 4, "conc": 3, "adapt": 3}[zone]
				if s, _, limit, _ := read(); s != full || limit != full {
					t.Errorf("%s, a fresh key: status says %d of %d, want its whole limit %d", key, s, limit, full)
				}
			}
			var r response
			var status, admin, limit, adminLimit int64
			if kind == "deny" {
				r = c.Do(request{Header: header})
				status, admin, limit, adminLimit = read()
			} else {
				ch := inBackground(c, request{Path: "/?gate=" + key, Header: header})
				u.waitInFlight(1)
				status, admin, limit, adminLimit = read()
				u.open(key)
				r = <-ch
			}
			rem, ok1 := rateLimitParam(r.Header.Get("RateLimit"), zone, "r")
			q, ok2 := rateLimitParam(r.Header.Get("RateLimit-Policy"), zone, "q")
			if !ok1 || !ok2 || status != rem || admin != rem || limit != q || adminLimit != q {
				t.Errorf("%s (%d): status says %d of %d, the admin view %d of %d; the headers r=%d q=%d (RateLimit %q, policy %q)",
					key, r.Status, status, limit, admin, adminLimit, rem, q, r.Header.Get("RateLimit"), r.Header.Get("RateLimit-Policy"))
			}
		}
	}
}

// A status call of a strict rate zone's key with budget left costs Redis
// one command (the key's PTTL): 100 calls cost at most 120 commands, as
// INFO commandstats counts them (a script's own commands count too; the
// instance's heartbeat runs beside them).
func TestStatusCallsCostOneRedisCommandEach(t *testing.T) {
	rs := startRedis(t)
	c := startCaddy(t, `http:// {
	handle /rate_limit {
		rate_limit_status api_key
	}
	handle {
		rate_limit {
			zone api_key {
				key {http.request.header.X-API-Key}
				events 10
				window 1m
			}
			distributed {
				redis redis://`+rs.Addr+`
				timeout 1s
			}
		}
		respond "ok"
	}
}
`)
	if r := c.Do(withKey("frank")); r.Status != http.StatusOK {
		t.Fatalf("a request: %d", r.Status)
	}
	rc := rs.Client()
	if err := rc.ConfigResetStat(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		r := c.Do(request{Path: "/rate_limit", Header: map[string]string{"X-API-Key": "frank"}})
		if r.Status != http.StatusOK || !strings.Contains(r.Body, `"remaining":9,`) {
			t.Fatalf("status call %d: %d %s, want remaining 9", i, r.Status, r.Body)
		}
	}
	info, err := rc.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	var counted []string
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats %q: %v", line, err)
		}
		total += n
		counted = append(counted, name+"="+calls)
	}
	if total > 120 {
		t.Errorf("100 status calls cost Redis %d commands, want at most 120: %s", total, strings.Join(counted, " "))
	}
	t.Logf("100 status calls: %d Redis commands (%s)", total, strings.Join(counted, " "))
}

// A quota zone's key under a deny or exempt override still reads its use
// of the period and the period's bounds, in the status handler (used,
// window) and the admin key view (used, period_start, period_end), as
// without the override: the override decides, it does not erase the count.
func TestQuotaKeyUnderAnOverrideKeepsItsPeriodAndUse(t *testing.T) {
	c := startCaddy(t, statusSite(""))
	for _, kind := range []string{"deny", "exempt"} {
		key := "quota-" + kind
		for range 2 {
			if r := c.Do(request{Header: map[string]string{"X-API-Key": key}}); r.Status != http.StatusOK {
				t.Fatalf("%s: %d before the override", key, r.Status)
			}
		}
		mustPutOverride(t, c, "monthly", kind, `{"match":{"key":"`+key+`"},"`+kind+`":true}`)
		a := askStatus(t, c, key)
		if m := a.Zones[1]; m.Used == nil || *m.Used != 2 || m.Window < 28*86400 || m.Period != "month" {
			used := int64(-1) // absent
			if m.Used != nil {
				used = *m.Used
			}
			t.Errorf("%s: status of the quota zone: used %d, window %d, period %q; want used 2 of a month's window", key, used, m.Window, m.Period)
		}
		code, body := c.adminDo(http.MethodGet, keyPath("monthly", key))
		var k struct {
			Used        *int64 `json:"used"`
			PeriodStart string `json:"period_start"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &k) != nil || k.Used == nil || *k.Used != 2 ||
			!strings.HasPrefix(k.PeriodStart, time.Now().UTC().Format("2006-01")) {
			t.Errorf("%s: admin key view %d %s, want used 2 in this month's period", key, code, body)
		}
	}
}

// A concurrency zone's key under a deny override still reads the requests
// it holds in flight (in_flight in the status handler, in_use in the admin
// key view): the override refuses new ones, it does not end those.
func TestConcurrencyKeyUnderADenyKeepsItsInFlight(t *testing.T) {
	u := startCountingUpstream(t)
	c := startCaddy(t, `http:// {
	handle /rate_limit {
		rate_limit_status conc
	}
	handle {
		rate_limit {
			zone conc {
				key {http.request.header.X-K}
				concurrency 3
			}
		}
		reverse_proxy `+u.Addr+`
	}
}
`)
	h := map[string]string{"X-K": "held"}
	ch := inBackground(c, request{Path: "/?gate=held", Header: h})
	u.waitInFlight(1)
	mustPutOverride(t, c, "conc", "d", `{"match":{"key":"held"},"deny":true}`)
	r := c.Do(request{Path: "/rate_limit", Header: h})
	var a statusAnswer
	if err := json.Unmarshal([]byte(r.Body), &a); err != nil || len(a.Zones) != 1 || a.Zones[0].InFlight == nil || *a.Zones[0].InFlight != 1 || a.Zones[0].Remaining != 0 {
		t.Errorf("status of a key holding 1 slot under a deny: %s, want in_flight 1, remaining 0", r.Body)
	}
	if code, body := c.adminDo(http.MethodGet, keyPath("conc", "held")); code != http.StatusOK || !strings.Contains(body, `"in_use":1`) || !strings.Contains(body, `"remaining":0`) {
		t.Errorf("admin key view of a key holding 1 slot under a deny: %d %s, want in_use 1, remaining 0", code, body)
	}
	u.open("held")
	<-ch
}
