package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// logLen is the number of units in key's sliding log of lim, reservations
// included, as stored: Redis's value or the memory store's log.
func (e *env) logLen(key string, lim Limit) int64 {
	e.t.Helper()
	if e.rdb == nil {
		return e.lim.guard.next.(*memstore.Store).Units(key, lim.spec())
	}
	n, err := storedLogLen(context.Background(), e.rdb, storageKey(keyTag(e.prefix, key), lim))
	if err != nil {
		e.t.Fatalf("stored log: %v", err)
	}
	return n
}

// waits records the wait of every Wait call the env's Limiter makes, by key,
// through its observer.
type waits struct {
	mu sync.Mutex
	by map[string][]time.Duration
}

func (e *env) recordWaits() *waits {
	w := &waits{by: map[string][]time.Duration{}}
	e.lim.observer = func(ev Event) {
		if ev.Op != OpWait {
			return
		}
		w.mu.Lock()
		w.by[ev.Key] = append(w.by[ev.Key], ev.Result.RetryAfter)
		w.mu.Unlock()
	}
	return w
}

func (w *waits) get(key string) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.by[key])
}

// eventually polls cond every millisecond for up to 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWaitReservations checks the reservation arithmetic on every backend
// with a frozen clock, so every wait is exact. Sleeps are real, and so are
// Redis's TTLs: ms is ten milliseconds, so that windows are short enough
// for the sleeps and a key outlives a loaded machine's pauses between the
// calls of a case.
func TestWaitReservations(t *testing.T) {
	ctx := context.Background()
	ms := 10 * time.Millisecond
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"one slot per call, in order, and Allow and Peek count them", func(t *testing.T, e *env) {
			w := e.recordWaits()
			lim := Per(2, 100*ms)
			// each call starts once the previous one has reserved: FIFO
			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for i := int64(1); i <= 6; i++ {
				wg.Add(1)
				go func() { defer wg.Done(); errs <- e.lim.Wait(ctx, "fifo", lim) }()
				eventually(t, fmt.Sprint("reservation ", i), func() bool { return e.logLen("fifo", lim) == i })
			}
			// the clock is frozen: the log holds 2 units now and 4 reserved
			r, err := e.lim.Peek(ctx, "fifo", lim)
			e.expect("peek after 6 reservations", r, err, want{false, 0, 300 * ms, 300 * ms})
			r, err = e.lim.Allow(ctx, "fifo", lim)
			e.expect("allow after 6 reservations", r, err, want{false, 0, 300 * ms, 300 * ms})
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if got, want := w.get("fifo"), []time.Duration{0, 0, 100 * ms, 100 * ms, 200 * ms, 200 * ms}; !slices.Equal(got, want) {
				t.Fatalf("waits %v, want %v", got, want)
			}
			if n := e.logLen("fifo", lim); n != 6 {
				t.Fatalf("log holds %d units, want 6", n)
			}
		}},
		{"Allow counts a reservation that leaves a gap before it", func(t *testing.T, e *env) {
			w := e.recordWaits()
			lim := Per(2, 100*ms)
			if r, err := e.lim.Allow(ctx, "gap", lim); err != nil || !r.Allowed {
				t.Fatalf("first: %+v %v", r, err)
			}
			e.advance(50 * ms)
			if r, err := e.lim.Allow(ctx, "gap", lim); err != nil || !r.Allowed {
				t.Fatalf("second: %+v %v", r, err)
			}
			// 2 units fit once both have left: at 150ms, 100ms from now
			done := make(chan error, 1)
			go func() { done <- e.lim.WaitN(ctx, "gap", 2, lim) }()
			eventually(t, "the reservation", func() bool { return e.logLen("gap", lim) == 4 })
			// at 110ms the window (10ms, 110ms] holds one unit, but the two
			// reserved at 150ms will share windows with anything added now
			e.advance(60 * ms)
			r, err := e.lim.Peek(ctx, "gap", lim)
			e.expect("peek in the gap", r, err, want{false, 0, 140 * ms, 140 * ms})
			r, err = e.lim.Allow(ctx, "gap", lim)
			e.expect("allow in the gap", r, err, want{false, 0, 140 * ms, 140 * ms})
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := w.get("gap"); !slices.Equal(got, []time.Duration{100 * ms}) {
				t.Fatalf("waits %v, want [100ms]", got)
			}
		}},
		{"every limit is reserved at the latest of their times", func(t *testing.T, e *env) {
			w := e.recordWaits()
			short, long := Per(2, 50*ms), Per(3, 200*ms)
			for i := int64(1); i <= 4; i++ {
				if err := e.lim.Wait(ctx, "multi", short, long); err != nil {
					t.Fatal(err)
				}
			}
			// third: the short limit says 50ms; fourth: the long one says 200ms
			if got, want := w.get("multi"), []time.Duration{0, 0, 50 * ms, 200 * ms}; !slices.Equal(got, want) {
				t.Fatalf("waits %v, want %v", got, want)
			}
			if a, b := e.logLen("multi", short), e.logLen("multi", long); a != 4 || b != 4 {
				t.Fatalf("logs hold %d and %d units, want 4 and 4", a, b)
			}
		}},
		{"WaitN reserves n units at once", func(t *testing.T, e *env) {
			w := e.recordWaits()
			lim := Per(5, 100*ms)
			for _, n := range []int64{3, 3, 2, 5} {
				if err := e.lim.WaitN(ctx, "n", n, lim); err != nil {
					t.Fatal(err)
				}
			}
			// 3 now; 3 more once those have left (100ms); 2 fit beside
			// them; 5 only once all 5 reserved at 100ms have left (200ms)
			if got, want := w.get("n"), []time.Duration{0, 100 * ms, 100 * ms, 200 * ms}; !slices.Equal(got, want) {
				t.Fatalf("waits %v, want %v", got, want)
			}
		}},
		{"past the deadline nothing is recorded and Wait returns at once", func(t *testing.T, e *env) {
			w := e.recordWaits()
			sec, hour := Per(1, 10*time.Second), Per(5, time.Hour)
			if r, err := e.lim.Allow(ctx, "dl", sec, hour); err != nil || !r.Allowed {
				t.Fatalf("first: %+v %v", r, err)
			}
			before, err := e.lim.Peek(ctx, "dl", sec, hour)
			if err != nil {
				t.Fatal(err)
			}
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			stalls := stall.Start(t)
			start := time.Now()
			err = e.lim.Wait(dctx, "dl", sec, hour)
			if elapsed := time.Since(start); elapsed > 50*ms {
				timingFailed(t, stalls, fmt.Sprintf("Wait took %s to give up; it must not sleep", elapsed))
			}
			if !errors.Is(err, ErrWaitExceedsDeadline) {
				t.Fatalf("got %v, want ErrWaitExceedsDeadline", err)
			}
			if got := w.get("dl"); !slices.Equal(got, []time.Duration{10 * time.Second}) {
				t.Fatalf("reported wait %v, want [10s]", got)
			}
			after, err := e.lim.Peek(ctx, "dl", sec, hour)
			e.expect("peek after", after, err, want{before.Allowed, before.Remaining, before.RetryAfter, before.ResetAfter})
			if a, b := e.logLen("dl", sec), e.logLen("dl", hour); a != 1 || b != 1 {
				t.Fatalf("logs hold %d and %d units, want 1 and 1", a, b)
			}
			// a cost above Count never fits: an error at once, nothing recorded
			if err := e.lim.WaitN(ctx, "dl", 6, hour); !errors.Is(err, ErrNeverFits) {
				t.Fatalf("WaitN above Count: %v, want ErrNeverFits", err)
			}
			if n := e.logLen("dl", hour); n != 1 {
				t.Fatalf("log holds %d units after ErrNeverFits, want 1", n)
			}
		}},
		{"cancelling a sleeping Wait frees its slot", func(t *testing.T, e *env) {
			w := e.recordWaits()
			sec, min := Per(1, 10*time.Second), Per(5, time.Minute)
			if r, err := e.lim.Allow(ctx, "cancel", sec, min); err != nil || !r.Allowed {
				t.Fatalf("first: %+v %v", r, err)
			}
			before, err := e.lim.Peek(ctx, "cancel", sec, min)
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- e.lim.Wait(cctx, "cancel", sec, min) }()
			eventually(t, "the reservation", func() bool { return e.logLen("cancel", sec) == 2 })
			// while it sleeps, its unit is counted: the log is full until 20s
			r, err := e.lim.Peek(ctx, "cancel", sec)
			e.expect("peek while sleeping", r, err, want{false, 0, 20 * time.Second, 20 * time.Second})
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled Wait: %v, want context.Canceled", err)
				}
			case <-time.After(time.Second):
				t.Fatal("cancelled Wait did not return")
			}
			// a reply that was still on its way when the caller left is
			// given back once it arrives: soon, not necessarily at once
			eventually(t, "the reservation given back", func() bool {
				return e.logLen("cancel", sec) == 1 && e.logLen("cancel", min) == 1
			})
			after, err := e.lim.Peek(ctx, "cancel", sec, min)
			e.expect("peek after the cancel", after, err, want{before.Allowed, before.Remaining, before.RetryAfter, before.ResetAfter})
			// the next caller gets the freed slot (10s), not the one after it (20s)
			dctx, dcancel := context.WithTimeout(ctx, time.Second)
			defer dcancel()
			if err := e.lim.Wait(dctx, "cancel", sec, min); !errors.Is(err, ErrWaitExceedsDeadline) {
				t.Fatalf("next Wait: %v", err)
			}
			// the cancelled Wait reports 10s when its reply had arrived
			// before the cancel, 0 when it had not (it never slept)
			got := w.get("cancel")
			if len(got) != 2 || (got[0] != 10*time.Second && got[0] != 0) || got[1] != 10*time.Second {
				t.Fatalf("waits %v, want [10s 10s] or [0s 10s]", got)
			}
			e.advance(10 * time.Second)
			r, err = e.lim.Peek(ctx, "cancel", sec)
			e.expect("peek 10s later", r, err, want{true, 1, 0, 0})
		}},
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					c.run(t, b.new(t))
				})
			}
		})
	}
}

// maxInWindow returns the most of the sorted times ts (µs) that any
// half-open interval [t, t+w) holds.
func maxInWindow(ts []int64, w int64) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

func TestMaxInWindow(t *testing.T) {
	cases := []struct {
		ts   []int64
		w    int64
		want int
	}{
		{nil, 10, 0},
		{[]int64{5}, 10, 1},
		{[]int64{0, 9, 10, 19, 20}, 10, 2},
		{[]int64{0, 0, 0, 10}, 10, 3},
		{[]int64{0, 1, 2, 3, 20, 21}, 10, 4},
		{[]int64{0, 5, 10, 15}, 11, 3},
	}
	for _, c := range cases {
		if got := maxInWindow(c.ts, c.w); got != c.want {
			t.Errorf("maxInWindow(%v, %d) = %d, want %d", c.ts, c.w, got, c.want)
		}
	}
}

// scriptCounter counts a client's script calls that Redis answered
// (EVALSHA or EVAL, alone or in a pipeline; a NOSCRIPT reply and its EVAL
// retry count once).
type scriptCounter struct{ n, releases atomic.Int64 }

// count counts cmd if it is a script call that ran. For a command on its
// own, err is what the hook's next returned: go-redis reports NOSCRIPT
// there, not in cmd.Err.
func (h *scriptCounter) count(cmd redis.Cmder, err error) {
	if err == nil && isScriptCall(cmd) {
		h.n.Add(1)
		if args := cmd.Args(); strings.Contains(fmt.Sprint(args...), "release") || movedFrom(args) {
			h.releases.Add(1) // a late waiter's slot given back, or moved
		}
	}
}

// movedFrom reports whether args are a reservation's call that moves
// another (reserve.lua's ARGV[5], From, not 0).
func movedFrom(args []any) bool {
	if len(args) < 3 || !strings.Contains(fmt.Sprint(args[1]), "reserve") {
		return false
	}
	keys, err := strconv.Atoi(fmt.Sprint(args[2]))
	return err == nil && len(args) > 3+keys+4 && fmt.Sprint(args[3+keys+4]) != "0"
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd, errors.Join(err, cmd.Err()))
		return err
	}
}

func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.count(cmd, cmd.Err())
		}
		return err
	}
}

// logRecorder collects every unit ever stored in one sliding log, with its
// exact server time, by reading the whole log every 50ms. A unit stays in
// the log from its reservation until at least one Window after its time,
// so no unit is missed while Window > 50ms. Units of one time are alike:
// the most of them seen in one read are counted, but for units still
// inside their window at a read: those count as that read finds them, so
// that a unit given back (a late waiter's slot, a cancelled Wait) is not
// counted.
type logRecorder struct {
	rdb    *redis.Client
	key    string
	window time.Duration
	mu     sync.Mutex
	seen   map[int64]int
	err    error
	stop   chan struct{}
	done   chan struct{}
}

func recordLog(t *testing.T, srv *redistest.Server, key string, window time.Duration) *logRecorder {
	r := &logRecorder{rdb: srv.Client(t), key: key, window: window, seen: map[int64]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			r.read()
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { r.finish() })
	return r
}

func (r *logRecorder) read() {
	// the server's time after the read: a unit older than a window then
	// may be gone, trimmed, not given back (a time read before, on a slow
	// machine, took such units for given back)
	times, err := storedLog(context.Background(), r.rdb, r.key)
	var now time.Time
	if err == nil {
		now, err = r.rdb.Time(context.Background()).Result()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.err = err
		return
	}
	counts := map[int64]int{}
	for _, us := range times {
		counts[us]++
	}
	inside := now.UnixMicro() - r.window.Microseconds() + 1000 // a unit in its window at this read
	for us := range r.seen {
		if us > inside && counts[us] == 0 {
			delete(r.seen, us) // given back
		}
	}
	for us, n := range counts {
		if us > inside {
			r.seen[us] = n
		} else {
			r.seen[us] = max(r.seen[us], n)
		}
	}
}

// finish stops reading and returns every unit's time, sorted.
func (r *logRecorder) finish() []int64 {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	r.read()
	r.mu.Lock()
	defer r.mu.Unlock()
	var ts []int64
	for us, n := range r.seen {
		for range n {
			ts = append(ts, us)
		}
	}
	slices.Sort(ts)
	return ts
}

// throttleRun is one run of the replica scenario: replicas Limiters on
// their own clients, callers goroutines each, all calling Wait at once on
// one sliding-log key.
type throttleRun struct {
	window   time.Duration
	limit    int64
	replicas int
	callers  int

	successes, failures int
	firstErr            error
	scriptCalls         int64
	releases            int64 // slots given back by waiters that woke late
	meanWait            time.Duration
	wall                time.Duration // from the start to the last caller's start
	starts              []int64       // callers' local start times, µs, sorted
	reserved            []int64       // the log's server times, µs, sorted
	stalls              *stall.Meter  // running while the callers ran
}

// lateness is how long after its reserved time each caller started: the
// i-th earliest start against the i-th earliest reserved time, sorted. If
// every caller starts at or after its own reserved time, every value is
// >= 0: the i earliest starts each follow a reserved time of their own.
//
// A slot moved after its window had passed stays in the log (it counted
// there a whole window): the log then holds more units than starts, and
// the i-th start is paired with the i-th unit still, which only lowers
// the units a start is compared with.
func (r *throttleRun) lateness() []time.Duration {
	if len(r.starts) > len(r.reserved) {
		return nil
	}
	late := make([]time.Duration, len(r.starts))
	for i := range r.starts {
		late[i] = usec(r.starts[i] - r.reserved[i])
	}
	slices.Sort(late)
	return late
}

// runThrottle runs the scenario on real Redis. Every Limiter fails closed,
// so that a Redis error is a failure here, never a silent admission.
func runThrottle(t *testing.T, r throttleRun) throttleRun {
	t.Helper()
	srv := redistest.New(t)
	prefix := uniquePrefix(t)
	lim := Per(r.limit, r.window)
	counter := &scriptCounter{}
	limiters := make([]*Limiter, r.replicas)
	for i := range limiters {
		// ContextTimeoutEnabled: the store sends through this client itself
		// (not a clone without its hooks), so the counter sees every call
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		c.AddHook(counter)
		l, err := New(c, WithPrefix(prefix), WithFailureMode(FailClosed), WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		limiters[i] = l
	}
	rec := recordLog(t, srv, storageKey(keyTag(prefix, "api"), lim), lim.Window)
	r.stalls = stall.Start(t)
	total := r.replicas * r.callers
	var (
		mu     sync.Mutex
		starts = make([]int64, 0, total)
		waited time.Duration
		wg     sync.WaitGroup
		ready  = make(chan struct{})
	)
	for _, l := range limiters {
		for range r.callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				begin := time.Now()
				err := l.Wait(context.Background(), "api", lim)
				start := time.Now()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					r.failures++
					if r.firstErr == nil {
						r.firstErr = err
					}
					return
				}
				r.successes++
				starts = append(starts, start.UnixMicro())
				waited += start.Sub(begin)
			}()
		}
	}
	t0 := time.Now()
	close(ready)
	wg.Wait()
	r.stalls.Finish()
	r.reserved = rec.finish()
	if rec.err != nil {
		t.Fatalf("reading the log: %v", rec.err)
	}
	slices.Sort(starts)
	r.starts = starts
	if len(starts) > 0 {
		r.wall = usec(starts[len(starts)-1]) - usec(t0.UnixMicro())
		r.meanWait = waited / time.Duration(len(starts))
	}
	r.scriptCalls, r.releases = counter.n.Load(), counter.releases.Load()
	return r
}

// startTolerance is how much later than its reserved time a caller may
// record its start: the reply's way back, the timer and the scheduler of a
// busy test machine (25ms is not enough under go test -race ./... on two
// cores). Starts are never earlier than reserved times, so a window of
// Window minus this tolerance over the starts lies inside a window of
// Window over the reserved times, which holds at most Count: the tolerance
// can only hide an over-admission of less than itself, and the exact check
// on the Redis log sees those.
const startTolerance = 50 * time.Millisecond

// timingFailed fails t with msg, or only logs it when the meter saw this
// process stall for half the tolerance or more.
func timingFailed(t *testing.T, m *stall.Meter, msg string) {
	t.Helper()
	if stall := m.Finish(); stall >= startTolerance/2 {
		t.Logf("inconclusive, this process stalled for %s: %s", stall, msg)
		return
	}
	t.Error(msg)
}

// check asserts what every run must hold: no failure, one script call per
// Wait, every unit in the log once, no window of the log over the limit
// (exact, on the server's times), no caller starting before its slot.
func (r *throttleRun) check(t *testing.T) {
	t.Helper()
	total := r.replicas * r.callers
	if r.failures != 0 || r.successes != total {
		t.Errorf("%d successes, %d failures (first: %v); want %d and 0", r.successes, r.failures, r.firstErr, total)
	}
	// one reservation each, and a peek for a Block made while it slept by
	// each that slept: every Wait but the first limit ones (an empty log
	// holds them now); no polling. A caller that woke late gives its slot
	// back and reserves again (two calls more, and a peek): a loaded
	// machine's, as many as late wakes
	if most := int64(2*total) - r.limit; r.scriptCalls < int64(total) || r.scriptCalls > most+3*r.releases {
		t.Errorf("%d script calls for %d Waits; want %d to %d and 3 a late wake: a reservation each, a peek after each sleep, no polling", r.scriptCalls, total, total, most)
	}
	// more when a slot was moved or given back after the recorder's last
	// read of it, or a reservation's reply came too late and it asked
	// again: those units held their slots in the log, counted below
	if len(r.reserved) < total {
		t.Errorf("the log recorded %d units, want %d at least: a caller started without its unit", len(r.reserved), total)
	}
	if got := maxInWindow(r.reserved, micros(r.window)); got > int(r.limit) {
		t.Errorf("a window of %s holds %d reserved units, limit %d", r.window, got, r.limit)
	}
	if late := r.lateness(); len(late) > 0 && late[0] < 0 {
		t.Errorf("a caller started %s before its reserved time", -late[0])
	}
}

// checkStarts asserts that no window of Window minus startTolerance holds
// more than the limit of the callers' own start times. Given check, it
// fails only when a caller started more than startTolerance after its slot.
// It is inconclusive when the machine stalled the test (see stall.Meter).
func (r *throttleRun) checkStarts(t *testing.T) {
	t.Helper()
	if got := maxInWindow(r.starts, micros(r.window-startTolerance)); got > int(r.limit) {
		late := append(r.lateness(), 0)
		timingFailed(t, r.stalls, fmt.Sprintf("a window of %s holds %d starts, limit %d (callers started up to %s after their slots)",
			r.window-startTolerance, got, r.limit, late[len(late)-2:]))
	}
}

// The replica scenario of the throttler: 3 Limiters on 3 clients, 40
// callers each, 20 per second. Everyone gets through, in 6 groups of 20 a
// second apart: the last group starts 5s after the first.
func TestWaitReplicas(t *testing.T) {
	r := runThrottle(t, throttleRun{window: time.Second, limit: 20, replicas: 3, callers: 40})
	r.check(t)
	r.checkStarts(t)
	late := append(r.lateness(), 0) // (0: none when the log and the starts differ, which check reported)
	t.Logf("120 calls: wall %s, mean wait %s, lateness %s..%s, worst stall %s, max per 1s window %d (reserved), %d (starts)",
		r.wall.Round(time.Millisecond), r.meanWait.Round(time.Millisecond), late[0], late[len(late)-1], r.stalls.Worst(),
		maxInWindow(r.reserved, micros(time.Second)), maxInWindow(r.starts, micros(time.Second-startTolerance)))
	// computed waits, not polling: close to the ideal 5s
	if r.wall < 4900*time.Millisecond {
		t.Errorf("the run took %s; want close to 5s", r.wall)
	}
	if r.releases > 0 { // callers woke late and reserved again: a loaded machine's, and slower by design
		t.Logf("%d callers woke late and took the next slot; the run took %s", r.releases, r.wall)
	} else {
		beyond(t, r.stalls, r.wall, 6500*time.Millisecond, "the run (want close to 5s)")
	}
}

// Cancelling a sleeping Wait on a real server's clock gives its slot to the
// next caller.
func TestWaitCancelFreesSlot(t *testing.T) {
	lim := Per(1, time.Second)
	l, units := cancelledWait(t, lim, 0)
	// a caller that leaves before the reservation's reply reached it gets
	// its error at once, and the reservation is given back when the reply
	// comes (bounds.reserve): the log holds the first Wait's unit alone
	// soon after, never less
	eventually(t, "the release", func() bool {
		n := units()
		if n < 1 {
			t.Fatalf("log holds %d units after the cancel, want 1", n)
		}
		return n == 1
	})
	// the freed slot is about 1s away; the one after it would be 2s
	dctx, dcancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer dcancel()
	if err := l.Wait(dctx, "k", lim); err != nil {
		t.Fatalf("the next Wait did not get the freed slot: %v", err)
	}
}

// cancelledWait makes a Limiter on a real server (with opts), takes key
// "k"'s one slot under lim with Wait, then cancels a second Wait after
// after, once its reservation is stored. It returns the Limiter and a
// reader of the units key "k"'s log holds.
func cancelledWait(t *testing.T, lim Limit, after time.Duration, opts ...Option) (*Limiter, func() int64) {
	t.Helper()
	srv := redistest.New(t)
	prefix := uniquePrefix(t)
	l, err := New(srv.Client(t), append([]Option{WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t)
	key := storageKey(keyTag(prefix, "k"), lim)
	units := func() int64 { return logLen(t, rdb, key) }
	ctx := context.Background()
	if err := l.Wait(ctx, "k", lim); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Wait(cctx, "k", lim) }()
	eventually(t, "the reservation", func() bool { return units() == 2 })
	time.Sleep(after)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v", err)
	}
	return l, units
}

// A Wait cancelled after sleeping longer than its calls' bound
// (WithWaitTimeout) still gives its slot back: the release has a bound of
// its own, not the reservation's, long passed.
func TestWaitCancelAfterWaitTimeoutFreesSlot(t *testing.T) {
	// past the reservation's bound of 100ms
	_, units := cancelledWait(t, Per(1, 10*time.Second), 300*time.Millisecond, WithWaitTimeout(100*time.Millisecond))
	// the release is sent before Wait returns
	if n := units(); n != 1 {
		t.Fatalf("log holds %d units after the cancel, want 1: the reservation was kept", n)
	}
}

// Allow and Wait on one key, from three replicas, never exceed the limit
// together: Allow counts the reservations.
func TestWaitMixedWithAllow(t *testing.T) {
	srv := redistest.New(t)
	prefix := uniquePrefix(t)
	lim := Per(10, 500*time.Millisecond)
	rec := recordLog(t, srv, storageKey(keyTag(prefix, "mix"), lim), lim.Window)
	var (
		mu             sync.Mutex
		times          []int64
		allowed, waits int
		wg             sync.WaitGroup
	)
	admit := func(wait bool) {
		mu.Lock()
		defer mu.Unlock()
		times = append(times, time.Now().UnixMicro())
		if wait {
			waits++
		} else {
			allowed++
		}
	}
	ctx := context.Background()
	stop := time.Now().Add(1200 * time.Millisecond)
	for range 3 {
		l, err := New(srv.Client(t), WithPrefix(prefix), WithFailureMode(FailClosed), WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 { // callers of Allow, every 2ms
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					r, err := l.Allow(ctx, "mix", lim)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						admit(false)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
		// callers of WaitN for 1 to 3 units, spread over the first 150ms:
		// a reservation of several units leaves room before it, which
		// Allow must not take
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * 50 * time.Millisecond)
				n := int64(1 + i%3)
				if err := l.WaitN(ctx, "mix", n, lim); err != nil {
					t.Error(err)
					return
				}
				for range n {
					admit(true)
				}
			}()
		}
	}
	wg.Wait()
	reserved := rec.finish()
	slices.Sort(times)
	if waits != 3*(1+2+3+1) {
		t.Fatalf("%d of 21 units waited for went through", waits)
	}
	if len(reserved) != allowed+waits {
		t.Fatalf("the log recorded %d units for %d allowed and %d waited for", len(reserved), allowed, waits)
	}
	if got := maxInWindow(reserved, micros(lim.Window)); got > 10 {
		t.Fatalf("a window of %s holds %d units (log), limit 10", lim.Window, got)
	}
	// the callers' own times of admission only add the noise of a busy
	// machine to the log's exact times: they are reported, not checked
	t.Logf("%d units allowed, %d waited for; max %d admissions in a window of %s (callers' clocks)",
		allowed, waits, maxInWindow(times, micros(lim.Window-startTolerance)), lim.Window-startTolerance)
}

// SlidingBuckets and SlidingCounter poll: every caller gets through within
// its deadline and the limit holds (for the counter, as it defines it: no
// fixed window above Count, no sliding one at 2×Count).
func TestWaitPolls(t *testing.T) {
	srv := redistest.New(t)
	for _, lim := range []Limit{
		{Count: 10, Window: 500 * time.Millisecond, Algorithm: SlidingBuckets, Precision: 50 * time.Millisecond},
		Per(10, 500*time.Millisecond).With(SlidingCounter),
	} {
		t.Run(lim.Algorithm.String(), func(t *testing.T) {
			t.Parallel()
			prefix := uniquePrefix(t)
			stalls := stall.Start(t)
			var (
				mu    sync.Mutex
				times []int64
				wg    sync.WaitGroup
			)
			for range 3 {
				l, err := New(srv.Client(t), WithPrefix(prefix), WithFailureMode(FailClosed), WithTimeout(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				for range 10 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						defer cancel()
						if err := l.Wait(ctx, "poll", lim); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						times = append(times, time.Now().UnixMicro())
						mu.Unlock()
					}()
				}
			}
			wg.Wait()
			if len(times) != 30 {
				t.Fatalf("%d of 30 callers went through", len(times))
			}
			slices.Sort(times)
			w, tol := micros(lim.Window), micros(startTolerance)
			sliding := maxInWindow(times, w-tol)
			if lim.Algorithm == SlidingBuckets && sliding > 10 {
				timingFailed(t, stalls, fmt.Sprintf("a window of %s holds %d admissions, limit 10", lim.Window-startTolerance, sliding))
			}
			if lim.Algorithm == SlidingCounter {
				if sliding >= 20 {
					timingFailed(t, stalls, fmt.Sprintf("a window of %s holds %d admissions, the counter's bound is under 20", lim.Window-startTolerance, sliding))
				}
				// a fixed window, less the tolerance at its start (an
				// admission is recorded up to the tolerance after the
				// server decided it)
				fixed := map[int64]int{}
				for _, us := range times {
					if us%w >= tol {
						fixed[us/w]++
					}
				}
				for c, n := range fixed {
					if n > 10 {
						timingFailed(t, stalls, fmt.Sprintf("fixed window %d holds %d admissions, limit 10", c, n))
					}
				}
			}
			t.Logf("last admission %s after the first; max %d per sliding window", usec(times[29]-times[0]), sliding)
		})
	}
}

// A burst of Waits against a tiny limit and a short deadline: those that
// cannot start in time fail at once with ErrWaitExceedsDeadline and leave
// no unit behind; the others all get through, but for a caller that would
// have started late (a loaded machine): it gives its slot back, and the
// slot is lost (going later would bunch with the next group).
func TestWaitDeadlineUnderLoad(t *testing.T) {
	srv := redistest.New(t)
	prefix := uniquePrefix(t)
	lim := Per(5, time.Second)
	rdb := srv.Client(t)
	key := storageKey(keyTag(prefix, "burst"), lim)
	var (
		ok, late atomic.Int64
		wg       sync.WaitGroup
		counter  scriptCounter
	)
	stalls := stall.Start(t)
	for range 3 {
		// ContextTimeoutEnabled: the store sends through this client itself,
		// so the counter sees the slots given back
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		c.AddHook(&counter)
		l, err := New(c, WithPrefix(prefix), WithFailureMode(FailClosed), WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// 1.5s: the first two groups of 5 fit, the rest cannot
				ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond+time.Duration(rand.N(10))*time.Millisecond)
				defer cancel()
				start := time.Now()
				err := l.Wait(ctx, "burst", lim)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrWaitExceedsDeadline):
					late.Add(1)
					if counter.releases.Load() == 0 { // a slot given back costs its caller its wait
						beyond(t, stalls, time.Since(start), time.Second, "a call that could not start in time")
					}
				default:
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	// every slot given back may be one success fewer, never one more
	if given := counter.releases.Load(); ok.Load() > 10 || ok.Load() < 10-given || ok.Load()+late.Load() != 60 {
		t.Fatalf("%d went through, %d gave up, %d slots given back; want 10 (less one a slot given back) and the rest", ok.Load(), late.Load(), given)
	} else if given > 0 {
		t.Logf("%d went through, %d slots given back by callers that would have started late", ok.Load(), given)
	}
	// a waiter that woke late (a loaded machine) gave its slot back, and the
	// release trimmed the units that had left the window: the log holds the
	// admitted units still in it, never one of a Wait that gave up
	if n := logLen(t, rdb, key); n > 10 || n < 5 {
		t.Fatalf("the log holds %d units, want the 10 admitted, or the 5 to 10 still in the window", n)
	}
}

// micros converts d to whole microseconds.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// TestWaitHonoursBlockWhileSleeping: a Block made while sliding-log Waits
// sleep to their reserved slots (an upstream's refusal reported by another
// replica) covers those slots: the sleepers give them back and reserve
// again after the Block, in order, a window apart; none goes inside it.
func TestWaitHonoursBlockWhileSleeping(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		limiters func(t *testing.T) (a, b *Limiter)
	}{
		{"memory", func(t *testing.T) (*Limiter, *Limiter) { l := NewMemory(); return l, l }},
		{"redis, two replicas", func(t *testing.T) (*Limiter, *Limiter) {
			srv, prefix := redistest.New(t), uniquePrefix(t)
			var ls [2]*Limiter
			for i := range ls {
				l, err := New(srv.Client(t), WithPrefix(prefix), WithTimeout(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				ls[i] = l
			}
			return ls[0], ls[1]
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a, b := c.limiters(t)
			ctx := context.Background()
			lim := PerSecond(1)
			stalls := stall.Start(t)
			if err := a.Wait(ctx, "k", lim); err != nil { // the slot of now
				t.Fatal(err)
			}
			returned := make(chan time.Time, 2)
			for range 2 { // slots 1s and 2s from now
				go func() {
					if err := b.Wait(ctx, "k", lim); err != nil {
						t.Error(err)
					}
					returned <- time.Now()
				}()
			}
			time.Sleep(300 * time.Millisecond) // both reserved
			const block = 3 * time.Second
			blocked := time.Now()
			if err := a.Block(ctx, "k", block); err != nil {
				t.Fatal(err)
			}
			first, second := <-returned, <-returned
			if first.After(second) {
				first, second = second, first
			}
			// the clock the stores use and time.Now may differ by a µs rounding
			if d := first.Sub(blocked); d < block-5*time.Millisecond {
				t.Errorf("a Wait returned %s after the Block of %s, inside it", d, block)
			}
			// a first Wait that woke late narrows the gap: not the code's
			if d := second.Sub(first); d < time.Second-5*time.Millisecond {
				if stalled := stalls.Worst(); d+stalled >= time.Second-5*time.Millisecond {
					t.Logf("the Waits returned %s apart, but this process stalled for %s: inconclusive", d, stalled)
				} else {
					t.Errorf("the Waits returned %s apart, want a window (1s) at least", d)
				}
			}
		})
	}
}

// TestCancelledWaitReleasesWithinWaitTimeout: a Wait cancelled while it
// sleeps to its slot gives the slot back by a call that WithWaitTimeout
// bounds, as every call of Wait's: on a stalled Redis its caller returned
// after DefaultWaitTimeout (2s) whatever the option said.
func TestCancelledWaitReleasesWithinWaitTimeout(t *testing.T) {
	p := redistest.Start(t)
	l, err := New(p.Client(t), WithPrefix(uniquePrefix(t)), WithWaitTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := Per(1, 5*time.Second)
	if err := l.Wait(ctx, "k", lim); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Wait(wctx, "k", lim) }() // reserves the slot 5s on, and sleeps
	admin := p.Client(t)
	eventually(t, "the second Wait's reservation", func() bool {
		r, err := l.Peek(ctx, "k", lim)
		return err == nil && r.RetryAfter > 5*time.Second
	})
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "CLIENT", "UNPAUSE") })
	stalls := stall.Start(t)
	cancel()
	cancelled := time.Now()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: %v, want context.Canceled", err)
	}
	beyond(t, stalls, time.Since(cancelled), time.Second, "the cancelled Wait's return (WithWaitTimeout 100ms)")
}
