package core

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestUnreachableRedisSaysWhy: with nothing listening at the address, the
// decisions' BackendErr soon names the refused dial (errors.Is finds
// ECONNREFUSED), not only the deadline or the open circuit, and carries
// the prefix once: on a Client (a dial by its Dialer) and on a Ring (a
// PING), without any hook on the client.
func TestUnreachableRedisSaysWhy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		rdb  func() redis.UniversalClient
	}{
		{"client", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) }}, // loopback, a closed port
		{"ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rdb := c.rdb()
			t.Cleanup(func() { rdb.Close() })
			hooks := &hookBuilds{}
			rdb.AddHook(hooks)
			built := hooks.process.Load()
			l, err := New(rdb)
			if err != nil {
				t.Fatal(err)
			}
			var last error
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				r, err := l.Allow(context.Background(), "k", PerMinute(1))
				if err != nil || r.BackendErr == nil || !r.Allowed {
					t.Fatalf("%+v %v, want a fail-open answer", r, err)
				}
				last = r.BackendErr
				if errors.Is(last, syscall.ECONNREFUSED) {
					break
				}
			}
			if !errors.Is(last, syscall.ECONNREFUSED) || !strings.Contains(last.Error(), "connection refused") {
				t.Fatalf("BackendErr %q does not say the dial was refused", last)
			}
			if n := strings.Count(last.Error(), "ratewindow: "); n != 1 {
				t.Fatalf("BackendErr %q has the prefix %d times", last, n)
			}
			if n := hooks.process.Load(); n != built {
				t.Fatalf("the client's hook chain was rebuilt %d times: a hook was added", n-built)
			}
		})
	}
}

// hookBuilds is a go-redis hook that counts how often the client builds
// its hook chain: go-redis asks every hook to wrap the chain again at each
// AddHook.
type hookBuilds struct{ process, dial atomic.Int64 }

func (h *hookBuilds) DialHook(next redis.DialHook) redis.DialHook {
	h.dial.Add(1)
	return next
}

func (h *hookBuilds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	h.process.Add(1)
	return next
}

func (h *hookBuilds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLimitersAddNoHooks: however many Limiters are made on one client,
// and whatever they decide, the client's hook chain stays as it was (a
// hook per Limiter made every command of the application's slower: 30,000
// Limiters took a PING from 25 µs to 754 µs), and the decisions still
// keep their deadline (see fault_test.go and timeout_test.go).
func TestLimitersAddNoHooks(t *testing.T) {
	t.Parallel()
	srv := redistest.New(t)
	for _, c := range []struct {
		name string
		rdb  func() redis.UniversalClient
	}{
		{"client", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }},
		{"client with ContextTimeoutEnabled", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		}},
		{"ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}})
		}},
		{"cluster", func() redis.UniversalClient { return redistest.NewCluster(t).Client(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := c.rdb()
			t.Cleanup(func() { rdb.Close() })
			hooks := &hookBuilds{}
			rdb.AddHook(hooks)
			process, dial := hooks.process.Load(), hooks.dial.Load()
			prefix := uniquePrefix(t)
			ctx := context.Background()
			limiters := make([]*Limiter, 2000)
			for i := range limiters {
				l, err := New(rdb, WithPrefix(prefix), WithTimeout(time.Second)) // no decision of a healthy Redis runs out of time on a loaded machine
				if err != nil {
					t.Fatal(err)
				}
				limiters[i] = l
			}
			// (counted before any call: go-redis builds the chain again for
			// each new connection's handshake too)
			if p, d := hooks.process.Load()-process, hooks.dial.Load()-dial; p != 0 || d != 0 {
				t.Fatalf("2000 Limiters rebuilt the client's hook chain %d times (dial %d): they added hooks", p, d)
			}
			for i, l := range limiters {
				if i%500 == 0 {
					if r, err := l.Allow(ctx, "k", PerHour(10)); err != nil || r.BackendErr != nil || !r.Allowed {
						t.Fatalf("Limiter %d: %+v %v", i, r, err)
					}
				}
			}
			if err := rdb.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
