package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The load generator speaks just enough HTTP/1.1 to keep its own cost low
// and steady: each connection writes a request, reads the status line and
// headers, skips the body and goes again on the same connection. Caddy and
// the generator share the machine's cores, so a heavier client (net/http)
// would leave less CPU to the server and flatter every ratio.

// load is one run: which path, which key header value for request i, how
// many connections, for how long and for at most how many requests.
type load struct {
	addr        string // 127.0.0.1:port
	path        string
	key         func(i int64) string // the X-Key header; nil sends none
	body        string               // a POST's JSON body; "" sends a GET
	conns       int
	runFor      time.Duration
	maxRequests int64
}

// loadResult counts the responses of one run by status.
type loadResult struct {
	byStatus map[int]int64
	elapsed  time.Duration
}

// rate is the throughput of responses with the given status.
func (r loadResult) rate(status int) float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.byStatus[status]) / r.elapsed.Seconds()
}

func (r loadResult) total() int64 {
	var n int64
	for _, c := range r.byStatus {
		n += c
	}
	return n
}

func (l load) run() (loadResult, error) {
	if l.addr == "" || !isLoopback(l.addr) {
		return loadResult{}, fmt.Errorf("refusing to load %q: only 127.0.0.1 is allowed", l.addr)
	}
	var (
		issued atomic.Int64
		stop   atomic.Bool
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
	)
	counts := make([]map[int]int64, l.conns)
	start := time.Now()
	timer := time.AfterFunc(l.runFor, func() { stop.Store(true) })
	defer timer.Stop()
	for c := range l.conns {
		counts[c] = map[int]int64{}
		wg.Go(func() {
			if err := l.connection(&issued, &stop, counts[c]); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				stop.Store(true)
			}
		})
	}
	wg.Wait()
	res := loadResult{byStatus: map[int]int64{}, elapsed: time.Since(start)}
	for _, m := range counts {
		for s, n := range m {
			res.byStatus[s] += n
		}
	}
	return res, errors.Join(errs...)
}

// connection sends requests on one keep-alive connection until the run
// stops, reconnecting when the server closes it.
func (l load) connection(issued *atomic.Int64, stop *atomic.Bool, counts map[int]int64) error {
	var (
		conn net.Conn
		rd   *bufio.Reader
		req  []byte
	)
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for !stop.Load() {
		i := issued.Add(1) - 1
		if i >= l.maxRequests {
			return nil
		}
		if conn == nil {
			var err error
			if conn, err = net.Dial("tcp", l.addr); err != nil {
				return err
			}
			rd = bufio.NewReaderSize(conn, 16<<10)
		}
		if l.body == "" {
			req = append(req[:0], "GET "...)
		} else {
			req = append(req[:0], "POST "...)
		}
		req = append(req, l.path...)
		req = append(req, " HTTP/1.1\r\nHost: "...)
		req = append(req, l.addr...)
		req = append(req, "\r\nUser-Agent: benchtable\r\n"...)
		if l.key != nil {
			req = append(req, "X-Key: "...)
			req = append(req, l.key(i)...)
			req = append(req, "\r\n"...)
		}
		if l.body != "" {
			req = append(req, "Content-Type: application/json\r\nContent-Length: "...)
			req = strconv.AppendInt(req, int64(len(l.body)), 10)
			req = append(req, "\r\n"...)
		}
		req = append(req, "\r\n"...)
		req = append(req, l.body...)
		if _, err := conn.Write(req); err != nil {
			return err
		}
		status, keepAlive, err := readResponse(rd)
		if err != nil {
			return err
		}
		counts[status]++
		if !keepAlive {
			conn.Close()
			conn = nil
		}
	}
	return nil
}

// readResponse reads one response and returns its status and whether the
// connection may be reused. Bodies are skipped by Content-Length or chunk by
// chunk.
func readResponse(rd *bufio.Reader) (status int, keepAlive bool, err error) {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	keepAlive = true
	length, chunked := int64(0), false
	for {
		line, err = rd.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(line) <= 2 {
			break
		}
		name, value, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.ParseInt(string(value), 10, 64); err != nil {
				return 0, false, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			keepAlive = !bytes.EqualFold(value, []byte("close"))
		}
	}
	if !chunked {
		_, err = rd.Discard(int(length))
		return status, keepAlive, err
	}
	for {
		line, err = rd.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil {
			return 0, false, fmt.Errorf("bad chunk size %q", line)
		}
		if _, err = rd.Discard(int(size) + 2); err != nil { // the chunk and its CRLF
			return 0, false, err
		}
		if size == 0 {
			return status, keepAlive, nil
		}
	}
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host == "127.0.0.1"
}
