package tests

// A loopback TCP proxy in front of a redis-server that can hold back what
// Redis sends to its pub/sub connections (those that sent SUBSCRIBE), or
// drop them, so that a test can have a store hear a reset late, or miss it,
// deterministically.

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

type redisProxy struct {
	Addr     string
	upstream string
	ln       net.Listener

	mu      sync.Mutex
	held    bool
	dropped bool       // pub/sub connections are closed, and refused
	pubsubs []net.Conn // the client side of pub/sub connections
	cond    *sync.Cond
	conns   []net.Conn
}

// startRedisProxy listens on a free loopback port and forwards every
// connection to upstream, until the test ends.
func startRedisProxy(t *testing.T, upstream string) *redisProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &redisProxy{Addr: ln.Addr().String(), upstream: upstream, ln: ln}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// HoldPubSub holds back, until ReleasePubSub, every byte Redis sends to a
// connection that subscribed.
func (p *redisProxy) HoldPubSub() { p.mu.Lock(); p.held = true; p.mu.Unlock() }

// ReleasePubSub lets what HoldPubSub held back through, in order.
func (p *redisProxy) ReleasePubSub() {
	p.mu.Lock()
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// DropPubSub closes every pub/sub connection, and every connection that
// subscribes until AllowPubSub: the store's subscription is down, and what
// is published meanwhile never reaches it.
func (p *redisProxy) DropPubSub() {
	p.mu.Lock()
	p.dropped = true
	for _, c := range p.pubsubs {
		c.Close()
	}
	p.pubsubs = nil
	p.mu.Unlock()
}

// AllowPubSub undoes DropPubSub.
func (p *redisProxy) AllowPubSub() { p.mu.Lock(); p.dropped = false; p.mu.Unlock() }

func (p *redisProxy) close() {
	p.ln.Close()
	p.ReleasePubSub()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *redisProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		var subscribed sync.Once
		pubsub := make(chan struct{})
		go func() { // client to Redis: watch for SUBSCRIBE
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("subscribe")) {
						subscribed.Do(func() { close(pubsub) })
						p.mu.Lock()
						dropped := p.dropped
						if !dropped {
							p.pubsubs = append(p.pubsubs, c)
						}
						p.mu.Unlock()
						if dropped {
							c.Close()
							break
						}
					}
					if _, werr := u.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			u.Close()
		}()
		go func() { // Redis to client: held back on a pub/sub connection
			buf := make([]byte, 32<<10)
			for {
				n, err := u.Read(buf)
				if n > 0 {
					select {
					case <-pubsub:
						p.mu.Lock()
						for p.held {
							p.cond.Wait()
						}
						p.mu.Unlock()
					default:
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			c.Close()
		}()
	}
}
