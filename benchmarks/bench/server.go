package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is the Redis the benchmark runs against.
type Server struct {
	// Addr is host:port.
	Addr string
	// Own is set when the program started the server: only then may it be
	// flushed without asking.
	Own bool
	cmd *exec.Cmd
	dir string
}

// StartServer starts redis-server on a free port of 127.0.0.1, without
// persistence, and waits until it answers.
func StartServer(ctx context.Context) (*Server, error) {
	return startServer(ctx)
}

// startServer starts redis-server as StartServer does, with extra
// arguments.
func startServer(ctx context.Context, extra ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("bench: no REDIS_ADDR and no redis-server on PATH: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "rwbench-redis-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "yes"}, extra...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Own: true, cmd: cmd, dir: dir}
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err = c.Ping(ctx).Err(); err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("bench: redis-server on %s did not start: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops a server the program started.
func (s *Server) Close() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// usedMemory returns INFO memory's used_memory in bytes.
func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "used_memory:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("bench: no used_memory in INFO memory")
}

// redisVersion returns INFO server's redis_version.
func redisVersion(ctx context.Context, rdb *redis.Client) string {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// clusterMasters is how many masters StartCluster starts.
const clusterMasters = 3

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// Cluster is a Redis Cluster of masters without replicas on loopback that
// the program started (StartCluster).
type Cluster struct {
	// Addrs are the masters' host:port.
	Addrs []string
	nodes []*Server
}

// StartCluster starts three redis-server --cluster-enabled yes nodes on
// free ports of 127.0.0.1 (each with a cluster bus port of its own, as
// port+10000 may lie past 65535), gives each a third of the slots
// (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER MEET), and returns once
// every node reports cluster_state:ok and a cluster client can write a key
// on every node.
func StartCluster(ctx context.Context) (*Cluster, error) {
	c := &Cluster{}
	for range clusterMasters {
		bus, err := freePort()
		if err != nil {
			c.Close()
			return nil, err
		}
		s, err := startServer(ctx, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus))
		if err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	if err := c.join(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("bench: cluster of %s: %w", strings.Join(c.Addrs, ", "), err)
	}
	return c, nil
}

// join assigns the slots, introduces the nodes and waits until the cluster
// serves.
func (c *Cluster) join(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.Addrs))
	for i, addr := range c.Addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer clients[i].Close()
	}
	for i, rdb := range clients {
		lo, hi := i*clusterSlots/len(clients), (i+1)*clusterSlots/len(clients)-1
		if err := rdb.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d: %w", lo, hi, err)
		}
	}
	first := clients[0].Options().Addr
	host, port, err := net.SplitHostPort(first)
	if err != nil {
		return err
	}
	bus, err := configValue(ctx, clients[0], "cluster-port")
	if err != nil {
		return err
	}
	for _, rdb := range clients[1:] {
		if err := rdb.Do(ctx, "CLUSTER", "MEET", host, port, bus).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s %s %s: %w", host, port, bus, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, rdb := range clients {
		if err := poll(ctx, func() error {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(clients))) {
				return fmt.Errorf("%s: not ready: %q", rdb.Options().Addr, info)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	defer cc.Close()
	return poll(ctx, func() error {
		// keys enough to land on every master
		for i := range 64 {
			if err := cc.Set(ctx, "rwbench:probe:"+strconv.Itoa(i), "1", time.Second).Err(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close stops the cluster's nodes.
func (c *Cluster) Close() {
	for _, s := range c.nodes {
		s.Close()
	}
}

// poll calls f until it succeeds or ctx ends, and returns f's last error.
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// configValue is CONFIG GET name's value.
func configValue(ctx context.Context, rdb *redis.Client, name string) (string, error) {
	m, err := rdb.ConfigGet(ctx, name).Result()
	if err != nil {
		return "", fmt.Errorf("CONFIG GET %s: %w", name, err)
	}
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("CONFIG GET %s: no value", name)
	}
	return v, nil
}

// freePort returns a port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
