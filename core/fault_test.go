package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// The fault tests start real servers, break them, and check what every
// failure mode answers, that the observer hears of it, and how long the
// slowest decision took during the fault (logged for the README).

// obsRecorder is an Observer that keeps every event.
type obsRecorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *obsRecorder) observe(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// count returns how many events it holds; after, those after the first n.
func (r *obsRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func (r *obsRecorder) after(n int) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events[min(n, len(r.events)):])
}

// take returns the events so far and forgets them.
func (r *obsRecorder) take() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// eventTally counts events.
type eventTally struct{ total, failed, shed, cacheHits, allowed int }

func tallyEvents(events []Event) eventTally {
	var c eventTally
	for _, e := range events {
		c.total++
		if e.Failed {
			c.failed++
		}
		if e.Shed {
			c.shed++
		}
		if e.CacheHit {
			c.cacheHits++
		}
		if e.Result.Allowed {
			c.allowed++
		}
	}
	return c
}

// slowest keeps the longest duration it is given.
type slowest struct{ ns atomic.Int64 }

func (w *slowest) add(d time.Duration) {
	for {
		cur := w.ns.Load()
		if int64(d) <= cur || w.ns.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

func (w *slowest) get() time.Duration { return time.Duration(w.ns.Load()) }

// faultAllow is Allow, timed. Its error is the call's own when it made no
// decision, else the failure that the failure mode answered
// (Result.BackendErr). A Redis failure returned as the call's error breaks
// the contract: it comes back as an error that is no backend error.
func faultAllow(ctx context.Context, l *Limiter, key string, limits ...Limit) (Result, error, time.Duration) {
	start := time.Now()
	r, err := l.Allow(ctx, key, limits...)
	d := time.Since(start)
	switch {
	case err != nil && isBackendError(err):
		return r, fmt.Errorf("Allow returned the backend error %q instead of a decision", err), d
	case err != nil:
		return r, err, d
	}
	return r, r.BackendErr, d
}

// failureCase is a failure mode and what it answers the i-th request (from
// 0) of one key under PerMinute(4) while Redis is down, with a local share
// of 1/2 for FailLocal: 2 admitted.
type failureCase struct {
	mode   FailureMode
	expect func(i int, r Result) bool
}

var failureCases = []failureCase{
	{FailOpen, func(_ int, r Result) bool { return r.Allowed && r.Remaining == 3 && r.RetryAfter == 0 }},
	{FailClosed, func(_ int, r Result) bool { return !r.Allowed && r.RetryAfter == time.Second }},
	{FailLocal, func(i int, r Result) bool { return r.Allowed == (i < 2) && r.Limit.Count == 2 }},
}

// patient is the timeout of tests that expect Redis to answer: long enough
// for a loaded CI machine, where a loopback call may take over 100ms.
const patient = 2 * time.Second

func faultLimiter(t *testing.T, rdb redis.Scripter, mode FailureMode, share float64, opts ...Option) (*Limiter, *obsRecorder) {
	t.Helper()
	rec := &obsRecorder{}
	opts = append([]Option{WithPrefix(uniquePrefix(t)), WithFailureMode(mode), WithLocalShare(share), WithObserver(rec.observe)}, opts...)
	l, err := New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, rec
}

// TestFaultSilentServer: a server that accepts connections and never
// answers costs every decision at most the timeout, within the margin,
// with every client type and default client options; the failure mode
// answers, with an error, and the observer hears of each.
func TestFaultSilentServer(t *testing.T) {
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
		{"failover", func() redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{addr}})
		}},
	}
	const timeout = DefaultTimeout
	// the bound: a hang would cost 5s (go-redis's own timeouts); the
	// margin covers a CI machine running many race-enabled tests at once
	const margin = 250 * time.Millisecond
	for _, c := range clients {
		for _, m := range failureCases {
			t.Run(c.name+"/"+m.mode.String(), func(t *testing.T) {
				t.Parallel()
				rdb := c.new()
				// detached calls may hold the client up to its own timeouts
				// (5s for a failover client): close it without waiting
				t.Cleanup(func() { go rdb.Close() })
				silentRun(t, rdb, m, margin)
			})
		}
	}
}

// silentRun is one run of TestFaultSilentServer's scenario with rdb, a
// client of a silent server, under failure case m.
func silentRun(t *testing.T, rdb redis.UniversalClient, m failureCase, margin time.Duration) {
	t.Helper()
	const timeout = DefaultTimeout
	l, rec := faultLimiter(t, rdb, m.mode, 0.5)
	ctx := context.Background()
	lim := PerMinute(4)
	stalls := stall.Start(t)
	var slowest time.Duration
	var results []Result
	// The first decision runs out of time, and its health check's PING
	// gets no reply: the node is down, and the failure mode answers the
	// rest at once, also after downFor, while a PING checks it again.
	// Through a silent Sentinel no connection is made, which is no
	// evidence: each decision goes callTries times, then is shed.
	if _, ok := rdb.(*redis.Client); ok && rdb.(*redis.Client).Options().Addr == "FailoverClient" {
		silentSentinel(t, l, m, margin)
		return
	}
	for i := range 8 {
		if i == 5 {
			time.Sleep(downFor + 20*time.Millisecond)
		}
		r, err, d := faultAllow(ctx, l, "k", lim)
		slowest = max(slowest, d)
		bound := margin
		if i == 0 {
			bound += timeout + time.Second
		}
		beyond(t, stalls, d, bound, fmt.Sprintf("request %d", i))
		if err == nil || !isBackendError(err) {
			t.Fatalf("request %d: error %v, want a backend error", i, err)
		}
		if errors.Is(err, ErrCircuitOpen) != (i > 0) {
			t.Fatalf("request %d: %v; want the open circuit from the second on", i, err)
		}
		results = append(results, r)
	}
	for i, r := range results {
		if !m.expect(i, r) {
			t.Errorf("request %d: %s answered %+v", i, m.mode, r)
		}
	}
	ev := rec.take()
	if got := tallyEvents(ev); got.total != 8 || got.failed != 8 {
		t.Fatalf("observer: %+v, want 8 failed events", got)
	}
	for _, e := range ev {
		if e.Fallback != m.mode || e.Err == nil || !errors.Is(e.Err, store.ErrSilent) || e.Op != OpAllow || e.Key != "k" || e.Latency <= 0 {
			t.Fatalf("event %+v, want Redis's silence", e)
		}
	}
	t.Logf("silent server, %s: slowest decision %v", m.mode, slowest.Round(time.Millisecond))
}

// silentSentinel is silentRun's scenario through a failover client whose
// Sentinel never answers: every decision is shed, denied whatever the
// failure mode, after callTries calls each out of time and a health check
// that could not connect.
func silentSentinel(t *testing.T, l *Limiter, m failureCase, margin time.Duration) {
	t.Helper()
	stalls := stall.Start(t)
	for i := range 2 {
		r, err, d := faultAllow(context.Background(), l, "k", PerMinute(4))
		beyond(t, stalls, d, callTries*4*DefaultTimeout+margin, fmt.Sprintf("request %d", i))
		if !errors.Is(err, ErrShed) || r.Allowed {
			t.Fatalf("request %d: %+v %v, want shed", i, r, err)
		}
	}
}

// beyond fails t when d, the time something took, passed bound by more
// than the worst stall of this process that m has seen: a process that
// stood still (a loaded machine, the race detector's GC) moves every time
// it records by as much, and such a delay is not the code's. A hang of the
// code under test is no stall of the process: m does not see it.
func beyond(t *testing.T, m *stall.Meter, d, bound time.Duration, what string) {
	t.Helper()
	stalled := m.Worst()
	switch {
	case d <= bound:
	case d <= bound+stalled:
		t.Logf("%s took %v, over %v, but this process stalled for %v: inconclusive", what, d, bound, stalled)
	default:
		t.Errorf("%s took %v, want < %v (the worst stall of the process: %v)", what, d, bound, stalled)
	}
}

func isNetTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// TestFaultCallerDeadline: the caller's earlier deadline wins over the
// timeout, and a timeout of 0 leaves only the caller's.
func TestFaultCallerDeadline(t *testing.T) {
	t.Parallel()
	addr := redistest.Silent(t)
	for _, timeout := range []time.Duration{time.Minute, 0} {
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			t.Parallel()
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { rdb.Close() })
			l, rec := faultLimiter(t, rdb, FailClosed, 1, WithTimeout(timeout))
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			stalls := stall.Start(t)
			r, err, d := faultAllow(ctx, l, "k", PerSecond(1))
			if !errors.Is(err, context.DeadlineExceeded) || r.Allowed {
				t.Fatalf("got %+v %v after %v", r, err, d)
			}
			beyond(t, stalls, d, 200*time.Millisecond, "the decision")
			// no decision was made: the caller's deadline is no failure of
			// Redis, for the failure mode or for the breaker
			if ev := rec.take(); len(ev) != 1 || ev[0].Failed || !errors.Is(ev[0].Err, context.DeadlineExceeded) {
				t.Fatalf("events %+v", ev)
			}
			if l.guard.one.down.Load() != nil {
				t.Fatalf("the caller's deadline put the node down")
			}
		})
	}
}

// bgLoad decides continuously on keys of its own from a few goroutines,
// counting errors and the slowest latency, until stopped.
type bgLoad struct {
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	calls   atomic.Int64
	errs    atomic.Int64
	allowed atomic.Int64 // answers with an error that allowed
	shed    atomic.Int64 // answers with an error that shed the decision (ErrShed)
	slowest slowest
}

func startBgLoad(l *Limiter, workers int) *bgLoad {
	ld := &bgLoad{stop: make(chan struct{})}
	lim := PerMinute(1 << 30).With(SlidingCounter)
	for w := range workers {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			ctx := context.Background()
			for i := 0; ; i++ {
				select {
				case <-ld.stop:
					return
				default:
				}
				r, err, d := faultAllow(ctx, l, fmt.Sprintf("load-%d-%d", w, i%50), lim)
				ld.calls.Add(1)
				ld.slowest.add(d)
				if err != nil {
					ld.errs.Add(1)
					if r.Allowed {
						ld.allowed.Add(1)
					}
					if errors.Is(err, ErrShed) {
						ld.shed.Add(1)
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return ld
}

func (ld *bgLoad) halt() {
	ld.once.Do(func() { close(ld.stop) })
	ld.wg.Wait()
}

// TestFaultKilledServer: redis-server is killed under load. Every failure
// mode answers as documented, the observer counts every error, and once
// the server is back on the same port the same Limiter decides on Redis
// again within a second.
func TestFaultKilledServer(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		mode    FailureMode
		allowed int // of 200 requests under PerMinute(100), share 1/4
	}{{FailOpen, 200}, {FailClosed, 0}, {FailLocal, 25}} {
		t.Run(m.mode.String(), func(t *testing.T) {
			t.Parallel()
			p := redistest.Start(t)
			l, rec := faultLimiter(t, p.Client(t), m.mode, 0.25)
			ctx := context.Background()
			ld := startBgLoad(l, 2)
			defer ld.halt()
			// some calls on the healthy server: a few ms each, but the first
			// loads the scripts, and a loaded machine (the parallel tests
			// beside) once took over 50 ms for it in CI
			time.Sleep(50 * time.Millisecond)
			for wait := time.Now().Add(10 * time.Second); ld.calls.Load() < 2 && time.Now().Before(wait); {
				time.Sleep(10 * time.Millisecond)
			}
			if n := ld.errs.Load(); n != 0 || ld.calls.Load() == 0 {
				t.Fatalf("healthy: %d errors in %d calls", n, ld.calls.Load())
			}
			ld.slowest.ns.Store(0)

			p.Kill(t)
			lim := PerMinute(100)
			var down slowest
			allowed, errs, shedDown := 0, 0, 0
			for range 200 {
				r, err, d := faultAllow(ctx, l, "k", lim)
				down.add(d)
				if err != nil {
					errs++
					if !isBackendError(err) {
						t.Fatalf("error %v is not a backend error", err)
					}
				}
				if errors.Is(err, ErrShed) {
					shedDown++ // Redis answered a moment ago, the process short of CPU
					if r.Allowed {
						t.Fatalf("a shed decision was admitted: %+v", r)
					}
				}
				if r.Allowed {
					allowed++
				}
			}
			want := m.allowed
			if m.mode == FailOpen {
				want -= shedDown // every other decision is the failure mode's
			}
			if errs != 200 || allowed != want {
				t.Fatalf("%s with redis down: %d of 200 allowed, %d errors, %d shed; want %d allowed, 200 errors", m.mode, allowed, errs, shedDown, want)
			}

			stalls := stall.Start(t)
			p.Restart(t)
			restarted := time.Now()
			var back time.Duration
			for {
				_, err, d := faultAllow(ctx, l, "probe", lim)
				down.add(d)
				if err == nil {
					back = time.Since(restarted)
					break
				}
				errs++
				if since := time.Since(restarted); since > 2*time.Second+stalls.Worst() {
					t.Fatalf("still failing %v after the restart (the process stalled %v at worst): %v", since, stalls.Worst(), err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			// the breaker probes every 250ms: back within one probe, a
			// decision timeout and a margin, unless the process stalled
			beyond(t, stalls, back, time.Second, "back on redis after the restart")
			// decisions are Redis's again: exact counts from an empty server.
			// A decision shed on a loaded machine (Redis answered others, not
			// it, in time) may have been counted: the key is tried again.
			shedAfter := exactAfter(t, l, rec, "after")
			ld.halt()
			loadErrs := ld.errs.Load()
			// a call sent just before the kill, while Redis answered others
			// after it was sent, is shed (overload: denied), never admitted
			shed := ld.shed.Load()
			if m.mode == FailOpen && ld.allowed.Load() != loadErrs-shed {
				t.Errorf("fail-open: %d of %d load errors allowed (%d shed)", ld.allowed.Load(), loadErrs, shed)
			}
			if m.mode == FailClosed && ld.allowed.Load() != 0 {
				t.Errorf("fail-closed allowed %d requests on error", ld.allowed.Load())
			}
			// every error returned reached the observer, and only those
			if got := tallyEvents(rec.take()); got.failed+got.shed != int(loadErrs)+errs+shedAfter || got.shed != int(shed)+shedDown+shedAfter {
				t.Errorf("observer saw %d failures and %d shed; callers got %d + %d errors, %d + %d shed", got.failed, got.shed, loadErrs, errs, shed, shedAfter)
			}
			t.Logf("killed server, %s: slowest decision %v while down (load: %v over %d calls, %d errors); back on redis %v after the restart",
				m.mode, down.get().Round(time.Microsecond), ld.slowest.get().Round(time.Microsecond), ld.calls.Load(), loadErrs, back.Round(time.Millisecond))
		})
	}
}

// TestFaultScriptFlushAndRestart: SCRIPT FLUSH, and a restart of the
// server, between two calls: the next call succeeds with no error, with
// default client options and with ContextTimeoutEnabled, even with a pool
// full of connections to the dead server.
func TestFaultScriptFlushAndRestart(t *testing.T) {
	t.Parallel()
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", cte), func(t *testing.T) {
			t.Parallel()
			p := redistest.Start(t)
			rdb := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: cte})
			t.Cleanup(func() { rdb.Close() })
			l, rec := faultLimiter(t, rdb, FailClosed, 1, WithTimeout(patient))
			ctx := context.Background()
			lim := PerMinute(10)
			// fill the pool with several idle connections
			var held []*redis.Conn
			for range 16 {
				c := rdb.Conn()
				if err := c.Ping(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
			}
			for _, c := range held {
				c.Close() // back to the pool
			}
			if r, err := l.Allow(ctx, "k", lim); err != nil || r.Remaining != 9 {
				t.Fatalf("first call: %+v %v", r, err)
			}
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			r, err, d := faultAllow(ctx, l, "k", lim)
			if err != nil || !r.Allowed || r.Remaining != 8 {
				t.Fatalf("after SCRIPT FLUSH: %+v %v", r, err)
			}
			t.Logf("after SCRIPT FLUSH: %v (EVALSHA, NOSCRIPT, EVAL)", d.Round(time.Microsecond))
			conns := rdb.PoolStats().TotalConns
			p.Restart(t)
			r, err, d = faultAllow(ctx, l, "k", lim)
			if err != nil || !r.Allowed || r.Remaining != 9 { // the restart lost the data
				t.Fatalf("after a restart, with %d pooled connections: %+v %v", conns, r, err)
			}
			t.Logf("after a restart with %d pooled connections: %v", conns, d.Round(time.Microsecond))
			for _, e := range rec.take() {
				if e.Failed {
					t.Fatalf("a failure reached the observer: %+v", e)
				}
			}
		})
	}
}

// TestFaultCallerCancels: a caller that gives up while its call runs out
// of time gets its context's error, and no health check runs for it; the
// next decision finds the silence itself.
func TestFaultCallerCancels(t *testing.T) {
	t.Parallel()
	addr := redistest.Silent(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	l, _ := faultLimiter(t, rdb, FailOpen, 1, WithTimeout(50*time.Millisecond))
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	_, err, _ := faultAllow(cctx, l, "k", PerSecond(1))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the caller's own deadline: %v", err)
	}
	if l.guard.one.down.Load() != nil {
		t.Fatal("a caller's deadline put the node down")
	}
	if _, err, _ := faultAllow(ctx, l, "k", PerSecond(1)); errors.Is(err, ErrCircuitOpen) || !errors.Is(err, store.ErrSilent) {
		t.Fatalf("the next decision: %v, want Redis's silence found by its own health check", err)
	}
}

// BenchmarkDeadlinePath is decisions on a real Redis, from GOMAXPROCS
// goroutines, with a client that
// bounds its reads by the context (ContextTimeoutEnabled: a direct call)
// and with go-redis's default options (a direct send runs on its own goroutine
// so that the decision keeps its deadline).
func BenchmarkDeadlinePath(b *testing.B) {
	srv := redistest.New(b)
	for _, c := range []struct {
		name string
		cte  bool
	}{{"direct", true}, {"detached", false}} {
		b.Run(c.name, func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: c.cte})
			b.Cleanup(func() { rdb.Close() })
			// a generous timeout: a slow moment of the machine is no error here
			l, err := New(rdb, WithPrefix(fmt.Sprintf("bench-deadline-%d:", time.Now().UnixNano())), WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			lim := PerMinute(1 << 30).With(SlidingCounter)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := l.Allow(ctx, "k", lim); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestFaultLocalShare: fail-local's share of each Count, rounded down
// without floating-point loss, never below 1.
func TestFaultLocalShare(t *testing.T) {
	for _, c := range []struct {
		count int64
		share float64
		want  int64
	}{
		{100, 0.25, 25}, {100, 0.29, 29}, {100, 0.57, 57}, {3, 1.0 / 3, 1}, {10, 0.7, 7},
		{7, 0.5, 3}, {1, 0.1, 1}, {5, 0.01, 1}, {1000, 1, 1000}, {1 << 40, 0.5, 1 << 39},
	} {
		if got := scaled(c.count, c.share); got != c.want {
			t.Errorf("%d × %v = %d, want %d", c.count, c.share, got, c.want)
		}
	}
}

// exactAfter checks that l's decisions are Redis's again: 3 of 4 requests
// of a new key under PerMinute(3) pass, with exact remaining counts. A
// decision shed or whose call went again meanwhile (a loaded machine) may
// have been counted all the same: the check goes again on another key, up
// to 5 times. It returns the number of such decisions.
func exactAfter(t *testing.T, l *Limiter, rec *obsRecorder, prefix string) (shedCount int) {
	t.Helper()
	ctx := context.Background()
	for attempt := 1; ; attempt++ {
		key, shed := fmt.Sprint(prefix, "-", attempt), false
		for i := int64(1); i <= 4 && !shed; i++ {
			from := rec.count()
			r, err := l.Allow(ctx, key, PerMinute(3))
			retried := slices.ContainsFunc(rec.after(from), func(e Event) bool { return e.Retried && e.Key == key })
			switch {
			case errors.Is(r.BackendErr, ErrShed), retried: // a call that went again may count twice
				shed = true
				shedCount++
			case err != nil || r.Allowed != (i <= 3) || r.Allowed && r.Remaining != 3-i:
				t.Fatalf("%s, request %d: %+v %v", key, i, r, err)
			}
		}
		if !shed {
			return shedCount
		}
		if attempt == 5 {
			t.Fatal("5 tries in a row saw a decision shed")
		}
	}
}

// TestDownNodeComesBack: Redis killed, then restarted: once its health
// check is answered, decisions are Redis's again, Wait's too.
func TestDownNodeComesBack(t *testing.T) {
	p := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(time.Second), WithWaitTimeout(100*time.Millisecond), WithDenyCache(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := PerSecond(1000)
	if r, err := l.Allow(ctx, "k", lim); err != nil || r.BackendErr != nil {
		t.Fatal(r, err)
	}
	p.Kill(t)
	if r, _ := l.Allow(ctx, "k", lim); r.BackendErr == nil {
		t.Fatal("a decision with Redis down had no BackendErr")
	}
	if r, _ := l.Allow(ctx, "k", lim); !errors.Is(r.BackendErr, ErrCircuitOpen) {
		t.Fatalf("the node is not down: %v", r.BackendErr)
	}
	time.Sleep(downFor + 50*time.Millisecond)
	_ = l.Wait(ctx, "w", lim) // Redis is still down
	p.Restart(t)
	var last error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r, err := l.Allow(ctx, "k", lim)
		if err == nil && r.BackendErr == nil {
			if err := l.Wait(ctx, "w", lim); err != nil {
				t.Fatalf("Wait after Redis came back: %v", err)
			}
			return
		}
		last = r.BackendErr
	}
	t.Fatalf("10s after Redis came back every decision still fails: %v", last)
}
