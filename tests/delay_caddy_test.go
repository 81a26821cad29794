package tests

// Delay (issue 25) through real Caddy processes: a request the zone would
// deny whose turn is within `delay` waits for it and is served then,
// measured where it arrives, at an upstream behind Caddy's reverse proxy.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// arrivals is an upstream that notes when each request arrives.
type arrivals struct {
	Addr string
	mu   sync.Mutex
	at   []time.Time
}

func startArrivals(t *testing.T) *arrivals {
	a := &arrivals{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.at = append(a.at, time.Now())
		a.mu.Unlock()
		w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	a.Addr = srv.Listener.Addr().String()
	return a
}

// take returns the arrivals so far, in order, and forgets them.
func (a *arrivals) take() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.at
	a.at = nil
	slices.SortFunc(out, func(x, y time.Time) int { return x.Compare(y) })
	return out
}

// checkSpacing fails unless the arrivals at the upstream keep the zone's
// rate, one per T (burst 1): over any stretch between two arrivals, at
// most 1 + ⌊(d + late)/T⌋ arrive. late is how late a loaded machine may
// serve a request after its turn (the test cannot see turns, only
// arrivals): a request served late shortens the gap after it, never the
// schedule, and nothing is ever served early. On a quiet machine every gap
// is T within a few ms (logged); beside a CPU hog under -race, wake-ups
// 120ms late were seen. A request served one turn early (an off-by-one),
// two served at one turn, or a rate of 2/T fail it.
func checkSpacing(t *testing.T, at []time.Time, T, late time.Duration) {
	t.Helper()
	minGap := time.Duration(1 << 62)
	for i := range at {
		for j := i + 1; j < len(at); j++ {
			d := at[j].Sub(at[i])
			if j == i+1 {
				minGap = min(minGap, d)
			}
			if n, most := j-i+1, 1+int((d+late)/T); n > most {
				t.Errorf("%d arrivals at the upstream within %v, want at most %d at one per %v (a request at most %v late); all: %v", n, d, most, T, late, offsets(at))
				return
			}
		}
	}
	if len(at) > 1 {
		t.Logf("%d arrivals, closest %v apart (T = %v): %v", len(at), minGap, T, offsets(at))
	}
}

// offsets are the arrivals as times after the first, for messages.
func offsets(at []time.Time) []time.Duration {
	var out []time.Duration
	for _, a := range at {
		out = append(out, a.Sub(at[0]).Round(time.Millisecond))
	}
	return out
}

// smoothZone is the zone, as written, with queue n.
func smoothZone(queue int) string {
	return fmt.Sprintf(`
	zone smooth {
		key {client_ip}
		events 5
		window 1s
		burst 1
		delay 3s            # a request that could pass within 3s waits for its turn
		queue %d           # at most %d requests of this zone waiting on this instance
	}`, queue, queue)
}

// delaySite is the zone keyed by X-API-Key, distributed through
// the Redis at addr with extra settings, in front of up.
func delaySite(addr, extra string, up *arrivals) string {
	return `http:// {
	rate_limit {` + strings.ReplaceAll(smoothZone(100), "{client_ip}", "{http.request.header.X-API-Key}") + `
		distributed {
			redis redis://` + addr + `
` + extra + `
		}
	}
	reverse_proxy ` + up.Addr + `
}
`
}

// goroutines is Caddy's goroutine count, from the admin API's pprof.
func goroutines(t *testing.T, c *caddyInstance) int {
	t.Helper()
	status, body := c.adminDo(http.MethodGet, "/debug/pprof/goroutine?debug=1")
	m := regexp.MustCompile(`goroutine profile: total (\d+)`).FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		t.Fatalf("GET /debug/pprof/goroutine: %d %.200s", status, body)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// The zone: 12 concurrent requests all get 200, the first at once
// and the others 200ms apart at the upstream; 25 concurrent from another
// client: 16 ± 1 served, the rest denied with a Retry-After; with queue 3,
// at most 3 wait at once. A delayed response has the headers of an allowed
// one, and the access log says how long it waited.
func TestDelayServesABurstAtTheZonesRate(t *testing.T) {
	t.Parallel()
	up := startArrivals(t)
	c := startCaddyWith(t, "metrics", `http:// {
	log {
		output stderr
		format json
	}
	log_append delay {http.rate_limit.delay}
	rate_limit /api/* {`+smoothZone(100)+`
		headers ietf
	}
	rate_limit /small/* {`+strings.ReplaceAll(smoothZone(3), "smooth", "small")+`
	}
	reverse_proxy `+up.Addr+`
}
`)
	start := time.Now()
	var mu sync.Mutex
	var delayed []response
	got := c.SendConcurrently(12, 12, request{Path: "/api/x"}, func(r response) {
		mu.Lock()
		delayed = append(delayed, r)
		mu.Unlock()
	})
	if got[200] != 12 {
		t.Fatalf("12 concurrent: %v, want 12×200", got)
	}
	at := up.take()
	if len(at) != 12 {
		t.Fatalf("%d arrivals at the upstream, want 12", len(at))
	}
	if first := at[0].Sub(start); first > 150*time.Millisecond {
		t.Errorf("the first request arrived %v after the burst started, want at once", first)
	}
	checkSpacing(t, at, 200*time.Millisecond, 150*time.Millisecond)
	if span := at[11].Sub(at[0]); span > 2500*time.Millisecond {
		t.Errorf("12 requests took %v to arrive, want ~2.2s (11 intervals)", span)
	}
	for _, r := range delayed {
		if r.Header.Get("Retry-After") != "" || !strings.HasPrefix(r.Header.Get("RateLimit"), `"smooth";r=`) {
			t.Errorf("a served response's headers: RateLimit %q Retry-After %q, want an allowed one's", r.Header.Get("RateLimit"), r.Header.Get("Retry-After"))
		}
	}
	// Requests that did not wait log "delay":null (the placeholder is
	// set only on those that did).
	logged := regexp.MustCompile(`"delay":([0-9.e-]+)`)
	waitFor(t, 5*time.Second, "the access log to tell the delays", func() bool {
		return len(logged.FindAllString(c.Output(), -1)) >= 11
	})
	var waits []float64
	for _, m := range logged.FindAllStringSubmatch(c.Output(), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		waits = append(waits, v)
	}
	slices.Sort(waits)
	if len(waits) != 11 || waits[10] < 2.0 || waits[10] > 2.5 || waits[0] < 0.1 || waits[0] > 0.4 {
		t.Errorf("access log delays %v, want 11 from ~0.2s to ~2.2s", waits)
	}
	var list []struct {
		Name    string `json:"name"`
		Delay   string `json:"delay"`
		Queue   int64  `json:"queue"`
		Waiting *int64 `json:"waiting"`
	}
	c.adminJSON("/rate_limit/zones", &list)
	for _, z := range list {
		if z.Name == "smooth" && (z.Delay != "3s" || z.Queue != 100 || z.Waiting == nil || *z.Waiting != 0) {
			t.Errorf("GET /rate_limit/zones: smooth delay %q queue %d waiting %v, want 3s, 100 and 0", z.Delay, z.Queue, z.Waiting)
		}
	}
	if row := rateLimitCLI(t, c, "zones").ok(t, "caddy rate-limit zones"); !strings.Contains(strings.Join(row, "\n"), "5/1s delay 3s") {
		t.Errorf("caddy rate-limit zones shows no delay for smooth:\n%s", strings.Join(row, "\n"))
	}
	samples := c.scrape()
	if n, _ := metricValue(samples, "caddy_rate_limit_delay_seconds_count", map[string]string{"zone": "smooth"}); n != 11 {
		t.Errorf("caddy_rate_limit_delay_seconds_count %v, want 11", n)
	}
	if n, ok := metricValue(samples, "caddy_rate_limit_waiting", map[string]string{"zone": "smooth"}); !ok || n != 0 {
		t.Errorf("caddy_rate_limit_waiting %v (%v) after every wait ended, want 0", n, ok)
	}

	// 25 at once from another address: 1 at once and 15 within 3s.
	other := clientFrom(t, "127.0.0.2")
	var retries []string
	got = c.SendConcurrently(25, 25, request{Path: "/api/x", Client: other}, func(r response) {
		if r.Status == 429 {
			mu.Lock()
			retries = append(retries, r.Header.Get("Retry-After"))
			mu.Unlock()
		}
	})
	if got[200] < 15 || got[200] > 17 || got[200]+got[429] != 25 {
		t.Errorf("25 concurrent: %v, want 16 ± 1 served, the rest 429", got)
	}
	for _, ra := range retries {
		if n, err := strconv.Atoi(ra); err != nil || n < 1 {
			t.Errorf("a denial's Retry-After %q, want whole seconds >= 1", ra)
		}
	}
	checkSpacing(t, up.take(), 200*time.Millisecond, 150*time.Millisecond)

	// queue 3: 10 at once from a third address: 1 at once, 3 waiting, 6
	// denied for the full queue although their turns were within 3s.
	third := clientFrom(t, "127.0.0.3")
	most := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if n, _ := metricValue(c.scrape(), "caddy_rate_limit_waiting", map[string]string{"zone": "small"}); int(n) > most {
				most = int(n)
			}
		}
	}()
	got = c.SendConcurrently(10, 10, request{Path: "/small/x", Client: third}, nil)
	<-done
	if got[200] != 4 || got[429] != 6 {
		t.Errorf("queue 3, 10 concurrent: %v, want 4×200 (1 at once, 3 waiting) and 6×429", got)
	}
	if most > 3 || most == 0 {
		t.Errorf("caddy_rate_limit_waiting reached %d, want 1 to 3", most)
	}
	if n, _ := metricValue(c.scrape(), "caddy_rate_limit_queue_full_total", map[string]string{"zone": "small"}); n != 6 {
		t.Errorf("caddy_rate_limit_queue_full_total %v, want 6", n)
	}
	up.take()
}

// A client that goes away while waiting gives its slot back: the next
// request is served one interval earlier than it would have been, and no
// goroutine is left behind.
func TestDelayClientThatLeavesGivesItsTurnBack(t *testing.T) {
	t.Parallel()
	up := startArrivals(t)
	c := startCaddyWith(t, "metrics", `http:// {
	rate_limit {
		zone slow {
			key {client_ip}
			events 1
			window 2s
			burst 1
			delay 5s
		}
	}
	reverse_proxy `+up.Addr+`
}
`)
	if res := c.Do(request{}); res.Status != 200 { // at once; the next turn is 2s away
		t.Fatalf("first: %d", res.Status)
	}
	// Counted with the client's connection and the proxy's to the
	// upstream open, which the third request reuses.
	base := goroutines(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/", nil)
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("the second request was answered (%d) before its turn", res.StatusCode)
	}
	cancel()
	waitFor(t, 1500*time.Millisecond, "the waiting request to end before its turn", func() bool {
		n, _ := metricValue(c.scrape(), "caddy_rate_limit_waiting", map[string]string{"zone": "slow"})
		return n == 0
	})
	// Its turn (2s after the first) is free again: the third request takes
	// it, instead of the one after (4s).
	res := c.Do(request{})
	at := up.take()
	if res.Status != 200 || len(at) != 2 {
		t.Fatalf("third: %d, %d arrivals, want 200 and 2 (the second never reached the upstream)", res.Status, len(at))
	}
	if d := at[1].Sub(at[0]); d < 1900*time.Millisecond || d > 3*time.Second {
		t.Errorf("third request served %v after the first, want its turn 2s after it (4s if the slot was not given back)", d)
	}
	waitFor(t, 5*time.Second, "Caddy's goroutines back to where they were", func() bool {
		return goroutines(t, c) <= base+1
	})
}

// A reload while requests wait: every one is answered (served at its turn
// by the config that admitted it), none gets a 5xx, and Caddy's goroutines
// come back to where they were.
func TestDelayWaitsEndCleanlyAcrossAReload(t *testing.T) {
	t.Parallel()
	up := startArrivals(t)
	site := func(gen int) string {
		return `http:// {
	header X-Gen ` + strconv.Itoa(gen) + `
	rate_limit {` + smoothZone(100) + `
	}
	reverse_proxy ` + up.Addr + `
}
`
	}
	c := startCaddyWith(t, "metrics", site(1))
	base := goroutines(t, c)
	results := make(chan statusCounts, 1)
	go func() { results <- c.SendConcurrently(10, 10, request{}, nil) }()
	waitFor(t, 3*time.Second, "requests to wait for their turn", func() bool {
		n, _ := metricValue(c.scrape(), "caddy_rate_limit_waiting", map[string]string{"zone": "smooth"})
		return n >= 5
	})
	load(t, c, "metrics", site(2))
	var got statusCounts
	select {
	case got = <-results:
	case <-time.After(10 * time.Second):
		t.Fatal("requests waiting across the reload were not answered within 10s")
	}
	if got[200] != 10 {
		t.Errorf("10 requests waiting across a reload: %v, want 10×200", got)
	}
	checkSpacing(t, up.take(), 200*time.Millisecond, 150*time.Millisecond)
	waitFor(t, 5*time.Second, "Caddy's goroutines back to where they were", func() bool {
		return goroutines(t, c) <= base+4
	})
}

// Strict mode, 3 instances, one key, 30 concurrent requests: the fleet
// serves the key at its rate and admits exactly the 16 whose turn was
// within the delay. The turns are Redis's, one emission interval apart; an
// instance serves a request when Redis's answer has arrived and the wait
// it gave has passed, so two requests are served T less the difference of
// their answers' one-way latencies apart (a few ms on loopback), or less
// when a loaded machine serves the first late (checkSpacing). The timeout
// is long so that a slow answer under -race never goes to the fail policy,
// which would decide it at this instance's share instead.
func TestDelayStrictFleetServesOneKeyAtItsRate(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	up := startArrivals(t)
	site := delaySite(srv.Addr, "\t\t\ttimeout 2s", up)
	fleet := []*caddyInstance{startCaddy(t, site), startCaddy(t, site), startCaddy(t, site)}
	decided := monitorKey(t, srv.Addr, "tally:smooth:fleet")
	got := sendAcross(t, fleet, 30, 30, withKey("fleet"), 5*time.Second)
	// A decision made s after the first has its turn s later too: a
	// loaded machine that spreads the 30 decisions over s admits one more
	// per 200 ms of s.
	at, spread := decided(), time.Duration(0)
	if len(at) > 0 {
		spread = at[len(at)-1].Sub(at[0])
	}
	t.Logf("%d commands on the key in Redis within %v", len(at), spread)
	if most := 1 + int((3*time.Second+spread)/(200*time.Millisecond)); got[200] < 16 || got[200] > most || got[200]+got[429] != 30 {
		t.Errorf("30 concurrent across 3 instances, decided within %v: %v, want 16×200 (1 at once, 15 within 3s; at most %d at this spread) and the rest 429", spread, got, most)
	}
	at = up.take()
	checkSpacing(t, at, 200*time.Millisecond, 150*time.Millisecond)
	if n := len(at); n == got[200] && n > 1 {
		want := time.Duration(n-1) * 200 * time.Millisecond
		if span := at[n-1].Sub(at[0]); span < want-100*time.Millisecond || span > want+300*time.Millisecond {
			t.Errorf("%d served over %v, want %v (%d intervals)", n, span, want, n-1)
		}
	}
}

// monitorKey notes, by Redis's MONITOR, when the Redis at addr runs each
// client command that names key, until the returned func is called, which
// returns the times in order.
func monitorKey(t *testing.T, addr, key string) (stop func() []time.Time) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}
	const end = "monitorKey-end"
	var at []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			line, err := r.ReadString('\n')
			if err != nil || strings.Contains(line, end) {
				return
			}
			// +<seconds>.<µs> [<db> <client>] "<command>" "<arg>"...; a
			// script's own calls show as [<db> lua].
			f := strings.Fields(strings.TrimPrefix(line, "+"))
			if len(f) < 3 || f[2] == "lua]" || !strings.Contains(line, `"`+key+`"`) {
				continue
			}
			sec, usec, _ := strings.Cut(f[0], ".")
			s, err1 := strconv.ParseInt(sec, 10, 64)
			us, err2 := strconv.ParseInt(usec, 10, 64)
			if err1 == nil && err2 == nil {
				at = append(at, time.Unix(s, us*1000))
			}
		}
	}()
	return func() []time.Time {
		t.Helper()
		// Every decision was answered: an ECHO sent now shows after them.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "ECHO %s\r\n", end)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("MONITOR did not show the ECHO sent after the decisions within 10s")
		}
		slices.SortFunc(at, func(x, y time.Time) int { return x.Compare(y) })
		return at
	}
}

// A flood of waiting requests costs bounded memory: with queue 50, 200
// concurrent requests whose turns are all within the delay: never more than
// 50 wait on the instance, and every denial is one of a full queue.
// (Without queue the default, 1000, holds the same way: zones'
// TestDelayTenThousandRequestsWaitAtMostTheDefaultQueue.)
func TestDelayFloodIsBoundedByTheQueue(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "metrics", `http:// {
	rate_limit {
		zone flood {
			key {client_ip}
			events 10
			window 1s
			burst 1
			delay 30s
			queue 50
		}
	}
	respond "ok"
}
`)
	most := 0.0
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if n, _ := metricValue(c.scrape(), "caddy_rate_limit_waiting", map[string]string{"zone": "flood"}); n > most {
				most = n
			}
		}
	}()
	got := c.SendConcurrently(200, 200, request{}, nil)
	close(stop)
	<-polled
	full, _ := metricValue(c.scrape(), "caddy_rate_limit_queue_full_total", map[string]string{"zone": "flood"})
	if got[200] < 51 || got[200]+got[429] != 200 || float64(got[429]) != full {
		t.Errorf("200 concurrent, queue 50: %v with %v denied for a full queue, want at least 51×200 and every 429 a full queue's", got, full)
	}
	if most > 50 || most < 40 {
		t.Errorf("caddy_rate_limit_waiting peaked at %v, want the queue (50) filled and never passed", most)
	}
}

// Async mode through Caddy: the zone on one async instance serves
// 12 concurrent requests at its rate, from the key's lease and the turns
// reserved beyond it, and Redis counts the reservations at the next sync,
// while the requests still wait: the admin GET (which reads Redis) finds
// the key busy for about the 12 turns' 2.4s.
func TestDelayAsyncServesABurstAtTheZonesRate(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	up := startArrivals(t)
	c := startCaddy(t, delaySite(srv.Addr, "\t\t\tmode async\n\t\t\tsync_interval 100ms", up))
	start := time.Now()
	results := make(chan statusCounts, 1)
	go func() { results <- c.SendConcurrently(12, 12, withKey("async"), nil) }()
	waitFor(t, 2*time.Second, "Redis to count the reservations", func() bool {
		var k adminKey
		status, body := c.adminDo(http.MethodGet, keyPath("smooth", "async"))
		// 404 until the first sync writes the key.
		return status == http.StatusOK && json.Unmarshal([]byte(body), &k) == nil &&
			k.ResetAfter >= 2.4-time.Since(start).Seconds()-0.3
	})
	if got := <-results; got[200] != 12 {
		t.Fatalf("12 concurrent on one async instance: %v, want 12×200", got)
	}
	checkSpacing(t, up.take(), 200*time.Millisecond, 150*time.Millisecond)
}
