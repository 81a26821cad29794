package tests

// The harness for distributed stores opened in-process, without Caddy:
// strict and async stores, each playing its own instance, and a logger
// whose lines a test can read.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-tally/ratelimit/distributed"
)

// openStore opens a Store on the given addresses, closed with the test.
//
// Each store plays its own instance (a process counts once in the
// heartbeat set, however many stores it opens).
func openStore(t testing.TB, opts distributed.Options, logger *zap.Logger) *distributed.Strict {
	t.Helper()
	if opts.Instance == "" {
		opts.Instance = nextTestInstance()
	}
	s, err := distributed.Open(opts, logger)
	if err != nil {
		t.Fatalf("Open(%s): %v", opts.Redacted(), err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var testInstances atomic.Int64

// nextTestInstance names one more instance played by this test process.
func nextTestInstance() string { return "test-instance-" + strconv.FormatInt(testInstances.Add(1), 10) }

// observedLogger records log entries so tests can count them.
func observedLogger() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(core), logs
}

// openAsyncStores opens n async stores on one Redis and waits until each
// has seen all n through the heartbeat, so fresh shares are B/n.
// timeout is the store's Timeout (0: the default, 20ms).
func openAsyncStores(t *testing.T, n int, addr string, interval, timeout time.Duration) []*distributed.Async {
	t.Helper()
	stores := make([]*distributed.Async, n)
	for i := range stores {
		a, err := distributed.OpenAsync(distributed.Options{Addresses: []string{addr}, Mode: "async",
			SyncInterval: interval, Timeout: timeout, Instance: nextTestInstance()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		stores[i] = a
	}
	for _, a := range stores {
		waitFor(t, 10*time.Second, "every async store to see the others", func() bool {
			got, _ := a.Heartbeat(context.Background())
			return got == n
		})
	}
	return stores
}

// waitForSyncs polls until every store has synced at least twice since
// since: its view includes what the others reported.
func waitForSyncs(t *testing.T, stores []*distributed.Async, interval time.Duration) {
	t.Helper()
	after := time.Now().Add(interval)
	for _, a := range stores {
		waitFor(t, 10*time.Second, "an async store to sync", func() bool { return a.LastSync().After(after) })
	}
}
