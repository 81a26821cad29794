package tests

// An adaptive zone in front of an upstream that fails fast: a failure (a
// 5xx, a proxy error) returns in a millisecond, which a controller that
// samples it reads as spare capacity. The limit must not rise on them.

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// failFastUpstream serves up to places requests at once in service each
// and answers 500 at once to the ones beyond.
type failFastUpstream struct {
	Addr            string
	inFlight        atomic.Int64
	served, errored atomic.Int64
	places          int64
	service         time.Duration
	srv             *http.Server
}

func startFailFastUpstream(t *testing.T, places int64, service time.Duration) *failFastUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &failFastUpstream{Addr: ln.Addr().String(), places: places, service: service}
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer u.inFlight.Add(-1)
		if u.inFlight.Add(1) > u.places {
			u.errored.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		time.Sleep(u.service) // the upstream's work, not synchronisation
		u.served.Add(1)
	})}
	go u.srv.Serve(ln)
	t.Cleanup(func() { u.srv.Close() })
	return u
}

// closedLoopLoad keeps workers requests in flight against url for d,
// each sending its next as soon as its answer came, while watch runs
// every 20ms; it returns the answers' statuses counted.
func closedLoopLoad(t *testing.T, url string, workers int, d time.Duration, watch func()) map[int]int {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	statuses := map[int]int{}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				resp, err := client.Get(url)
				mu.Lock()
				if err != nil {
					statuses[0]++
				} else {
					resp.Body.Close()
					statuses[resp.StatusCode]++
				}
				mu.Unlock()
			}
		}()
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		<-tick.C
		watch()
	}
	wg.Wait()
	return statuses
}

// failingSite's target is far above what the served requests take, even
// on a loaded machine: served requests alone would let the limit grow.
func failingSite(upstream string) string {
	return `http:// {
	rate_limit {
		zone backend {
			key {http.request.host}
			adaptive {
				latency 300ms
				min 4
				max 2000
			}
		}
	}
	reverse_proxy ` + upstream + `
}
`
}

// An upstream of 10 places that answers 500 in no time beyond them: past
// the slow start (which may double once past the places before the 500s
// show), the limit stays near 10 and never runs away on the fast 500s.
func TestAdaptiveLimitDoesNotRiseOnFastErrors(t *testing.T) {
	const places = 10
	u := startFailFastUpstream(t, places, 20*time.Millisecond)
	c := startCaddy(t, failingSite(u.Addr))
	var peak, late float64
	settled := time.Now().Add(2 * time.Second)
	statuses := closedLoopLoad(t, c.URL+"/", 60, 5*time.Second, func() {
		l := adaptiveLimitOf(c)
		if peak = max(peak, l); time.Now().After(settled) {
			late = max(late, l)
		}
	})
	t.Logf("limit peak %.0f, %.0f after 2s; upstream served %d, answered 500 to %d; client saw %v", peak, late, u.served.Load(), u.errored.Load(), statuses)
	// Beside CPU hogs the clients cannot keep the limit's requests in
	// flight, so a window can stay under a tenth of failures a little
	// past the places (21 seen); a limit that counts the 500s as fast
	// answers runs to 128 and on.
	if late > 3*places {
		t.Errorf("adaptive limit at %.0f after 2s in front of an upstream of %d places that answers 500 beyond them, want at most %d", late, places, 3*places)
	}
	if u.served.Load() == 0 {
		t.Error("the upstream served nothing")
	}
}

// In front of a closed port every request is a fast 502: the limit stays
// at its min, so that the upstream is not sent max requests at once when
// it comes back.
func TestAdaptiveLimitStaysAtMinInFrontOfAClosedPort(t *testing.T) {
	// A port no other test is handed: nothing listens there.
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	c := startCaddy(t, failingSite(addr))
	var peak float64
	statuses := closedLoopLoad(t, c.URL+"/", 20, 3*time.Second, func() { peak = max(peak, adaptiveLimitOf(c)) })
	t.Logf("limit peak %.0f; client saw %v", peak, statuses)
	if statuses[http.StatusBadGateway] == 0 {
		t.Fatalf("client saw %v, want 502s from the closed port", statuses)
	}
	if peak > 4 {
		t.Errorf("adaptive limit rose to %.0f in front of a closed port (every request a fast 502), want min 4", peak)
	}
}
