package tests

// Concurrency zones through real Caddy processes in front of a real upstream
// that counts the requests it has in flight, locally and across instances
// sharing one real redis-server: the limit holds, slots are released whatever
// ends the request, a dead instance's slots end with their lease, renewals
// keep long requests' slots, and each fail policy holds through an outage.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingUpstream is an HTTP server on loopback that counts the requests it
// is serving at once. What a request does depends on its query:
//
//	gather=<n>   first wait (up to 5s) until n requests are in flight, unless
//	             an earlier request saw that many
//	hold=<d>     then hold the response for d
//	gate=<name>  or hold it until open(name) (or the client goes away)
//
// A request with "Upgrade: tally-test" is hijacked and echoes lines until
// the connection closes.
type countingUpstream struct {
	t        *testing.T
	Addr     string
	inFlight atomic.Int64
	peak     atomic.Int64
	gathered atomic.Bool // a gather target was reached: later requests skip it

	mu    sync.Mutex
	gates map[string]chan struct{}
}

func startCountingUpstream(t *testing.T) *countingUpstream {
	u := &countingUpstream{t: t, gates: map[string]chan struct{}{}}
	srv := httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(srv.Close)
	t.Cleanup(u.openAll) // let held handlers return before srv.Close waits for them
	u.Addr = srv.Listener.Addr().String()
	return u
}

func (u *countingUpstream) gate(name string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	g, ok := u.gates[name]
	if !ok {
		g = make(chan struct{})
		u.gates[name] = g
	}
	return g
}

// open lets the requests held at gate name go.
func (u *countingUpstream) open(name string) { close(u.gate(name)) }

func (u *countingUpstream) openAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for name, g := range u.gates {
		select {
		case <-g:
		default:
			close(g)
		}
		delete(u.gates, name)
	}
}

func (u *countingUpstream) serve(w http.ResponseWriter, r *http.Request) {
	n := u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
	}
	q := r.URL.Query()
	if g, _ := strconv.Atoi(q.Get("gather")); g > 0 && !u.gathered.Load() {
		deadline := time.Now().Add(5 * time.Second)
		for u.inFlight.Load() < int64(g) && !u.gathered.Load() && time.Now().Before(deadline) && r.Context().Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
		if u.inFlight.Load() >= int64(g) {
			u.gathered.Store(true)
		}
	}
	if d, err := time.ParseDuration(q.Get("hold")); err == nil {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
	}
	if name := q.Get("gate"); name != "" {
		select {
		case <-u.gate(name):
		case <-r.Context().Done():
		}
	}
	if r.Header.Get("Upgrade") == "tally-test" {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			u.t.Errorf("hijacking: %v", err)
			return
		}
		defer conn.Close()
		fmt.Fprint(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tally-test\r\n\r\n")
		_ = rw.Flush()
		for {
			line, err := rw.ReadString('\n')
			if err != nil {
				return
			}
			fmt.Fprint(rw, line)
			_ = rw.Flush()
		}
	}
	fmt.Fprint(w, "ok")
}

// waitInFlight waits until the upstream serves exactly n requests.
func (u *countingUpstream) waitInFlight(n int64) {
	u.t.Helper()
	waitFor(u.t, 10*time.Second, fmt.Sprintf("%d requests in flight at the upstream", n), func() bool {
		return u.inFlight.Load() == n
	})
}

// concurrencySite is a site whose rate_limit has the given zones (and
// extra handler options) in front of the upstream.
func concurrencySite(u *countingUpstream, zones, extra string) string {
	return `http:// {
	rate_limit {
` + zones + `
` + extra + `
	}
	reverse_proxy ` + u.Addr + `
}
`
}

const uploadsZone = `
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 5
		}`

// inBackground sends r to c from a goroutine; the response arrives on the
// channel, with Status 0 when the request failed.
func inBackground(c *caddyInstance, r request) <-chan response {
	ch := make(chan response, 1)
	go func() {
		res, _ := c.try(r)
		ch <- res
	}()
	return ch
}

func keyRequest(key, path string) request {
	return request{Path: path, Header: map[string]string{"X-API-Key": key}}
}

// checkConcurrencyBurst sends 64 concurrent slow requests for one key
// (across fleet, round robin) to a zone of concurrency 5 and checks that the
// upstream saw exactly 5 at once and never more.
func checkConcurrencyBurst(t *testing.T, fleet []*caddyInstance, u *countingUpstream) {
	t.Helper()
	var bad atomic.Value
	r := keyRequest("alice", "/slow?gather=5&hold=300ms")
	counts := sendConcurrently(t, 64, 64, func(i int) (response, error) {
		return fleet[i%len(fleet)].try(r)
	}, func(res response) {
		policy := res.Header.Get("RateLimit-Policy")
		if policy != `"uploads";q=5;qu="concurrent-requests"` {
			bad.Store(fmt.Sprintf("RateLimit-Policy %q", policy))
		}
		if res.Status == 429 && (res.Header.Get("Retry-After") != "1" || !strings.HasPrefix(res.Header.Get("RateLimit"), `"uploads";r=0`)) {
			bad.Store(fmt.Sprintf("denial with Retry-After %q, RateLimit %q", res.Header.Get("Retry-After"), res.Header.Get("RateLimit")))
		}
	})
	if counts[200] < 5 || counts[200]+counts[429] != 64 {
		t.Errorf("64 concurrent requests at concurrency 5: %v, want at least 5×200 and the rest 429", counts)
	}
	if p := u.peak.Load(); p != 5 {
		t.Errorf("the upstream saw at most %d requests of one key at once, want exactly 5", p)
	}
	if b := bad.Load(); b != nil {
		t.Errorf("bad headers: %v", b)
	}
}

func TestConcurrencyZoneAdmitsAtMostNInFlight(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	c := startCaddyWith(t, "metrics", concurrencySite(u, uploadsZone, ""))
	checkConcurrencyBurst(t, []*caddyInstance{c}, u)

	// Every slot is free again: the key leaves the table, the gauge is 0,
	// and 5 requests fit at once again.
	waitFor(t, 5*time.Second, "the key to hold no slot", func() bool {
		status, _ := c.adminDo(http.MethodGet, keyPath("uploads", "alice"))
		return status == http.StatusNotFound
	})
	if v, ok := metricValue(c.scrape(), "caddy_rate_limit_in_flight", map[string]string{"zone": "uploads"}); !ok || v != 0 {
		t.Errorf("caddy_rate_limit_in_flight{zone=uploads} = %v (present %v), want 0", v, ok)
	}
	u.peak.Store(0)
	u.gathered.Store(false)
	counts := c.SendConcurrently(5, 5, keyRequest("alice", "/slow?gather=5&hold=100ms"), nil)
	if counts[200] != 5 {
		t.Fatalf("5 requests after the burst: %v, want 5×200", counts)
	}
}

func TestConcurrencyZoneAdmitsAtMostNInFlightAcrossThreeInstances(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"strict", "async"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			rs := startRedis(t)
			u := startCountingUpstream(t)
			// A 2s timeout: this test is about Redis's exactness; with the
			// default 20ms a loaded machine would hand some acquisitions to
			// fail_policy local, which admits this instance's share on top
			// of Redis's slots. Async mode takes its slots in Redis too.
			site := concurrencySite(u, uploadsZone, `
		distributed {
			redis redis://`+rs.Addr+`
			mode `+mode+`
			timeout 2s
		}`)
			fleet := []*caddyInstance{startCaddy(t, site), startCaddy(t, site), startCaddy(t, site)}
			checkConcurrencyBurst(t, fleet, u)

			rc := rs.Client()
			waitFor(t, 5*time.Second, "the key's slots to leave Redis", func() bool {
				n, err := rc.Exists(context.Background(), "tally:uploads:alice").Result()
				return err == nil && n == 0
			})
			rs.requireEveryKeyExpires(t, 1) // the instances set is left
		})
	}
}

// The slots of an instance killed with requests in flight stay taken until
// their lease ends, then free; the other instances serve other keys
// meanwhile.
func TestConcurrencySlotsOfAKilledInstanceFreeWithinTheLease(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	rs := startRedis(t)
	u := startCountingUpstream(t)
	site := concurrencySite(u, `
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 2
			lease 3s
		}`, `
		distributed {
			redis redis://`+rs.Addr+`
			timeout 2s
		}`)
	a, b := startCaddy(t, site), startCaddy(t, site)
	for range 2 {
		inBackground(a, keyRequest("alice", "/held?gate=never"))
	}
	u.waitInFlight(2)
	if res := b.Do(keyRequest("alice", "/fast")); res.Status != 429 {
		t.Fatalf("a third request of alice on the other instance: %d, want 429", res.Status)
	}

	a.Stop()
	killed := time.Now()
	// The last renewal was at most lease/3 before the kill, so the slots
	// are still taken for at least 2/3 of the lease.
	if res := b.Do(keyRequest("alice", "/fast")); res.Status != 429 && time.Since(killed) < lease/2 {
		t.Fatalf("just after the kill, alice on the other instance: %d, want 429 (the slots are leased)", res.Status)
	}
	for {
		if res := b.Do(keyRequest("bob", "/fast")); res.Status != 200 {
			t.Fatalf("bob on the surviving instance: %d, want 200", res.Status)
		}
		if res := b.Do(keyRequest("alice", "/fast")); res.Status == 200 {
			break
		}
		if waited := time.Since(killed); waited > lease+time.Second {
			t.Fatalf("alice still denied %v after the instance holding her slots died (lease %v)", waited, lease)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("slots freed %v after the kill (lease %v)", time.Since(killed).Round(time.Millisecond), lease)
}

// A request longer than the lease keeps its slot (its instance renews it),
// and releases it as soon as it ends.
func TestConcurrencyLongRequestKeepsItsSlotPastTheLease(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	u := startCountingUpstream(t)
	site := concurrencySite(u, `
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 1
			lease 1s
		}`, `
		distributed {
			redis redis://`+rs.Addr+`
			timeout 2s
		}`)
	a, b := startCaddy(t, site), startCaddy(t, site)
	long := inBackground(a, keyRequest("alice", "/held?gate=long"))
	u.waitInFlight(1)
	start := time.Now()
	for time.Since(start) < 3500*time.Millisecond { // three and a half leases
		if res := b.Do(keyRequest("alice", "/fast")); res.Status != 429 {
			t.Fatalf("%v into a request holding alice's only slot, another got %d, want 429", time.Since(start).Round(time.Millisecond), res.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	u.open("long")
	if res := <-long; res.Status != 200 {
		t.Fatalf("the long request: %d, want 200", res.Status)
	}
	// The slot must leave Redis by a release, before its lease ends: read
	// when the lease ends, then compare with Redis's clock once it is gone.
	ctx := context.Background()
	rc := rs.Client()
	var leaseEnd float64
	if z, err := rc.ZRangeWithScores(ctx, "tally:uploads:alice", 0, -1).Result(); err == nil && len(z) == 1 {
		leaseEnd = z[0].Score
	}
	waitFor(t, 5*time.Second, "alice's slot to leave Redis", func() bool {
		return rc.Exists(ctx, "tally:uploads:alice").Val() == 0
	})
	if now := rc.Time(ctx).Val(); leaseEnd > 0 && float64(now.UnixMilli()) >= leaseEnd {
		t.Errorf("the slot left Redis when its lease ended (%v late), not when its request ended", time.Duration(float64(now.UnixMilli())-leaseEnd)*time.Millisecond)
	}
	if res := b.Do(keyRequest("alice", "/fast")); res.Status != 200 {
		t.Fatalf("alice after her long request ended: %d, want 200", res.Status)
	}
}

// Whatever ends the request, its slot is released: a client that goes away,
// an error from a later handler, an upgraded (hijacked) connection closing.
func TestConcurrencySlotIsReleasedHoweverTheRequestEnds(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	c := startCaddy(t, `http:// {
	rate_limit {
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 1
		}
	}
	handle /boom {
		error "boom" 500
	}
	handle {
		reverse_proxy `+u.Addr+`
	}
}
`)
	alice := keyRequest("alice", "/fast")
	requireFree := func(what string) {
		t.Helper()
		waitFor(t, 3*time.Second, "alice's slot to be free after "+what, func() bool {
			return c.Do(alice).Status == 200
		})
	}

	t.Run("client gone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/held?gate=never", nil)
		req.Header.Set("X-API-Key", "alice")
		done := make(chan error, 1)
		go func() {
			_, err := c.client.Do(req)
			done <- err
		}()
		u.waitInFlight(1)
		if res := c.Do(alice); res.Status != 429 {
			t.Fatalf("while alice's request runs: %d, want 429", res.Status)
		}
		cancel()
		<-done
		requireFree("the client went away")
	})

	t.Run("error", func(t *testing.T) {
		for i := range 3 {
			if res := c.Do(keyRequest("alice", "/boom")); res.Status != 500 {
				t.Fatalf("error request %d: %d, want 500 (a 429 means the previous one kept its slot)", i+1, res.Status)
			}
		}
		requireFree("errors")
	})

	t.Run("hijacked connection", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(c.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: localhost\r\nX-API-Key: alice\r\nConnection: Upgrade\r\nUpgrade: tally-test\r\n\r\n")
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v, want 101", res, err)
		}
		fmt.Fprint(conn, "ping\n")
		if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo through the upgraded connection: %q %v", line, err)
		}
		if res := c.Do(alice); res.Status != 429 {
			t.Fatalf("while alice's upgraded connection is open: %d, want 429", res.Status)
		}
		conn.Close()
		requireFree("the upgraded connection closed")
	})
}

// A client that sends one byte of its body and then nothing holds its slot
// for as long as the upstream waits for the rest: until a server timeout
// ends the read. With `timeouts { read_body_idle 1s }` (Caddy's default is
// 1m, reset on every read) the slot frees once the read has stalled for 1s.
func TestStalledUploadHoldsItsSlotUntilTheServersBodyTimeout(t *testing.T) {
	t.Parallel()
	var reading atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reading.Add(1)
		defer reading.Add(-1)
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	c := startCaddyWith(t, `	servers {
		timeouts {
			read_body_idle 1s
		}
	}`, `http:// {
	rate_limit {
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 1
		}
	}
	reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
}
`)
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /upload HTTP/1.1\r\nHost: localhost\r\nX-API-Key: alice\r\nContent-Length: 10\r\n\r\nA")
	waitFor(t, 5*time.Second, "the upstream to be reading the stalled body", func() bool { return reading.Load() == 1 })
	if res := c.Do(keyRequest("alice", "/")); res.Status != 429 {
		t.Fatalf("while alice's upload is stalled: %d, want 429 (its slot is held)", res.Status)
	}
	waitFor(t, 10*time.Second, "the stalled upload's slot to be freed by read_body_idle", func() bool {
		return c.Do(keyRequest("alice", "/")).Status == 200
	})
}

// A request's slot is given back when its handlers return also when the
// handler has a post-charged zone (count or charge), whose path charges
// after the response: one request after another, all pass.
func TestConcurrencySlotIsFreedBesideAPostChargedZone(t *testing.T) {
	t.Parallel()
	for _, post := range []string{
		`count {
				status 401
			}`,
		`charge {http.response.header.X-Tokens}`,
	} {
		c := startCaddy(t, `http:// {
	rate_limit {
		zone one_at_a_time {
			key {http.request.header.X-API-Key}
			concurrency 1
		}
		zone post_charged {
			key {http.request.header.X-API-Key}
			events 100
			window 1h
			`+post+`
		}
	}
	respond "ok"
}
`)
		if got := c.Send(5, withKey("alice")); fmt.Sprint(got) != "[200 200 200 200 200]" {
			t.Errorf("5 requests one after another with concurrency 1 beside %q: %v, want every one allowed (a 429 is a slot never given back)", post, got)
		}
	}
}

// With two concurrency zones, a request the later one denies gives back the
// slot the earlier one gave it, at once.
func TestConcurrencyDeniedByALaterZoneReleasesItsSlot(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	c := startCaddyWith(t, "metrics", concurrencySite(u, `
		zone per_key {
			key {http.request.header.X-API-Key}
			concurrency 1
		}
		zone global {
			key everyone
			concurrency 3
		}`, ""))
	var held []<-chan response
	for _, k := range []string{"alice", "bob", "carol"} {
		held = append(held, inBackground(c, keyRequest(k, "/held?gate=g")))
	}
	u.waitInFlight(3)
	res := c.Do(keyRequest("dave", "/fast"))
	if res.Status != 429 {
		t.Fatalf("a 4th key while global's 3 slots are held: %d, want 429", res.Status)
	}
	if got := res.Header.Get("RateLimit"); got != `"per_key";r=1, "global";r=0;t=1` {
		t.Errorf("RateLimit %q: per_key's slot should be back (r=1), global full", got)
	}
	if status, body := c.adminDo(http.MethodGet, keyPath("per_key", "dave")); status != http.StatusNotFound {
		t.Fatalf("dave, denied by global, still holds a per_key slot: %d %s", status, body)
	}
	samples := c.scrape()
	for zone, want := range map[string]float64{"per_key": 3, "global": 3} {
		if v, _ := metricValue(samples, "caddy_rate_limit_in_flight", map[string]string{"zone": zone}); v != want {
			t.Errorf("caddy_rate_limit_in_flight{zone=%q} = %v, want %v", zone, v, want)
		}
	}
	var slots struct {
		InUse       int64 `json:"in_use"`
		Concurrency int64 `json:"concurrency"`
	}
	c.adminJSON(keyPath("global", "everyone"), &slots)
	if slots.InUse != 3 || slots.Concurrency != 3 {
		t.Errorf("GET global/everyone: %+v, want in_use 3 of 3", slots)
	}
	u.open("g")
	for _, ch := range held {
		if res := <-ch; res.Status != 200 {
			t.Errorf("held request: %d, want 200", res.Status)
		}
	}
	waitFor(t, 3*time.Second, "dave to be admitted", func() bool { return c.Do(keyRequest("dave", "/fast")).Status == 200 })
}

// Redis goes away with a slot held and comes back: each fail policy behaves
// as documented meanwhile, and afterwards the slot still running is counted
// again, none taken during the outage is, and none is left behind.
func TestConcurrencyFailPoliciesWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	u := startCountingUpstream(t)
	site := concurrencySite(u, `
		zone local_zone {
			match {
				path /local/*
			}
			key {http.request.header.X-API-Key}
			concurrency 4
			lease 3s
		}
		zone open_zone {
			match {
				path /open/*
			}
			key {http.request.header.X-API-Key}
			concurrency 1
			fail_policy open
		}
		zone closed_zone {
			match {
				path /closed/*
			}
			key {http.request.header.X-API-Key}
			concurrency 1
			fail_policy closed
		}`, `
		distributed {
			redis redis://`+rs.Addr+`
			timeout 500ms
		}`)
	a, b := startCaddy(t, site), startCaddy(t, site)
	for _, c := range []*caddyInstance{a, b} {
		waitFor(t, 10*time.Second, "both instances to see each other", func() bool {
			_, n := zoneStore(t, c, "local_zone")
			return n == 2
		})
	}
	pre := inBackground(a, keyRequest("alice", "/local/x?gate=pre"))
	u.waitInFlight(1)

	rs.Kill()
	var outage []<-chan response
	// closed: denied on both instances, Retry-After 1.
	for _, c := range []*caddyInstance{a, b} {
		res := c.Do(keyRequest("alice", "/closed/x"))
		if res.Status != 429 || res.Header.Get("Retry-After") != "1" {
			t.Errorf("fail_policy closed during the outage: %d Retry-After %q, want 429 and 1", res.Status, res.Header.Get("Retry-After"))
		}
	}
	// open: three at once for a key of concurrency 1.
	for range 3 {
		outage = append(outage, inBackground(a, keyRequest("alice", "/open/x?gate=outage")))
	}
	u.waitInFlight(4)
	// local: each of the 2 instances admits ⌊4/2⌋ = 2 of its own; the slot
	// held in Redis before the outage is not among them.
	inFlight := int64(4)
	for _, c := range []*caddyInstance{a, b} {
		for range 2 {
			outage = append(outage, inBackground(c, keyRequest("alice", "/local/x?gate=outage")))
			inFlight++
			u.waitInFlight(inFlight)
		}
		if res := c.Do(keyRequest("alice", "/local/x")); res.Status != 429 {
			t.Errorf("a 3rd request on one instance under fail_policy local (share 2): %d, want 429", res.Status)
		}
	}
	u.open("outage")
	for _, ch := range outage {
		if res := <-ch; res.Status != 200 {
			t.Errorf("a request admitted during the outage: %d, want 200", res.Status)
		}
	}
	u.waitInFlight(1)

	rs.Start() // empty: Redis lost every slot
	for _, c := range []*caddyInstance{a, b} {
		waitFor(t, 10*time.Second, "the instances to see Redis again", func() bool {
			ok, _ := zoneStore(t, c, "local_zone")
			return ok
		})
	}
	// The request still running since before the outage is counted again
	// by its instance's next renewal (every lease/3 = 1s).
	waitFor(t, 5*time.Second, "the slot of the request still running to be back in Redis", func() bool {
		status, body := b.adminDo(http.MethodGet, keyPath("local_zone", "alice"))
		return status == 200 && strings.Contains(body, `"in_use":1`)
	})
	// Redis came back without its data: for the recovery (3s) no slot is
	// taken, while the instances take back those of their requests still
	// running. Then Redis decides again: 3 more fit, across both
	// instances, and none of the outage's slots counts.
	waitFor(t, 10*time.Second, "the recovery after the empty restart to end", func() bool {
		n, err := rs.Client().Exists(context.Background(), "tally:{tally:instances}slots-recovery").Result()
		return err == nil && n == 0
	})
	var after []<-chan response
	inFlight = 1
	for i := range 3 {
		after = append(after, inBackground([]*caddyInstance{a, b}[i%2], keyRequest("alice", "/local/x?gate=after")))
		inFlight++
		u.waitInFlight(inFlight)
	}
	for _, c := range []*caddyInstance{a, b} {
		if res := c.Do(keyRequest("alice", "/local/x")); res.Status != 429 {
			t.Errorf("a 5th request in flight after recovery: %d, want 429", res.Status)
		}
	}
	u.open("after")
	u.open("pre")
	for _, ch := range append(after, pre) {
		if res := <-ch; res.Status != 200 {
			t.Errorf("a held request: %d, want 200", res.Status)
		}
	}
	rc := rs.Client()
	waitFor(t, 5*time.Second, "every slot to leave Redis", func() bool {
		n, err := rc.Exists(context.Background(), "tally:local_zone:alice").Result()
		return err == nil && n == 0
	})
}

// Mixed with a rate zone: a request the concurrency zone denies is refunded
// in the rate zone, and a request the rate zone denies holds no slot.
func TestConcurrencyZoneMixedWithARateZone(t *testing.T) {
	t.Parallel()
	u := startCountingUpstream(t)
	c := startCaddy(t, concurrencySite(u, `
		zone per_hour {
			key {http.request.header.X-API-Key}
			events 2
			window 1h
		}
		zone uploads {
			key {http.request.header.X-API-Key}
			concurrency 1
		}`, ""))
	remaining := func() int64 {
		t.Helper()
		var k adminKey
		c.adminJSON(keyPath("per_hour", "alice"), &k)
		return k.Remaining
	}
	held := inBackground(c, keyRequest("alice", "/held?gate=g"))
	u.waitInFlight(1)
	if res := c.Do(keyRequest("alice", "/fast")); res.Status != 429 {
		t.Fatalf("a 2nd request in flight at concurrency 1: %d, want 429", res.Status)
	}
	if n := remaining(); n != 1 {
		t.Fatalf("per_hour remaining %d after the concurrency zone denied, want 1 (the denial refunded)", n)
	}
	u.open("g")
	if res := <-held; res.Status != 200 {
		t.Fatalf("held request: %d", res.Status)
	}
	waitFor(t, 3*time.Second, "alice's slot to be free", func() bool {
		status, _ := c.adminDo(http.MethodGet, keyPath("uploads", "alice"))
		return status == http.StatusNotFound
	})
	if res := c.Do(keyRequest("alice", "/fast")); res.Status != 200 {
		t.Fatalf("alice's 2nd of 2 per hour: %d, want 200", res.Status)
	}
	if res := c.Do(keyRequest("alice", "/held?gate=never")); res.Status != 429 {
		t.Fatalf("alice's 3rd of 2 per hour: %d, want 429", res.Status)
	}
	if status, body := c.adminDo(http.MethodGet, keyPath("uploads", "alice")); status != http.StatusNotFound {
		t.Fatalf("a request the rate zone denied left a slot held: %d %s", status, body)
	}
}
