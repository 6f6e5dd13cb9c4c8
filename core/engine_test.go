package core

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// Concurrent decisions through a Limiter, on a single server and on a
// Cluster: every decision exact.
func TestTransportLimiter(t *testing.T) {
	for _, c := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"single", func(t *testing.T) redis.UniversalClient { return redistest.New(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.NewCluster(t).Client(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := c.rdb(t)
			l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			lim := PerHour(40)
			if r, err := l.Allow(ctx, "lone", lim); err != nil || !r.Allowed || r.Remaining != 39 {
				t.Fatalf("lone call: %+v %v", r, err)
			}
			const goroutines, each, keys = 64, 10, 8
			admitted := make([]atomic.Int64, keys)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						k := (g + i) % keys
						r, err := l.Allow(ctx, fmt.Sprint("key-", k), lim)
						if err != nil {
							t.Error(err)
							return
						}
						if r.Allowed {
							admitted[k].Add(1)
						}
					}
				})
			}
			wg.Wait()
			for k := range admitted {
				if n := admitted[k].Load(); n != 40 {
					t.Errorf("key %d: %d admitted, want exactly 40", k, n)
				}
			}
		})
	}
}

// TestTransportKeepsDeadline: with a server that accepts connections and
// never answers, every call returns by its deadline, with every client type
// and whichever way it is sent: concurrent decisions (some alone, some
// queued) end by the Limiter's timeout (two at the start: the first
// timeout of a Redis that never answered goes again), and with a later
// Limiter's timeout, by the caller's own deadline.
func TestTransportKeepsDeadline(t *testing.T) {
	t.Parallel()
	addr := redistest.Silent(t)
	clients := []struct {
		name string
		new  func() redis.UniversalClient
	}{
		{"client", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr}) }},
		{"client/ContextTimeoutEnabled", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		}},
		{"cluster", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
		}},
		{"ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
		}},
		{"failover", func() redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{addr}})
		}},
	}
	const (
		timeout  = 100 * time.Millisecond
		deadline = 50 * time.Millisecond
		margin   = 250 * time.Millisecond
		callers  = 24 // three times the transport's lone in-flight limit
	)
	for _, c := range clients {
		for _, callerDeadline := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/caller deadline %v", c.name, callerDeadline), func(t *testing.T) {
				t.Parallel()
				rdb := c.new()
				t.Cleanup(func() { go rdb.Close() })
				// a decision runs out of time, then its health check waits
				// the silence (twice the timeout) for a reply; through a
				// silent Sentinel no connection is evidence: callTries calls
				// and checks, then a shed
				limiterTimeout, bound := timeout, 3*timeout+margin
				if c.name == "failover" {
					bound = callTries*3*timeout + margin
				}
				if callerDeadline {
					limiterTimeout, bound = time.Minute, deadline+margin
				}
				l, _ := faultLimiter(t, rdb, FailClosed, 1, WithTimeout(limiterTimeout))
				stalls := stall.Start(t)
				var wg sync.WaitGroup
				for i := range callers {
					wg.Go(func() {
						ctx := context.Background()
						if callerDeadline {
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, deadline)
							defer cancel()
						}
						start := time.Now()
						r, err := l.Allow(ctx, fmt.Sprint("k", i), PerMinute(4))
						beyond(t, stalls, time.Since(start), bound, fmt.Sprintf("decision %d", i))
						switch {
						case callerDeadline && !errors.Is(err, context.DeadlineExceeded):
							t.Errorf("decision %d: %+v %v, want the caller's deadline", i, r, err)
						case !callerDeadline && (err != nil || r.Allowed || !isBackendError(r.BackendErr)):
							t.Errorf("decision %d: %+v %v, want a fail-closed answer", i, r, err)
						}
					})
				}
				wg.Wait()
			})
		}
	}
}

// TestTransportRepliesAfterPause: decisions sent while the server is
// paused (CLIENT PAUSE), alone and queued, get their replies when it
// resumes, within a timeout longer than the pause: every decision exact.
func TestTransportRepliesAfterPause(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := PerHour(20)
	if _, err := l.Peek(ctx, "warm", lim); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", "300", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 32 { // four times the transport's lone in-flight limit
		wg.Go(func() {
			r, err := l.Allow(ctx, "k", lim)
			if err != nil || r.BackendErr != nil {
				t.Errorf("%+v %v", r, err)
			}
			if r.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 20 {
		t.Fatalf("%d admitted of %d, want 20", n, 32)
	}
}

// TestRedisAnsweredErrorsStayWithTheirKey: errors that Redis answered for
// one key (NOPERM from an ACL that forbids its keys; a script error on a
// key that holds another type) are that key's decisions' failures, answered
// by the failure mode; they open no circuit: every other key is decided by
// Redis meanwhile.
func TestRedisAnsweredErrorsStayWithTheirKey(t *testing.T) {
	t.Parallel()
	prefix := "acl:"
	lim := PerMinute(100)
	for _, c := range []struct {
		name string
		rdb  func(t *testing.T) *redis.Client
		want string
	}{
		{"NOPERM", func(t *testing.T) *redis.Client {
			return redistest.ACLClient(t, "resetkeys", "~"+prefix+"{ok*")
		}, "NOPERM"},
		{"script error", func(t *testing.T) *redis.Client {
			rdb := redistest.Start(t).Client(t)
			if err := rdb.Set(context.Background(), storageKey(keyTag(prefix, "bad"), lim), "a string", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			return rdb
		}, "WRONGTYPE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l, rec := faultLimiter(t, c.rdb(t), FailClosed, 1, WithPrefix(prefix), WithTimeout(patient))
			ctx := context.Background()
			for i := range 12 { // one after the other
				r, err := l.Allow(ctx, "bad", lim)
				if err != nil || r.Allowed || r.BackendErr == nil || !strings.Contains(r.BackendErr.Error(), c.want) {
					t.Fatalf("bad key, decision %d: %+v %v, want %s answered by fail-closed", i, r, err, c.want)
				}
			}
			for i := range 12 {
				r, err := l.Allow(ctx, fmt.Sprint("ok", i), lim)
				if err != nil || !r.Allowed || r.BackendErr != nil || r.Remaining != 99 {
					t.Fatalf("another key, decision %d: %+v %v, want Redis's answer", i, r, err)
				}
			}
			if c := tallyEvents(rec.take()); c.failed != 12 {
				t.Fatalf("observer: %+v, want %d failures (the bad key's)", c, 12)
			}
		})
	}
}

// TestPausedRedisHotKeyWaitersBounded: a hot key's cached denial expires
// while Redis is paused (CLIENT PAUSE from another client). One request
// asks Redis again (the probe) and the others wait for its answer: each
// decision is back within its bound (the timeout and the health check's
// silence, twice the timeout: the probe finds Redis silent), whatever its
// context says (none here).
func TestPausedRedisHotKeyWaitersBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const timeout = 400 * time.Millisecond
	l, _ := faultLimiter(t, srv.Client(t), FailOpen, 1, WithTimeout(timeout))
	ctx := context.Background()
	lim := PerHour(1)
	for range 2 { // the second is denied, and cached for an hour
		if _, err := l.Allow(ctx, "hot", lim); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Client(t).Do(context.Background(), "CLIENT", "UNPAUSE") })
	sh := l.cache.shard("hot") // the cached denial expires
	sh.mu.Lock()
	sh.m["hot"][0].until = 0
	sh.mu.Unlock()
	stalls := stall.Start(t)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			start := time.Now()
			r, err := l.Allow(ctx, "hot", lim)
			beyond(t, stalls, time.Since(start), 3*timeout+250*time.Millisecond, fmt.Sprintf("decision %d", i))
			if err != nil {
				t.Errorf("decision %d: %+v %v", i, r, err)
			}
		})
	}
	wg.Wait()
}

// TestGuardOutcomes: the one health rule, what a call's outcome says about
// Redis. A reply, or an error reply, shows Redis alive; a connection's
// failure is evidence at once (the node is down); a call out of time asks
// the health check: no reply to its PING is evidence, a reply sends the
// call again, callTries times at most, then it is shed.
func TestGuardOutcomes(t *testing.T) {
	serverErr := redistest.New(t).Client(t).Do(context.Background(), "NOSUCHCOMMAND").Err()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	timeout := fmt.Errorf("read: %w", os.ErrDeadlineExceeded)
	silent := fmt.Errorf("%w (200ms)", store.ErrSilent)
	for _, c := range []struct {
		name  string
		ctx   context.Context
		calls []error // the call's outcome, try by try (the last repeats)
		ping  error
		want  outcome
		tries int
		down  bool
	}{
		{"reply", context.Background(), []error{nil}, nil, succeeded, 1, false},
		{"error reply", context.Background(), []error{&store.Error{Replied: true, Err: serverErr}}, nil, rejected, 1, false},
		{"wrapped error reply", context.Background(), []error{fmt.Errorf("script: %w", &store.Error{Replied: true, Err: serverErr})}, nil, rejected, 1, false},
		{"unexpected reply", context.Background(), []error{ErrUnexpectedReply}, nil, rejected, 1, false},
		{"caller gone", gone, []error{context.Canceled}, nil, abandoned, 0, false},
		{"connection refused", context.Background(), []error{errors.New("dial tcp: connection refused")}, nil, failed, 1, true},
		{"timeout, the PING unanswered", context.Background(), []error{timeout}, silent, failed, 1, true},
		{"timeout, the PING's connection refused", context.Background(), []error{timeout}, errors.New("connection refused"), failed, 1, true},
		{"timeout, the PING answered, then a reply", context.Background(), []error{timeout, nil}, nil, succeeded, 2, false},
		{"timeout, the PING answered an error", context.Background(), []error{timeout, nil}, &store.Error{Replied: true, Err: serverErr}, succeeded, 2, false},
		{"timeouts, the PING answered each time", context.Background(), []error{timeout}, nil, shed, callTries, false},
		{"timeouts, the PING could not tell", context.Background(), []error{timeout}, context.DeadlineExceeded, shed, callTries, false},
		{"no connection free in the pool, the PING answered", context.Background(), []error{redis.ErrPoolTimeout}, nil, shed, callTries, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &fakeRemote{ping: c.ping}
			g := &guard{next: r, remote: r, budget: 100 * time.Millisecond}
			req := &store.Request{Key: "k", Deadline: time.Now().Add(100 * time.Millisecond)}
			tries := 0
			o, _ := g.call(c.ctx, req, callTries, func() error {
				tries++
				return c.calls[min(tries, len(c.calls))-1]
			})
			if o != c.want || tries != c.tries {
				t.Fatalf("outcome %d after %d calls, want %d after %d", o, tries, c.want, c.tries)
			}
			if down := g.one.down.Load() != nil; down != c.down {
				t.Fatalf("node down %v, want %v", down, c.down)
			}
			if c.down { // skipped at once, until a PING answers
				calls := tries
				if o, err := g.call(context.Background(), req, callTries, func() error { tries++; return nil }); o != failed || !errors.Is(err, ErrCircuitOpen) || tries != calls {
					t.Fatalf("while down: outcome %d, %v, %d calls", o, err, tries-calls)
				}
			}
		})
	}
}

// TestDownNodeRecovers: a node found down is checked again in the
// background after downFor, while the failure mode answers; once its PING
// is answered, or runs out of time (no evidence: a process short of CPU
// may not have run its dial), calls go to Redis again.
func TestDownNodeRecovers(t *testing.T) {
	for _, c := range []struct {
		name string
		ping error // the PING's after downFor
	}{
		{"the PING answered", nil},
		{"the PING could not tell", context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &fakeRemote{ping: errors.New("connection refused")}
			g := &guard{next: r, remote: r, budget: 100 * time.Millisecond}
			req := &store.Request{Key: "k"}
			if o, _ := g.call(context.Background(), req, callTries, func() error { return errors.New("connection refused") }); o != failed {
				t.Fatalf("outcome %d, want failed", o)
			}
			time.Sleep(downFor + 10*time.Millisecond)
			r.mu.Lock()
			r.ping = c.ping
			r.mu.Unlock()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				o, err := g.call(context.Background(), req, callTries, func() error { return nil })
				if o == succeeded {
					return
				}
				if o != failed || !errors.Is(err, ErrCircuitOpen) || time.Now().After(deadline) {
					t.Fatalf("outcome %d, %v: want the open circuit, then Redis", o, err)
				}
			}
		})
	}
}

// fakeRemote is a Redis store without a server: its Ping answers ping; a
// test calls the guard with calls of its own.
type fakeRemote struct {
	store.Remote
	mu   sync.Mutex
	ping error
}

func (r *fakeRemote) Node(string) string { return "" }
func (r *fakeRemote) Ping(context.Context, string, time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ping
}

// TestClusterBreakerPerMaster: one master stops answering (CLIENT PAUSE):
// decisions on its keys time out until its breaker opens, and are then
// answered by the failure mode at once; keys on the other masters are
// decided by Redis all along.
func TestClusterBreakerPerMaster(t *testing.T) {
	_, cc := settledCluster(t)
	prefix := uniquePrefix(t)
	l, _ := faultLimiter(t, cc, FailClosed, 1, WithPrefix(prefix))
	ctx := context.Background()
	lim := PerMinute(1000)
	paused, err := cc.MasterForKey(ctx, storageKey(keyTag(prefix, "k"), lim))
	if err != nil {
		t.Fatal(err)
	}
	var elsewhere []string // keys of the other masters
	for i := 0; len(elsewhere) < 20; i++ {
		key := fmt.Sprint("other-", i)
		m, err := cc.MasterForKey(ctx, storageKey(keyTag(prefix, key), lim))
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr != paused.Options().Addr {
			elsewhere = append(elsewhere, key)
		}
	}
	for _, key := range append([]string{"k"}, elsewhere...) { // every master has answered
		if r, err := l.Allow(ctx, key, lim); err != nil || r.BackendErr != nil {
			t.Fatalf("%s before the pause: %+v %v", key, r, err)
		}
	}
	if err := paused.Do(ctx, "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { paused.Do(context.Background(), "CLIENT", "UNPAUSE") })
	// the other masters keep answering meanwhile: their replies say
	// nothing of the paused one
	stop, busy := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				busy <- nil
				return
			default:
			}
			if r, err := l.Allow(ctx, elsewhere[i%len(elsewhere)], PerHour(MaxLogCount)); err != nil || r.BackendErr != nil {
				busy <- fmt.Errorf("another master during the pause: %+v %v", r, err)
				return
			}
		}
	}()
	// the paused master is found down by its first decision's health check
	for i := 0; ; i++ {
		r, err := l.Allow(ctx, "k", lim)
		if err != nil || r.BackendErr == nil || r.Allowed {
			t.Fatalf("decision %d on the paused master: %+v %v, want a fail-closed answer", i, r, err)
		}
		if errors.Is(r.BackendErr, ErrCircuitOpen) {
			break
		}
		if i >= 20 {
			t.Fatalf("the paused master's breaker is not open after %d decisions: %v", i+1, r.BackendErr)
		}
	}
	close(stop)
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	for _, key := range elsewhere {
		if r, err := l.Allow(ctx, key, lim); err != nil || r.BackendErr != nil || !r.Allowed || r.Remaining != 998 {
			t.Fatalf("%s on another master: %+v %v, want Redis's answer", key, r, err)
		}
	}
}
