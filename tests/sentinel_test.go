package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/distributed"
)

// startSentinel starts a real Redis Sentinel (redis-server --sentinel)
// watching master as "mymaster" and returns its address.
func startSentinel(t *testing.T, master *redisServer) string {
	t.Helper()
	port := freePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\n", port, dir, master.Port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	logf, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server --sentinel: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer s.Close()
	waitFor(t, 10*time.Second, "the sentinel to know mymaster", func() bool {
		a, err := s.GetMasterAddrByName(context.Background(), "mymaster").Result()
		return err == nil && len(a) == 2 && a[1] == strconv.Itoa(master.Port)
	})
	return addr
}

// Through Sentinel (addresses are the sentinels, sentinel_master names the
// master), strict mode decides in the master and stays exact.
func TestStrictModeThroughSentinelIsExact(t *testing.T) {
	t.Parallel()
	master := startRedis(t)
	sentinel := startSentinel(t, master)
	opts := distributed.Options{Addresses: []string{sentinel}, SentinelMaster: "mymaster", Timeout: 2 * time.Second}
	stores := []*distributed.Store{openStore(t, opts, nil), openStore(t, opts, nil)}
	limit := algorithms.NewLimit(20, int64(time.Hour), 0)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				r, err := stores[g%2].Decide(context.Background(), "sentinel", "k", limit, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := allowed.Load(); n != 20 {
		t.Fatalf("%d of 120 decisions allowed through Sentinel at 20 per hour, want exactly 20", n)
	}
	if ttl, err := master.Client().PTTL(context.Background(), "tally:sentinel:k").Result(); err != nil || ttl <= 0 {
		t.Fatalf("the key is not in the master with a TTL: %v %v", ttl, err)
	}
}
