package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// commandCounter counts the script calls a client has answered, alone and
// in pipelines, and the script round trips it has in flight at once.
type commandCounter struct {
	alone, piped, pipelines atomic.Int64

	mu                     sync.Mutex
	inFlight, mostInFlight int // round trips, alone and in pipelines
	pipesNow, mostPipes    int // of them pipelines
}

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandCounter) enter(pipeline bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inFlight++
	h.mostInFlight = max(h.mostInFlight, h.inFlight)
	if pipeline {
		h.pipesNow++
		h.mostPipes = max(h.mostPipes, h.pipesNow)
	}
}

func (h *commandCounter) leave(pipeline bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inFlight--
	if pipeline {
		h.pipesNow--
	}
}

// most returns the most round trips, and pipelines, in flight at once.
func (h *commandCounter) most() (roundTrips, pipelines int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mostInFlight, h.mostPipes
}

func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isScriptCall(cmd) {
			return next(ctx, cmd)
		}
		h.enter(false)
		err := next(ctx, cmd)
		h.leave(false)
		if answeredScript(cmd, err) {
			h.alone.Add(1)
		}
		return err
	}
}

func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, isScriptCall) { // a connection's set-up
			return next(ctx, cmds)
		}
		h.enter(true)
		err := next(ctx, cmds)
		h.leave(true)
		scripts := 0
		for _, cmd := range cmds {
			if answeredScript(cmd, cmd.Err()) {
				scripts++
			}
		}
		if scripts > 0 { // not all answered NOSCRIPT, sent again
			h.pipelines.Add(1)
			h.piped.Add(int64(scripts))
		}
		return err
	}
}

// isScriptCall reports whether cmd runs a script: EVALSHA, EVAL or FCALL.
func isScriptCall(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval" || n == "fcall"
}

// answeredScript reports whether cmd is a script call that ran (not one
// answered NOSCRIPT, which is sent again).
func answeredScript(cmd redis.Cmder, err error) bool {
	return isScriptCall(cmd) && !redis.HasErrorPrefix(err, "NOSCRIPT") && !functionMissing(err)
}

// allowCallFor builds the batcher call of one Allow of key on limits.
func allowCallFor(s *redisStore, key string, limits ...Limit) *call {
	c := s.allowCall(&query{key: key, n: 1, limits: limits, commit: true})
	c.ctx = context.Background()
	return c
}

// sendAll sends calls as one batch and returns each caller's outcome.
func sendAll(s *redisStore, calls []*call) ([]Result, []error) {
	s.batch.send(calls)
	rs, errs := make([]Result, len(calls)), make([]error, len(calls))
	for i, c := range calls {
		<-c.done
		errs[i] = c.err
		if c.err == nil {
			q := &query{limits: []Limit{PerMinute(3)}}
			if errs[i] = parseAllow(c.reply, q); errs[i] == nil {
				rs[i] = q.result()
			}
		}
	}
	return rs, errs
}

// One batch of decisions on many keys, with three on one key: every
// decision exact, on a single server (one merged script call) and on a
// Cluster (a pipeline that go-redis splits per node), before and after the
// server forgets its scripts.
func TestBatchSend(t *testing.T) {
	single := redistest.Start(t)
	clients := []struct {
		name string
		rdb  redis.Scripter
		// one merged command, or one command per call
		wantPiped int64
		flush     func() error
	}{
		{"single", single.Client(t), 1, func() error { return single.Client(t).ScriptFlush(context.Background()).Err() }},
		{"cluster", redistest.NewCluster(t).Client(t), 12, nil},
	}
	for _, cl := range clients {
		t.Run(cl.name, func(t *testing.T) {
			counter := &commandCounter{}
			cl.rdb.(interface{ AddHook(redis.Hook) }).AddHook(counter)
			s := newRedisStore(cl.rdb, uniquePrefix(t), 0)
			for round := range 2 {
				if round == 1 && cl.flush != nil {
					if err := cl.flush(); err != nil { // NOSCRIPT: sent again as EVAL
						t.Fatal(err)
					}
				}
				before := counter.piped.Load()
				var calls []*call
				for i := range 8 {
					calls = append(calls, allowCallFor(s, fmt.Sprintf("k%d-%d", round, i), PerMinute(3)))
				}
				for range 4 {
					calls = append(calls, allowCallFor(s, fmt.Sprintf("hot-%d", round), PerMinute(3)))
				}
				rs, errs := sendAll(s, calls)
				for i := range calls {
					wantRemaining := int64(2)
					if i >= 8 {
						wantRemaining = max(2-int64(i-8), 0)
					}
					if errs[i] != nil || rs[i].Allowed != (i < 11) || rs[i].Remaining != wantRemaining {
						t.Fatalf("round %d call %d: %+v %v", round, i, rs[i], errs[i])
					}
				}
				if piped := counter.piped.Load() - before; piped != cl.wantPiped {
					t.Fatalf("round %d: %d pipelined commands, want %d", round, piped, cl.wantPiped)
				}
			}
		})
	}
}

// A merged script call in which decisions fail (their key holds another
// type) answers those callers with Redis's error, and the others as usual:
// read as []any (EVALSHA) and as []int64 (FCALL, the library loaded). The
// failed decisions go again alone, one round trip for a run of them on
// one key.
func TestBatchMergedError(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	names := newScriptNames()
	rdb.AddHook(names)
	s := newRedisStore(rdb, uniquePrefix(t), 0)
	lim := PerMinute(30)
	for _, key := range []string{"bad", "worse"} {
		bad := storageKey(keyTag(s.prefix, key), lim)
		if err := rdb.Set(context.Background(), bad, "not a sliding log", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, sc := range []*script{s.allowS, s.allowBatchS} {
		if err := rdb.ScriptLoad(ctx, sc.src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s.batch.lib.state.Store(libraryUnusable) // EVALSHA, as without functions
	for _, phase := range []string{"evalsha", "fcall"} {
		if phase == "fcall" {
			s.batch.lib.state.Store(libraryUnloaded)
			s.batch.lib.usable() // starts the load
			if st := waitLibrary(t, s.batch.lib); st != libraryLoaded {
				t.Fatalf("the library's state is %d, want loaded", st)
			}
		}
		keys := []string{"a", "bad", "bad", "bad", "b", "worse", "c"}
		calls := make([]*call, len(keys))
		for i, k := range keys {
			calls[i] = allowCallFor(s, k, lim)
		}
		names.take()
		ints := names.ints.Load()
		rs, errs := sendAll(s, calls)
		for i, k := range keys {
			if strings.HasPrefix(k, "bad") || k == "worse" {
				if errs[i] == nil || !strings.Contains(errs[i].Error(), "WRONGTYPE") {
					t.Fatalf("%s: call %d (%s): %v, want WRONGTYPE", phase, i, k, errs[i])
				}
				continue
			}
			if errs[i] != nil || !rs[i].Allowed {
				t.Fatalf("%s: call %d (%s): %+v %v", phase, i, k, rs[i], errs[i])
			}
		}
		// the merged call, then one decision of the bad run and the worse
		// one, alone
		if got := strings.Join(names.take(), " "); got != phase+" "+phase+" "+phase {
			t.Fatalf("%s: sent %q, want the merged call and two alone", phase, got)
		}
		if got, want := names.ints.Load()-ints, map[string]int64{"evalsha": 0, "fcall": 3}[phase]; got != want {
			t.Fatalf("%s: %d calls read as []int64, want %d", phase, got, want)
		}
	}
}

// A call that finds nothing in flight goes out at once, alone, without a
// pipeline; concurrent calls share pipelines; every decision is exact.
func TestBatchLimiter(t *testing.T) {
	for _, c := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"single", func(t *testing.T) redis.UniversalClient { return redistest.New(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.NewCluster(t).Client(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := c.rdb(t)
			counter := &commandCounter{}
			rdb.AddHook(counter)
			// no timeout: every call goes through rdb and its hooks (a lone
			// call bounded by the timeout goes by rdb's clone, which runs no
			// hooks)
			l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(0))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			lim := PerHour(40)
			if r, err := l.Allow(ctx, "lone", lim); err != nil || !r.Allowed || r.Remaining != 39 {
				t.Fatalf("lone call: %+v %v", r, err)
			}
			if counter.alone.Load() != 1 || counter.pipelines.Load() != 0 {
				t.Fatalf("lone call: %d commands alone, %d pipelines; want 1 and 0", counter.alone.Load(), counter.pipelines.Load())
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
			if counter.pipelines.Load() == 0 {
				t.Errorf("%d concurrent decisions shared no pipeline", goroutines*each)
			}
		})
	}
}

// Several pipelines go at once when calls keep queuing (a flusher for
// each slot handed over), never more pipelines than maxInFlight nor more
// round trips than maxLone, and the flushers leave when the work ends,
// every slot given back.
func TestBatchFlushers(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	rec := &commandCounter{}
	rdb.AddHook(rec)
	s := newRedisStore(rdb, uniquePrefix(t), 0)
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for round := 0; ; round++ {
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				for i := range 20 {
					q := &query{key: fmt.Sprint("k", (g+i)%16), n: 1, limits: []Limit{PerHour(1 << 30)}, commit: true}
					if err := s.allow(ctx, q); err != nil || !q.allowed {
						t.Errorf("allow: %v, allowed %v", err, q.allowed)
						return
					}
				}
			})
		}
		wg.Wait()
		most, mostPiped := rec.most()
		pipes := rec.pipelines.Load()
		if most > maxLone || mostPiped > maxInFlight {
			t.Fatalf("%d round trips in flight at once, %d pipelines; want at most %d and %d", most, mostPiped, maxLone, maxInFlight)
		}
		if mostPiped >= 2 {
			t.Logf("%d pipelines at once at most, %d in all, in %d rounds", mostPiped, pipes, round+1)
			break
		}
		if t.Failed() || time.Now().After(deadline) {
			t.Fatalf("never more than %d pipeline in flight at once (%d pipelines, %d rounds)", mostPiped, pipes, round+1)
		}
	}
	for { // every flusher leaves after flusherIdle
		s.batch.mu.Lock()
		running, flushing, inflight := s.batch.running, s.batch.flushing, s.batch.inflight
		s.batch.mu.Unlock()
		if running == 0 && flushing == 0 && inflight == 0 {
			break
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatalf("idle: %d flushers, %d slots held by them, %d in flight; want none", running, flushing, inflight)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A queued call keeps its caller's deadline while the round trip in flight
// is stuck (the server paused), and its error says so.
func TestBatchKeepsDeadline(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := newRedisStore(rdb, uniquePrefix(t), 0)
	ctx := context.Background()
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", "600", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, maxLone)
	for i := 0; i < maxLone; i++ {
		go func() { // in flight for the whole pause: every slot taken
			err := s.allow(ctx, &query{key: "a", n: 1, limits: []Limit{PerMinute(3)}, commit: true})
			first <- err
		}()
	}
	for { // wait until every slot is in flight
		s.batch.mu.Lock()
		full := s.batch.inflight == maxLone
		s.batch.mu.Unlock()
		if full {
			break
		}
		time.Sleep(time.Millisecond)
	}
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	stalls := stall.Start(t)
	start := time.Now()
	err := s.allow(dctx, &query{key: "b", n: 1, limits: []Limit{PerMinute(3)}, commit: true})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued call: %v, want the deadline", err)
	}
	beyond(t, stalls, time.Since(start), 400*time.Millisecond, "a queued call (deadline 50ms)")
	for i := 0; i < maxLone; i++ {
		if err := <-first; err != nil {
			t.Fatalf("a call in flight: %v", err)
		}
	}
}

// TestBatchHeard: a reply or an error reply of the server shows Redis
// alive; a network error or a timeout does not. A call whose time ran out
// while Redis answered in the second half of its wait is marked starved
// (the breaker does not count it), one that heard nothing is not.
func TestBatchHeard(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	serverErr := rdb.Do(ctx, "NOSUCHCOMMAND").Err()
	for _, c := range []struct {
		name  string
		err   error
		heard bool
	}{
		{"reply", nil, true},
		{"error reply", serverErr, true},
		{"wrapped error reply", fmt.Errorf("script: %w", serverErr), true},
		{"timeout", context.DeadlineExceeded, false},
		{"network", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBatcher(rdb, 0)
			if got := b.answered(c.err); got != c.heard || (b.heard.Load() != 0) != c.heard {
				t.Fatalf("answered(%v) = %v, heard %d; want %v", c.err, got, b.heard.Load(), c.heard)
			}
		})
	}
	t.Run("second half", func(t *testing.T) {
		b := newBatcher(rdb, 0)
		sent := time.Since(b.born)
		cctx, cancel := context.WithDeadline(ctx, b.born.Add(sent+100*time.Millisecond))
		defer cancel()
		b.heard.Store(int64(sent + 40*time.Millisecond))
		if b.answeredSince(cctx, sent) {
			t.Fatal("a reply in the first half of the wait counted")
		}
		b.heard.Store(int64(sent + 60*time.Millisecond))
		if !b.answeredSince(cctx, sent) {
			t.Fatal("a reply in the second half of the wait did not count")
		}
	})
}

// With a client that does not bound its reads by the context (go-redis's
// default), a lone decision whose deadline is the Limiter's timeout is
// sent on its caller's goroutine by the client's clone whose reads end
// then, which runs none of the client's hooks: a hook on the client does
// not see it. A caller's sooner deadline, a client that bounds its reads,
// a Cluster, and a second after a direct call ran out of time in a
// starved process send through the client itself, seen by its hooks. The
// answers are the same.
func TestLoneCall(t *testing.T) {
	srv := redistest.New(t)
	for _, c := range []struct {
		name     string
		rdb      func() redis.UniversalClient
		deadline time.Duration // the caller's; 0: none
		starved  bool          // a direct call just ran out of time, starved
		want     bool          // sent by the clone
	}{
		{"just starved", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }, 0, true, false},
		{"default client", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }, 0, false, true},
		{"caller's later deadline", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }, time.Hour, false, true},
		{"caller's sooner deadline", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }, time.Second, false, false},
		{"ContextTimeoutEnabled", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		}, 0, false, false},
		{"cluster", func() redis.UniversalClient { return redistest.NewCluster(t).Client(t) }, 0, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := c.rdb()
			t.Cleanup(func() { rdb.Close() })
			seen := &scriptCounter{}
			rdb.AddHook(seen)
			l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if c.starved { // starved a moment ago, as it stands for the whole test
				b := l.store.(*redisStore).batch
				b.starved.Store(int64(time.Since(b.born) + time.Minute))
			}
			ctx := context.Background()
			if c.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.deadline)
				defer cancel()
			}
			lim := PerHour(3)
			for i, want := range []bool{true, true, true, false} {
				r, err := l.Allow(ctx, "k", lim)
				if err != nil || r.Allowed != want || r.BackendErr != nil {
					t.Fatalf("decision %d: %+v %v, want allowed %v", i, r, err, want)
				}
			}
			want := int64(4)
			if c.want {
				want = 0
			}
			if n := seen.n.Load(); n != want {
				t.Fatalf("the client's hook saw %d script calls, want %d (sent by the clone: %v)", n, want, c.want)
			}
		})
	}
}
