// Package upstreammodel is an upstream for load tests and benchmarks on
// loopback: it serves at most C requests at once, each in service time S,
// and queues the others, so that its latency grows with its queue; C may
// change while it runs, and so may S. Its capacity is C/S requests per
// second.
package upstreammodel

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is the model as an http.Handler.
type Upstream struct {
	service atomic.Int64 // ns

	mu       sync.Mutex
	cond     *sync.Cond
	capacity int
	running  int
	inFlight atomic.Int64 // served and queued
}

// New returns a model serving capacity requests at once, each in service.
func New(capacity int, service time.Duration) *Upstream {
	u := &Upstream{capacity: capacity}
	u.service.Store(int64(service))
	u.cond = sync.NewCond(&u.mu)
	return u
}

// ServeHTTP waits for one of the capacity places, holds it for the service
// time and answers 200.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	u.mu.Lock()
	for u.running >= u.capacity {
		u.cond.Wait()
	}
	u.running++
	u.mu.Unlock()
	time.Sleep(time.Duration(u.service.Load())) // the model's service time
	u.mu.Lock()
	u.running--
	u.cond.Signal()
	u.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// SetCapacity changes how many requests are served at once.
func (u *Upstream) SetCapacity(c int) {
	u.mu.Lock()
	u.capacity = c
	u.cond.Broadcast()
	u.mu.Unlock()
}

// SetService changes the time each request is served in.
func (u *Upstream) SetService(d time.Duration) { u.service.Store(int64(d)) }

// InFlight is the requests the model holds now, served and queued.
func (u *Upstream) InFlight() int64 { return u.inFlight.Load() }

// Server is an Upstream listening on a loopback port.
type Server struct {
	*Upstream
	Addr string // 127.0.0.1:port
	srv  *httptest.Server
}

// Start serves a new model on a free loopback port.
func Start(capacity int, service time.Duration) *Server {
	u := New(capacity, service)
	srv := httptest.NewServer(u)
	return &Server{Upstream: u, Addr: srv.Listener.Addr().String(), srv: srv}
}

// Close stops listening and waits for the requests it holds to be answered.
func (s *Server) Close() { s.srv.Close() }
