package core

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// fillPastMaxmemory makes the server of c refuse writes: a 1 MB value,
// then maxmemory below the memory used, under noeviction.
func fillPastMaxmemory(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	if err := c.Set(ctx, "ballast", strings.Repeat("x", 1<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1mb"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// requirePassword makes the server of c require the password "pw" from
// new connections (c's own stays authenticated).
func requirePassword(t *testing.T, c *redis.Client) {
	t.Helper()
	if err := c.ConfigSet(context.Background(), "requirepass", "pw").Err(); err != nil {
		t.Fatal(err)
	}
}

// replicate makes p a replica of a new server, and returns when the
// replication link is up.
func replicate(t *testing.T, p *redistest.Process) {
	t.Helper()
	ctx := context.Background()
	master := redistest.Start(t)
	host, port, _ := strings.Cut(master.Addr, ":")
	c := p.Client(t)
	if err := c.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica of %s is not up after 30s: %v %s", master.Addr, err, info)
		}
	}
}

// TestDecisionExplainsRefusal: a decision that Redis refuses until someone
// acts on it (out of memory under noeviction, a read-only replica, no
// password) is answered by the failure mode with a BackendErr that says
// what happened and what to do, and keeps Redis's reply in the chain.
func TestDecisionExplainsRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, p *redistest.Process) *redis.Client
		want  error  // a sentinel BackendErr matches, or nil
		says  string // BackendErr's text
		reply string // the start of Redis's reply in it
	}{
		{"out of memory", func(t *testing.T, p *redistest.Process) *redis.Client {
			fillPastMaxmemory(t, p.Client(t))
			return p.Client(t)
		}, ErrNoWrites, "ratewindow: allow script: redis refuses writes: its used memory is above maxmemory, and its maxmemory-policy (noeviction, as the Limiter needs) evicts nothing: raise maxmemory or free memory: ", "OOM command not allowed when used memory > 'maxmemory'"},
		{"read-only replica", func(t *testing.T, p *redistest.Process) *redis.Client {
			replicate(t, p)
			return p.Client(t)
		}, ErrNoWrites, "ratewindow: allow script: redis refuses writes: the server is a read-only replica: connect to the master (a failover or Cluster client follows it): ", "READONLY"},
		{"no password", func(t *testing.T, p *redistest.Process) *redis.Client {
			requirePassword(t, p.Client(t))
			c := redis.NewClient(&redis.Options{Addr: p.Addr})
			t.Cleanup(func() { c.Close() })
			return c
		}, nil, "ratewindow: allow script: redis requires authentication (NOAUTH): set the client's Password (and Username for an ACL user): ", "NOAUTH Authentication required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := redistest.Start(t)
			// a long timeout: the answer is Redis's refusal, never a slow
			// moment of a loaded machine
			l, err := New(c.setup(t, p), WithPrefix(uniquePrefix(t)), WithTimeout(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			// the first decisions fail with the refusal, the next ones
			// with the open circuit (after 3 failures), which names it
			for i := range 6 {
				r, err := l.Allow(ctx, "k", PerMinute(3), PerHour(10))
				if err != nil || !r.Allowed || r.BackendErr == nil {
					t.Fatalf("Allow %d: %+v %v, want a fail-open answer", i, r, err)
				}
				got := r.BackendErr.Error()
				if !strings.HasPrefix(got, c.says+c.reply) && !(errors.Is(r.BackendErr, ErrCircuitOpen) &&
					strings.HasPrefix(got, "ratewindow: redis unavailable, circuit open (the last call failed ") &&
					strings.Contains(got, " ago: "+c.says[len("ratewindow: allow script: "):]+c.reply)) {
					t.Fatalf("Allow %d: BackendErr:\n got %s\nwant %s%s...\n  or the open circuit naming it", i, got, c.says, c.reply)
				}
				if c.want != nil && !errors.Is(r.BackendErr, c.want) {
					t.Fatalf("Allow %d: BackendErr %q does not match %v", i, got, c.want)
				}
				if c.want == nil && errors.Is(r.BackendErr, ErrNoWrites) {
					t.Fatalf("Allow %d: BackendErr %q matches ErrNoWrites", i, got)
				}
				if re := redis.Error(nil); !errors.As(r.BackendErr, &re) || !strings.HasPrefix(re.Error(), c.reply) {
					t.Fatalf("Allow %d: BackendErr %q does not hold Redis's reply %q", i, got, c.reply)
				}
			}
		})
	}
}

// TestReadOnlyAnsweredAtOnce: a read-only replica's READONLY, which
// go-redis retries after its backoff, comes back to a decision at once:
// the failure mode answers with ErrNoWrites and Redis's reply, the breaker
// stays closed. A client whose backoff outlasts the timeout lost the reply
// at the deadline: "context deadline exceeded", counted by the breaker.
func TestReadOnlyAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t)
	replicate(t, p)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MinRetryBackoff: 5 * time.Second, MaxRetryBackoff: 5 * time.Second})
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		r, err := l.Allow(context.Background(), "k", PerMinute(3))
		if err != nil || !r.Allowed || !errors.Is(r.BackendErr, ErrNoWrites) || !strings.Contains(r.BackendErr.Error(), "READONLY") {
			t.Fatalf("Allow %d: %+v %v, want a fail-open answer with ErrNoWrites and READONLY", i, r, err)
		}
	}
}
