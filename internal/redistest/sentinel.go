package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	sentinelMaster  = "mymaster"
	sentinelTimeout = 20 * time.Second // replication, discovery, failover
)

// Sentinel is a master, one replica of it and one redis-sentinel monitoring them,
// all on loopback, all stopped at the cleanup of the test that started them.
type Sentinel struct {
	// MasterName is the name the sentinel monitors the master under: "mymaster".
	MasterName string
	// SentinelAddrs are the host:port of the sentinels (one).
	SentinelAddrs []string
	// Master is the current master and Replica its replica. Failover swaps them.
	Master, Replica *Process

	sentinel *Process
}

// NewSentinel starts a master, a replica of it (--replicaof) and a redis-sentinel
// that monitors the master as "mymaster" with quorum 1, down-after-milliseconds
// 1000 and failover-timeout 3000, each on a free port of 127.0.0.1, and returns
// once the replica is in sync and the sentinel knows it. Without the
// redis-server or redis-sentinel binary the test is skipped, or fails when
// RATEWINDOW_REQUIRE_REDIS=1.
func NewSentinel(t testing.TB) *Sentinel {
	t.Helper()
	needBinaries(t, "NewSentinel", serverBin, sentinelBin)
	shared.log.watch(t)
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()

	master := startT(t, "NewSentinel")
	replica := startT(t, "NewSentinel", "--replicaof", "127.0.0.1", master.port())
	if err := waitReplica(ctx, replica, master); err != nil {
		t.Fatalf("redistest.NewSentinel: %v%s%s", err, master.logTail(), replica.logTail())
	}

	// Started after the replica is attached: the sentinel learns about replicas
	// from the master's INFO, which it asks for at once and then every 10s.
	sentinel, err := launch(sentinelBin, func(dir string) (int, []string, error) {
		port, err := freePort()
		if err != nil {
			return 0, nil, err
		}
		// The sentinel rewrites its configuration file, so it gets one of its own.
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]s 1\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 3000\n", sentinelMaster, master.port())
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return 0, nil, err
		}
		return port, append([]string{conf},
			"--port", fmt.Sprint(port),
			"--bind", "127.0.0.1",
			"--protected-mode", "no",
			"--dir", dir,
		), nil
	})
	if err != nil {
		t.Fatalf("redistest.NewSentinel: %v", err)
	}
	t.Cleanup(sentinel.stop)

	s := &Sentinel{
		MasterName:    sentinelMaster,
		SentinelAddrs: []string{sentinel.Addr},
		Master:        master,
		Replica:       replica,
		sentinel:      sentinel,
	}
	if err := poll(ctx, func() error { return s.replicaKnown(replica.Addr) }); err != nil {
		t.Fatalf("redistest.NewSentinel: the sentinel does not know the replica: %v%s", err, sentinel.logTail())
	}
	return s
}

// startT starts a redis-server stopped at t.Cleanup.
func startT(t testing.TB, fn string, args ...string) *Process {
	t.Helper()
	p, err := startServer(args...)
	if err != nil {
		t.Fatalf("redistest.%s: %v", fn, err)
	}
	t.Cleanup(p.stop)
	return p
}

// Client returns a new failover client (redis.NewFailoverClient) for s, closed at
// t.Cleanup. It follows the master across Failover.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    s.MasterName,
		SentinelAddrs: s.SentinelAddrs,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Failover asks the sentinel to fail over (SENTINEL FAILOVER mymaster) and returns
// once the sentinel reports the replica's address as the master's and the
// replica has taken the master role. It then makes the former master a replica
// of the new one and waits until that replica is in sync, which the sentinel
// would otherwise do only some seconds later, so the former master takes no
// writes after Failover returns. Finally it swaps s.Master and s.Replica.
// Failover must not be called concurrently with itself or with reads of those
// fields.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	sentinel := s.SentinelAddrs[0]
	oldMaster, newMaster := s.Master, s.Replica

	// NOGOODSLAVE: the sentinel has not yet seen the replica healthy (right after
	// a previous failover); INPROG: a failover is still running.
	err := poll(ctx, func() error {
		_, err := command(sentinel, "SENTINEL", "FAILOVER", s.MasterName)
		var re *replyError
		if errors.As(err, &re) && !strings.HasPrefix(re.msg, "NOGOODSLAVE") && !strings.HasPrefix(re.msg, "INPROG") {
			return &permanentError{err}
		}
		return err
	})
	if err != nil {
		t.Fatalf("redistest: SENTINEL FAILOVER %s: %v%s", s.MasterName, err, s.sentinel.logTail())
	}
	err = poll(ctx, func() error {
		addr, err := s.masterAddr()
		if err != nil {
			return err
		}
		if addr != newMaster.Addr {
			return fmt.Errorf("the sentinel reports master %s, want %s", addr, newMaster.Addr)
		}
		return roleIs(newMaster, "master")
	})
	if err != nil {
		t.Fatalf("redistest: failover to %s: %v%s%s", newMaster.Addr, err, s.sentinel.logTail(), newMaster.logTail())
	}
	if _, err := command(oldMaster.Addr, "REPLICAOF", "127.0.0.1", newMaster.port()); err != nil {
		t.Fatalf("redistest: REPLICAOF on the former master %s: %v", oldMaster.Addr, err)
	}
	if err := waitReplica(ctx, oldMaster, newMaster); err != nil {
		t.Fatalf("redistest: failover: %v%s", err, oldMaster.logTail())
	}
	s.Master, s.Replica = newMaster, oldMaster
}

// masterAddr asks the sentinel for the master's address.
func (s *Sentinel) masterAddr() (string, error) {
	v, err := command(s.SentinelAddrs[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
	if err != nil {
		return "", err
	}
	if a, ok := v.([]any); ok && len(a) == 2 {
		host, hok := a[0].(string)
		port, pok := a[1].(string)
		if hok && pok {
			return net.JoinHostPort(host, port), nil
		}
	}
	return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: unexpected reply %v", v)
}

// replicaKnown returns nil when the sentinel lists addr as a replica it is
// connected to and does not consider down.
func (s *Sentinel) replicaKnown(addr string) error {
	v, err := command(s.SentinelAddrs[0], "SENTINEL", "REPLICAS", s.MasterName)
	if err != nil {
		return err
	}
	list, _ := v.([]any)
	for _, r := range list {
		fields, _ := r.([]any)
		m := map[string]string{}
		for i := 0; i+1 < len(fields); i += 2 {
			k, _ := fields[i].(string)
			v, _ := fields[i+1].(string)
			m[k] = v
		}
		if m["name"] != addr {
			continue
		}
		if strings.Contains(m["flags"], "down") || strings.Contains(m["flags"], "disconnected") {
			return fmt.Errorf("replica %s flags %s", addr, m["flags"])
		}
		return nil
	}
	return fmt.Errorf("the sentinel lists no replica %s", addr)
}

// waitReplica waits until replica reports a working link to master.
func waitReplica(ctx context.Context, replica, master *Process) error {
	err := poll(ctx, func() error {
		info, err := commandString(replica.Addr, "INFO", "replication")
		if err != nil {
			return err
		}
		host, _ := infoField(info, "master_host")
		port, _ := infoField(info, "master_port")
		link, _ := infoField(info, "master_link_status")
		if net.JoinHostPort(host, port) != master.Addr || link != "up" {
			return fmt.Errorf("replica %s: master %s:%s, link %q", replica.Addr, host, port, link)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s is not in sync with %s: %w", replica.Addr, master.Addr, err)
	}
	return nil
}

// roleIs returns nil when p reports role (INFO replication).
func roleIs(p *Process, role string) error {
	info, err := commandString(p.Addr, "INFO", "replication")
	if err != nil {
		return err
	}
	if got, _ := infoField(info, "role"); got != role {
		return fmt.Errorf("%s has role %s, want %s", p.Addr, got, role)
	}
	return nil
}
