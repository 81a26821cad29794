package tests

// A loopback TCP proxy in front of a redis-server that can hold back what
// Redis sends to its pub/sub connections (those that sent SUBSCRIBE), or
// drop them, so that a test can have a store hear a reset late, or miss it,
// deterministically. For the multi-region tests it can also stand for a
// long-distance link: a latency each way, a hang (nothing passes until
// Unhang), a cut (every connection closed and refused) and a share of
// replies dropped (the connection closes instead of delivering one).

import (
	"bytes"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
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

	latency  [2]time.Duration // each way: from latency[0] to latency[1]
	hung     bool             // nothing passes either way
	cut      bool             // connections are closed, and refused
	dropRate float64          // a reply is dropped (its connection closed) at this rate
	sent     [][]byte         // with record: what the clients sent, a read at a time
	record   bool
}

// Record keeps what the clients send from now on, a read from a client's
// connection at a time (a pipeline, written at once, is one), until Sent.
func (p *redisProxy) Record() { p.mu.Lock(); p.record, p.sent = true, nil; p.mu.Unlock() }

// Sent returns what was recorded since Record, and stops recording.
func (p *redisProxy) Sent() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record = false
	return p.sent
}

// SetLatency delays every chunk, each way, by a random duration from lo
// to hi.
func (p *redisProxy) SetLatency(lo, hi time.Duration) {
	p.mu.Lock()
	p.latency = [2]time.Duration{lo, hi}
	p.mu.Unlock()
}

// Hang holds everything back, both ways, until Unhang: connections stay
// open and nothing answers.
func (p *redisProxy) Hang() { p.mu.Lock(); p.hung = true; p.mu.Unlock() }

// Unhang undoes Hang.
func (p *redisProxy) Unhang() { p.mu.Lock(); p.hung = false; p.cond.Broadcast(); p.mu.Unlock() }

// Cut closes every connection and refuses new ones until Uncut.
func (p *redisProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

// Uncut undoes Cut.
func (p *redisProxy) Uncut() { p.mu.Lock(); p.cut = false; p.mu.Unlock() }

// DropReplies drops this fraction of Redis's replies: the connection is
// closed instead, after Redis ran the command.
func (p *redisProxy) DropReplies(rate float64) { p.mu.Lock(); p.dropRate = rate; p.mu.Unlock() }

// link applies the latency, a hang and a cut to one chunk; it reports
// whether the chunk may pass, and, for a reply, whether to drop it.
func (p *redisProxy) link(reply bool) (pass, drop bool) {
	p.mu.Lock()
	lat := p.latency
	for p.hung && !p.cut {
		p.cond.Wait()
	}
	cut, rate := p.cut, p.dropRate
	p.mu.Unlock()
	if cut {
		return false, false
	}
	if lat[1] > 0 {
		time.Sleep(lat[0] + time.Duration(rand.Int64N(int64(lat[1]-lat[0])+1)))
	}
	return true, reply && rate > 0 && rand.Float64() < rate
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
	p.cut = true
	p.cond.Broadcast()
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
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
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
					if pass, _ := p.link(false); !pass {
						break
					}
					p.mu.Lock()
					if p.record {
						p.sent = append(p.sent, bytes.Clone(buf[:n]))
					}
					p.mu.Unlock()
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
					if pass, drop := p.link(true); !pass || drop {
						break
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
