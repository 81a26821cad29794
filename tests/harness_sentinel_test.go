package tests

// The harness for Sentinel: Sentinels watching a master, a master with its
// replica and three Sentinels, and waiting for a promotion.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startSentinels starts n Sentinels watching master as "mymaster" with
// the given quorum, declaring it down after downAfter without an answer,
// and waits until each knows the master and its replicas.
func startSentinels(t *testing.T, master *redisServer, n, quorum, replicas int, downAfter time.Duration) []string {
	t.Helper()
	var addrs []string
	for range n {
		port := freePort(t)
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
			"sentinel monitor mymaster 127.0.0.1 %d %d\n"+
			"sentinel down-after-milliseconds mymaster %d\n"+
			"sentinel failover-timeout mymaster 10000\n",
			port, dir, master.Port, quorum, downAfter.Milliseconds())
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
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(port))
	}
	ctx := context.Background()
	for _, a := range addrs {
		s := redis.NewSentinelClient(&redis.Options{Addr: a})
		defer s.Close()
		waitFor(t, 20*time.Second, "sentinel "+a+" to know mymaster, its replicas and the other sentinels", func() bool {
			m, err := s.GetMasterAddrByName(ctx, "mymaster").Result()
			if err != nil || len(m) != 2 || m[1] != strconv.Itoa(master.Port) {
				return false
			}
			r, err := s.Replicas(ctx, "mymaster").Result()
			if err != nil || len(r) != replicas {
				return false
			}
			others, err := s.Sentinels(ctx, "mymaster").Result()
			return err == nil && len(others) == n-1
		})
	}
	return addrs
}

// startSentinelSet starts a master, a replica in sync with it and three
// Sentinels (quorum 2, down after 1s) watching it as "mymaster".
func startSentinelSet(t *testing.T) (master, replica *redisServer, sentinels []string) {
	t.Helper()
	master = startRedis(t)
	replica = startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	rc := replica.Client()
	waitFor(t, 10*time.Second, "the replica in sync", func() bool {
		repl, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(repl, "master_link_status:up")
	})
	return master, replica, startSentinels(t, master, 3, 2, 1, time.Second)
}

// waitForSentinelPromotion polls until the sentinel at sentinel names
// replica as mymaster's master and replica says it is a master, and returns
// when it saw both.
func waitForSentinelPromotion(t *testing.T, sentinel string, replica *redisServer) time.Time {
	t.Helper()
	ctx := context.Background()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer sc.Close()
	rc := replica.Client()
	waitFor(t, 20*time.Second, "the replica's promotion", func() bool {
		m, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
		if err != nil || len(m) != 2 || m[1] != strconv.Itoa(replica.Port) {
			return false
		}
		repl, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(repl, "role:master")
	})
	return time.Now()
}
