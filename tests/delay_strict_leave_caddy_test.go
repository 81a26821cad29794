package tests

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// In strict mode a client that leaves while waiting for its turn gives its
// reservation back in Redis: the refund outlives the request's context
// (which is cancelled when the client leaves), so the key's TAT in Redis
// moves back by the turn it had reserved.
func TestStrictDelayClientThatLeavesGivesItsReservationBackInRedis(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	c := startCaddy(t, distributedSite(rs.Addr, `
		zone slow {
			key {http.request.header.X-API-Key}
			events 1
			window 10s
			burst 1
			delay 15s
		}`, "\t\t\ttimeout 2s"))
	rc := rs.Client()
	tat := func() int64 {
		v, err := rc.Get(context.Background(), "tally:slow:alice").Result()
		if err != nil {
			return 0
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	if res := c.Do(withKey("alice")); res.Status != 200 { // at once; the next turn is 10s away
		t.Fatalf("first request: %d, want 200", res.Status)
	}
	first := tat()
	if first == 0 {
		t.Fatal("no TAT for alice in Redis after her first request")
	}
	const T = int64(10 * time.Second / time.Microsecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/", nil)
		req.Header.Set("X-API-Key", "alice")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		res.Body.Close()
		answered <- res.StatusCode
	}()
	waitFor(t, 5*time.Second, "the second request's turn to be reserved in Redis", func() bool {
		return tat() == first+T
	})
	cancel() // the client leaves while it waits
	if status := <-answered; status != 0 {
		t.Fatalf("the second request was answered (%d) before its turn", status)
	}
	waitFor(t, 3*time.Second, "the reservation to be given back in Redis", func() bool {
		return tat() == first
	})
}
