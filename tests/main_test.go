// Package tests is tally's integration suite, its own Go module: real Caddy
// processes built from this working tree and real redis-server, Sentinel,
// Cluster and Prometheus processes, all on free loopback ports, started and
// stopped by the tests themselves.
//
// File names say what a file's tests need:
//
//   - *_caddy_test.go: files with tests that start Caddy (./cmd/tally-caddy, built
//     once per run, or TALLY_CADDY_BIN), named for the feature they test;
//   - harness_*_test.go: the harness, no tests: harness_caddy (one Caddy,
//     requests, the admin API and /metrics), harness_fleet (several Caddy
//     instances sharing one Redis), harness_redis (redis-server, INFO
//     commandstats), harness_cluster (Redis Cluster, with and without
//     replicas), harness_sentinel (Sentinels and failover),
//     harness_store (distributed stores opened in-process), harness_proxy (a
//     loopback proxy that holds back pub/sub), harness_test.go
//     (free ports, polling);
//   - every other *_test.go: tests that drive the shipped packages
//     in-process against a real redis-server (store_test.go, async_*,
//     failover_test.go, ...), benchmarks, and checks that read the
//     repository (arrows_test.go: DESIGN.md's import arrows; layout_test.go:
//     the README's Layout table and these rules; docs_test.go: the docs'
//     links), which make lint runs too.
//
// TestFileNamesSayWhichTestsStartCaddy keeps the first two rules.
package tests

import (
	"fmt"
	"os"
	"testing"
)

// TestMain only owns the directory the Caddy binary is built into. The binary
// is built on first use (caddyBinary), so the tests that need no Caddy do not
// wait for the build or fail when the root package does not compile.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tally-caddy-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating the Caddy build directory:", err)
		os.Exit(1)
	}
	caddyBuild.dir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
