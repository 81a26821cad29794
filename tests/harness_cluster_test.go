package tests

// The harness for Redis Cluster: three masters without replicas, or three
// masters with one replica each (for failover), and keys placed on every
// master.

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startRedisCluster starts three masters with no replicas and waits until
// every node reports cluster_state:ok. It returns their addresses.
func startRedisCluster(t testing.TB) []string {
	t.Helper()
	_, addrs := startRedisClusterNodes(t, 2*time.Second)
	return addrs
}

// startRedisClusterNodes is startRedisCluster with the servers (and their
// addresses), for tests that stop or pause one, and the nodes'
// cluster-node-timeout: how long a silent master may stay silent before the
// others mark it failed (and, with no replica to promote, refuse every key).
func startRedisClusterNodes(t testing.TB, nodeTimeout time.Duration) (nodes []*redisServer, addrs []string) {
	t.Helper()
	for range 3 {
		dir := t.TempDir()
		srv := startRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10))
		nodes = append(nodes, srv)
		addrs = append(addrs, srv.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		defer c.Close()
		waitFor(t, 20*time.Second, "cluster_state:ok on "+a, func() bool {
			info, err := c.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	}
	return nodes, addrs
}

// replicatedCluster is three masters with one replica each, as redis-cli
// --cluster create built it.
type replicatedCluster struct {
	masters   []*redisServer
	replicaOf map[string]*redisServer // by master address
	all       []*redisServer
}

// startReplicatedCluster starts 3 masters + 3 replicas with
// cluster-node-timeout 1000 and waits until every node reports
// cluster_state:ok and every replica is in sync. Coverage is not required
// (cluster-require-full-coverage no): with the default, Redis itself refuses
// every key on every master while one master is down and not yet replaced.
func startReplicatedCluster(t *testing.T) *replicatedCluster {
	t.Helper()
	rc := &replicatedCluster{replicaOf: map[string]*redisServer{}}
	var addrs []string
	for range 6 {
		dir := t.TempDir()
		srv := startRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no")
		rc.all = append(rc.all, srv)
		addrs = append(addrs, srv.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	byPort := map[string]*redisServer{}
	for _, s := range rc.all {
		byPort[strconv.Itoa(s.Port)] = s
	}
	for _, s := range rc.all {
		c := s.Client()
		waitFor(t, 30*time.Second, "cluster_state:ok and a settled role on "+s.Addr, func() bool {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			repl, err := c.Info(ctx, "replication").Result()
			if err != nil {
				return false
			}
			if strings.Contains(repl, "role:master") {
				return strings.Contains(repl, "connected_slaves:1")
			}
			return strings.Contains(repl, "master_link_status:up")
		})
		repl, _ := c.Info(ctx, "replication").Result()
		if strings.Contains(repl, "role:master") {
			rc.masters = append(rc.masters, s)
			continue
		}
		port := infoField(repl, "master_port")
		if byPort[port] == nil {
			t.Fatalf("replica %s follows port %q, not a node of the cluster", s.Addr, port)
		}
		rc.replicaOf[byPort[port].Addr] = s
	}
	if len(rc.masters) != 3 || len(rc.replicaOf) != 3 {
		t.Fatalf("%d masters and %d replicated masters, want 3 and 3", len(rc.masters), len(rc.replicaOf))
	}
	return rc
}

// infoField reads field from an INFO reply.
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// addrs returns every node's address, masters first.
func (rc *replicatedCluster) addrs() []string {
	var out []string
	for _, m := range rc.masters {
		out = append(out, m.Addr)
	}
	for _, m := range rc.masters {
		out = append(out, rc.replicaOf[m.Addr].Addr)
	}
	return out
}

// promoted reports whether replica has become a master and the cluster,
// as it sees it, is ok again.
func promoted(ctx context.Context, replica *redis.Client) bool {
	repl, err := replica.Info(ctx, "replication").Result()
	if err != nil || !strings.Contains(repl, "role:master") {
		return false
	}
	info, err := replica.ClusterInfo(ctx).Result()
	return err == nil && strings.Contains(info, "cluster_state:ok")
}

// keysOnEveryNode picks perNode API keys whose Redis keys (zone api, default
// prefix) hash to slots owned by each master, and returns them with the
// address of their master.
func keysOnEveryNode(t *testing.T, ctx context.Context, cluster *redis.ClusterClient, addrs []string, perNode int) ([]string, map[string]string) {
	t.Helper()
	return keysOnEveryMaster(t, ctx, cluster, addrs, perNode, func(k string) string { return "tally:api:" + k })
}

// keysOnEveryMaster picks perNode keys whose Redis key names (redisKey)
// hash to slots owned by each of addrs, with the address of their master.
func keysOnEveryMaster(t *testing.T, ctx context.Context, cluster *redis.ClusterClient, addrs []string, perNode int, redisKey func(string) string) ([]string, map[string]string) {
	t.Helper()
	shards, err := cluster.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ownerOf := func(slot int64) string {
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start <= slot && slot <= r.End {
					for _, n := range sh.Nodes {
						if n.Role == "master" {
							return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
						}
					}
				}
			}
		}
		return ""
	}
	count := map[string]int{}
	owner := map[string]string{}
	var keys []string
	for i := 0; i < 1000 && len(keys) < perNode*len(addrs); i++ {
		k := "key-" + strconv.Itoa(i)
		slot, err := cluster.ClusterKeySlot(ctx, redisKey(k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		node := ownerOf(slot)
		if node == "" {
			t.Fatalf("no master owns slot %d: %+v", slot, shards)
		}
		if count[node] < perNode {
			count[node]++
			owner[k] = node
			keys = append(keys, k)
		}
	}
	if len(count) != len(addrs) || len(keys) != perNode*len(addrs) {
		t.Fatalf("found keys on %d masters (%v), want %d on each of %v", len(count), count, perNode, addrs)
	}
	return keys, owner
}
