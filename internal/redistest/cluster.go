package redistest

import (
	"context"
	"errors"
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

const (
	clusterMasters = 3
	clusterTimeout = 30 * time.Second // creating the cluster and waiting for it
)

// Cluster is a Redis Cluster of three masters without replicas on loopback.
type Cluster struct {
	// Addrs are the host:port of the masters (or of REDIS_CLUSTER_ADDRS).
	Addrs []string
}

// NewCluster returns a three-master Redis Cluster on loopback: REDIS_CLUSTER_ADDRS
// (comma-separated host:port) if set, otherwise one started on the first call and
// shared by all tests of the test binary. Tests isolate themselves by key prefix.
//
// The started cluster is three redis-server --cluster-enabled yes nodes, joined by
// redis-cli --cluster create, and NewCluster returns once every node reports
// cluster_state:ok and a ClusterClient can SET and GET. Without the redis-server
// or redis-cli binary the test is skipped, or fails when
// RATEWINDOW_REQUIRE_REDIS=1. The package's TestMain must call [Main].
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	requireMain(t, "NewCluster")
	shared.log.watch(t)
	if env := os.Getenv(envClusterAddrs); env != "" {
		var addrs []string
		for _, addr := range strings.Split(env, ",") {
			addr = strings.TrimSpace(addr)
			if addr == "" {
				continue
			}
			if err := checkLoopback(addr); err != nil {
				t.Fatalf("redistest.NewCluster: %s: %v", envClusterAddrs, err)
			}
			addrs = append(addrs, addr)
		}
		if len(addrs) == 0 {
			t.Fatalf("redistest.NewCluster: %s=%q names no address", envClusterAddrs, env)
		}
		return &Cluster{Addrs: addrs}
	}
	needBinaries(t, "NewCluster", serverBin, cliBin)
	nodes, err := shared.cluster.get(startCluster)
	if err != nil {
		t.Fatalf("redistest.NewCluster: %v", err)
	}
	c := &Cluster{}
	for _, p := range nodes {
		c.Addrs = append(c.Addrs, p.Addr)
	}
	return c
}

// Client returns a new cluster client for c, closed at t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// startCluster starts the nodes, creates the cluster and waits until it serves.
func startCluster() (nodes []*Process, err error) {
	defer func() {
		if err != nil {
			for _, p := range nodes {
				p.stop()
			}
			nodes = nil
		}
	}()
	for range clusterMasters {
		p, err := launch(serverBin, func(dir string) (int, []string, error) {
			port, err := freePort()
			if err != nil {
				return 0, nil, err
			}
			// The cluster bus gets a port of its own: the default, port+10000,
			// is past 65535 for most ephemeral ports.
			bus, err := freePort()
			if err != nil {
				return 0, nil, err
			}
			conf := filepath.Join(dir, "nodes.conf")
			_ = os.Remove(conf) // from a failed attempt
			return port, append(commonArgs(port, dir),
				"--cluster-enabled", "yes",
				"--cluster-config-file", conf,
				"--cluster-port", strconv.Itoa(bus),
			), nil
		})
		if err != nil {
			return nodes, err
		}
		nodes = append(nodes, p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := []string{"--cluster", "create"}
	for _, p := range nodes {
		args = append(args, p.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cliBin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nodes, fmt.Errorf("%s %s: %v\n%s%s", cliBin, strings.Join(args, " "), err, out, nodesLogs(nodes))
	}

	// redis-cli returns once the nodes agree on the slots; wait until each of
	// them also says the cluster is ok, then until a client can use it.
	var last error
	for _, p := range nodes {
		last = poll(ctx, func() error {
			info, err := commandString(p.Addr, "CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if state, _ := infoField(info, "cluster_state"); state != "ok" {
				return fmt.Errorf("%s: cluster_state:%s", p.Addr, state)
			}
			return nil
		})
		if last != nil {
			return nodes, fmt.Errorf("cluster not ok after %v: %v%s", clusterTimeout, last, nodesLogs(nodes))
		}
	}
	addrs := make([]string, len(nodes))
	for i, p := range nodes {
		addrs[i] = p.Addr
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1})
	defer cc.Close()
	last = poll(ctx, func() error {
		// Keys in all three masters' slot ranges.
		for _, key := range []string{"redistest:{a}", "redistest:{b}", "redistest:{c}"} {
			if err := cc.Set(ctx, key, "ok", time.Minute).Err(); err != nil {
				return err
			}
			if v, err := cc.Get(ctx, key).Result(); err != nil || v != "ok" {
				return fmt.Errorf("GET %s = %q, %v", key, v, err)
			}
		}
		return nil
	})
	if last != nil {
		return nodes, fmt.Errorf("cluster does not serve after %v: %v%s", clusterTimeout, last, nodesLogs(nodes))
	}
	return nodes, nil
}

// nodesLogs returns the log tails of the nodes, for error messages.
func nodesLogs(nodes []*Process) string {
	var b strings.Builder
	for _, p := range nodes {
		b.WriteString(p.logTail())
	}
	return b.String()
}

// poll calls f every 20ms until it returns nil or a *permanentError or ctx is
// done, and returns the last error of f.
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		if p, ok := err.(*permanentError); ok {
			return p.err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// permanentError ends poll at once.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
