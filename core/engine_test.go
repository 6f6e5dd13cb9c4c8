package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/redisstore"
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
				limiterTimeout, bound := timeout, 2*timeout+margin
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
			for i := range 4 * breakerFailures { // one after the other
				r, err := l.Allow(ctx, "bad", lim)
				if err != nil || r.Allowed || r.BackendErr == nil || !strings.Contains(r.BackendErr.Error(), c.want) {
					t.Fatalf("bad key, decision %d: %+v %v, want %s answered by fail-closed", i, r, err, c.want)
				}
			}
			for i := range 4 * breakerFailures {
				r, err := l.Allow(ctx, fmt.Sprint("ok", i), lim)
				if err != nil || !r.Allowed || r.BackendErr != nil || r.Remaining != 99 {
					t.Fatalf("another key, decision %d: %+v %v, want Redis's answer", i, r, err)
				}
			}
			if c := tallyEvents(rec.take()); c.failed != 4*breakerFailures {
				t.Fatalf("observer: %+v, want %d failures (the bad key's)", c, 4*breakerFailures)
			}
		})
	}
}

// TestPausedRedisHotKeyWaitersBounded: a hot key's cached denial expires
// while Redis is paused (CLIENT PAUSE from another client). One request
// asks Redis again (the probe) and the others wait for its answer: each
// decision is back within its bound (twice the timeout: a waiter that
// becomes the next probe), whatever its context says (none here).
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
			beyond(t, stalls, time.Since(start), timeout+250*time.Millisecond, fmt.Sprintf("decision %d", i))
			if err != nil {
				t.Errorf("decision %d: %+v %v", i, r, err)
			}
		})
	}
	wg.Wait()
}

// starved, as TestGuardKinds' spent budget, stands for a process short of
// CPU since the call was sent (and a budget of 100ms).
const starved = -1

// TestGuardKinds: the one health rule, what a call's outcome says about
// Redis. A reply, or an error reply of the server, shows Redis alive; no
// reply is overload when Redis answered this client since the call was
// sent, else a timeout or a connection failure, which the breaker counts;
// a timeout while this process was short of CPU is overload when Redis
// answered before and fell silent (if it did) less than a budget before.
func TestGuardKinds(t *testing.T) {
	serverErr := redistest.New(t).Client(t).Do(context.Background(), "NOSUCHCOMMAND").Err()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name     string
		ctx      context.Context
		err      error
		answered int // 0: never; 1: before the call; 2: since; 3: a second before
		want     kind
		counted  bool          // the breaker counts it
		spent    time.Duration // of the decision's 100ms budget before its call
	}{
		{"reply", context.Background(), nil, 0, succeeded, false, 0},
		{"error reply", context.Background(), &store.Error{Replied: true, Err: serverErr}, 0, rejected, false, 0},
		{"wrapped error reply", context.Background(), fmt.Errorf("script: %w", &store.Error{Replied: true, Err: serverErr}), 2, rejected, false, 0},
		{"unexpected reply", context.Background(), ErrUnexpectedReply, 1, rejected, false, 0},
		{"caller gone", gone, context.Canceled, 1, abandoned, false, 0},
		{"timeout, answered since", context.Background(), context.DeadlineExceeded, 2, overloaded, false, 0},
		{"timeout, answered before", context.Background(), context.DeadlineExceeded, 1, timedOut, true, 0},
		{"read timeout, never answered", context.Background(), fmt.Errorf("read: %w", os.ErrDeadlineExceeded), 0, timedOut, true, 0},
		{"network, answered before", context.Background(), errors.New("connection refused"), 1, failed, true, 0},
		// the budget went by before the call (waiting on another's probe):
		// Redis answered since the decision began
		{"budget spent, answered since the decision began", context.Background(), context.DeadlineExceeded, 1, overloaded, false, 100 * time.Millisecond},
		{"budget half spent, answered since the decision began", context.Background(), context.DeadlineExceeded, 1, overloaded, false, 50 * time.Millisecond},
		{"budget spent, never answered", context.Background(), context.DeadlineExceeded, 0, timedOut, true, 100 * time.Millisecond},
		// this process was short of CPU since the call was sent (starved):
		// its reply may have waited to be read
		{"timeout, answered a moment before, starved", context.Background(), context.DeadlineExceeded, 1, overloaded, false, starved},
		{"timeout, answered a second before, starved", context.Background(), context.DeadlineExceeded, 3, overloaded, false, starved},
		{"timeout, never answered, starved", context.Background(), context.DeadlineExceeded, 0, timedOut, false, starved},
		// Redis fell silent a budget before: a call sent then went unanswered
		{"timeout, answered a second before, silent a budget, starved", context.Background(), context.DeadlineExceeded, 4, timedOut, false, starved},
		{"network, never answered, starved", context.Background(), errors.New("connection refused"), 0, failed, true, starved},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "kinds:")
			r := &fakeRemote{Remote: rs}
			r.now.Store(int64(time.Second)) // the decision began after the clock's start
			g := &guard{next: r, remote: r}
			switch c.answered {
			case 1:
				r.answer()
			case 3, 4:
				r.reply.Store(1) // the clock reads a second now
			}
			var began time.Time
			switch {
			case c.spent == starved:
				g.budget = 100 * time.Millisecond
				g.cpu.long = math.MaxInt64 // a goroutine waited to run since every call
			case c.spent > 0: // (no budget else: the CPU rule stays out)
				g.budget = 100 * time.Millisecond
				began = time.Now().Add(-c.spent)
			}
			a, err := g.begin("k", began)
			if err != nil {
				t.Fatal(err)
			}
			switch c.answered {
			case 2:
				r.answer()
			case 4:
				g.br.silence.Store(a.sent - int64(g.budget))
			}
			if k, _ := g.end(c.ctx, a, c.err); k != c.want {
				t.Fatalf("kind %d, want %d", k, c.want)
			}
			counted := c.counted && !(c.spent > 0 && g.cpu.long >= a.sent) // (a loaded machine may starve the process)
			if n := g.br.failures.Load(); n != map[bool]int32{true: 1}[counted] {
				t.Fatalf("the breaker counted %d failures, want counted %v", n, c.counted)
			}
		})
	}
}

// fakeRemote is a Redis store whose clock and replies a test sets: each
// reading of Clock advances it, answer notes a reply now.
type fakeRemote struct {
	store.Remote
	now, reply atomic.Int64
}

func (r *fakeRemote) Clock() int64                            { return r.now.Add(1) }
func (r *fakeRemote) answer()                                 { r.reply.Store(r.Clock()) }
func (r *fakeRemote) AnsweredSince(_ string, sent int64) bool { return r.reply.Load() >= sent }
func (r *fakeRemote) Node(string) string                      { return "" }

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
	// the paused master's breaker opens after breakerFailures timeouts in a
	// row, more when the process was short of CPU (a timeout then is not
	// counted: see cpuMeter)
	start := storeClock(l)
	for i := 0; ; i++ {
		r, err := l.Allow(ctx, "k", lim)
		if err != nil || r.BackendErr == nil || r.Allowed {
			t.Fatalf("decision %d on the paused master: %+v %v, want a fail-closed answer", i, r, err)
		}
		if errors.Is(r.BackendErr, ErrCircuitOpen) {
			break
		}
		if i >= 2*breakerFailures && (!starvedAfter(l, start) || i >= 20) {
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
