package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
)

// guard wraps each call of a Limiter to its store. Over Redis (a
// store.Remote) it keeps a circuit breaker per node and tells what a
// failed call means (a kind, see end); the failure mode (fail) then answers
// for Redis. The decision's deadline travels in the Request (Deadline):
// the store ends the call then. Over the memory store the guard only
// passes calls on.
type guard struct {
	next   store.Store
	remote store.Remote // next, over Redis; nil: the memory store
	br     breaker      // the client's (see breakerFor)
	// masters holds a breaker per Cluster master: address → *breaker
	masters sync.Map
	mode    FailureMode
	cpu     cpuMeter      // whether a call without a reply waited for this process
	budget  time.Duration // a decision's: the Limiter's timeout
	// local is FailLocal's store; nil for the other modes
	local *memstore.Store
	share float64 // FailLocal's share of each Count
}

// kind is what the outcome of a call says about Redis.
type kind uint8

const (
	// succeeded: Redis answered the call.
	succeeded kind = iota
	// abandoned: the caller's context ended first. No decision was made,
	// and nothing was learnt about Redis.
	abandoned
	// rejected: Redis answered with an error (a script error, NOPERM, OOM,
	// TRYAGAIN): this call's failure. Redis is alive: the breaker does not
	// count it.
	rejected
	// overloaded: no reply, while Redis answered other calls of this
	// client since the decision began: Redis or this process is slow, not
	// down. The breaker does not count it, and no failure mode answers: the
	// decision is shed (see ErrShed).
	overloaded
	// timedOut: no reply in time, and no other reply since the decision
	// began (Redis failing, or a slow moment: a cold start, a process
	// starved of CPU). The breaker counts it, unless this process was short
	// of CPU meanwhile (see end).
	timedOut
	// failed: a connection failure, and no other reply since the decision
	// began, which the breaker counts; or the breaker is open (ErrCircuitOpen,
	// not counted again).
	failed
)

// retried reports whether a decision of this kind goes again once before
// the failure mode answers (see Limiter.decide).
func (k kind) retried() bool { return k == overloaded || k == timedOut }

// attempt is one call to Redis under way.
type attempt struct {
	// sent is the store's clock when the decision began (its budget's
	// start; when the call was sent, without a budget): what happened
	// since is what the call's outcome is judged by. A decision whose
	// budget went by before its call (waiting on another's probe, on a
	// process short of CPU) timed out for this process, not for Redis.
	sent  int64
	br    *breaker // the breaker of the node that serves the key
	probe bool     // the call is br's probe
}

// begin starts a call to Redis about key for a decision whose budget ends
// at deadline (zero: none), or returns ErrCircuitOpen.
func (g *guard) begin(key string, deadline time.Time) (attempt, error) {
	now := g.remote.Clock()
	a := attempt{sent: now, br: g.breakerFor(key)}
	if !deadline.IsZero() && g.budget > 0 {
		spent := min(max(g.budget-time.Until(deadline), 0), g.budget)
		a.sent = max(now-int64(spent), 1)
	}
	ok, probe := a.br.allow(now)
	if !ok {
		return a, ErrCircuitOpen
	}
	a.probe = probe
	return a, nil
}

// breakerFor returns the breaker of the node that serves key: on a
// Cluster, its master's, where the client knows it (one breaker per
// master, so that a failing master stops calls for its keys only); else
// the client's.
func (g *guard) breakerFor(key string) *breaker {
	addr := g.remote.Node(key)
	if addr == "" {
		return &g.br
	}
	if b, ok := g.masters.Load(addr); ok {
		return b.(*breaker)
	}
	b, _ := g.masters.LoadOrStore(addr, new(breaker))
	return b.(*breaker)
}

// answeredAfter reports whether the node that serves a's key answered
// after t (the store's clock): on a Cluster, its master (the replies to
// this Limiter's calls on its keys), so that a silent master's timeouts
// count while the others answer; else the client.
func (g *guard) answeredAfter(a attempt, t int64) bool {
	if a.br != &g.br {
		return a.br.lastReply.Load() >= t
	}
	return g.remote.AnsweredSince(t)
}

// end classifies the outcome err of attempt a by the caller's ctx (the
// one health rule), and tells the breaker.
func (g *guard) end(ctx context.Context, a attempt, err error) (kind, error) {
	var k kind
	counted := false // the breaker counts it
	switch {
	case err == nil:
		k = succeeded
	case callerGone(ctx):
		k = abandoned
		if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err) // the caller's deadline
		}
	case store.Replied(err):
		k = rejected
	case g.answeredAfter(a, a.sent):
		k = overloaded
	case store.IsTimeout(err):
		// a process short of CPU since the call was sent may have kept its
		// reply from being read in time: the timeout says nothing of Redis,
		// and the breaker does not count it (see cpuMeter)
		starved := g.starvedSince(a)
		k, counted = timedOut, !starved
		if starved && g.answeredAfter(a, max(a.sent-int64(g.budget), 1)) {
			k = overloaded // Redis answered a moment before: shed
		}
	default:
		k, counted = failed, true
	}
	switch {
	case k == succeeded || k == rejected:
		a.br.success()
		if a.br != &g.br {
			a.br.replied(g.remote.Clock())
		}
	case counted:
		a.br.failure(a.sent, g.remote.Clock())
	case a.probe:
		a.br.abandon() // it said nothing about Redis: the next call probes
	}
	return k, err
}

// callerGone reports whether the caller's context ended, or its deadline
// passed: a read cut at that deadline may fail a moment before the
// context's own timer ends it.
func callerGone(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// call runs f, a call about r.Key, behind the breaker.
func (g *guard) call(ctx context.Context, r *store.Request, f func() error) (kind, error) {
	if g.remote == nil {
		return plain(f())
	}
	a, err := g.begin(r.Key, r.Deadline)
	if err != nil {
		return failed, err
	}
	return g.end(ctx, a, f())
}

// plain is the outcome of a call to the memory store: it fails only when
// its caller's context ends.
func plain(err error) (kind, error) {
	if err != nil {
		return abandoned, err
	}
	return succeeded, nil
}

// allow decides *r (see store.Store.Allow); the failure mode does not
// answer here (see fail). (r is a pointer: a Request is copied once, into
// the store's call.)
func (g *guard) allow(ctx context.Context, r *store.Request) (d store.Decision, k kind, err error) {
	k, err = g.call(ctx, r, func() (err error) {
		d, err = g.next.Allow(ctx, *r)
		return err
	})
	return d, k, err
}

// failClosedRetry is the RetryAfter and ResetAfter of a FailClosed denial.
const failClosedRetry = int64(1e6) // µs

// fail answers r by the failure mode, Redis having failed with err, and
// returns the failure as the caller is told of it (Result.BackendErr).
// FailLocal scales the Counts of r.Limits in place (the decision's Result
// names the scaled limits, see Limiter.answer). The error is FailLocal's
// store's, if any.
func (g *guard) fail(ctx context.Context, r store.Request, err error) (store.Decision, error, error) {
	d := store.Decision{Allowed: g.mode != FailClosed, States: r.Room()}
	switch g.mode {
	case FailClosed:
		d = closed(r)
	case FailLocal:
		var lerr error
		if d, lerr = g.local.Allow(ctx, g.localRequest(r)); lerr != nil {
			return d, nil, lerr
		}
	default: // FailOpen
		for i, lim := range r.Limits {
			d.States[i] = store.State{Remaining: max(lim.Count-r.N, 0)}
		}
	}
	return d, backendError{err}, nil
}

// shed answers r, a decision that ran out of time while Redis answered
// other calls (overloaded), as FailClosed answers, whatever the failure
// mode, with its failure as the caller is told of it (see ErrShed).
func shed(r store.Request, err error) (store.Decision, error) {
	return closed(r), backendError{fmt.Errorf("%w (%w)", ErrShed, err)}
}

// closed is FailClosed's answer to r: denied under every limit, due again
// in failClosedRetry.
func closed(r store.Request) store.Decision {
	d := store.Decision{States: r.Room()}
	for i := range r.Limits {
		d.States[i] = store.State{Retry: failClosedRetry, Reset: failClosedRetry}
	}
	return d
}

// localRequest turns r into the local store's: each Count of its limits
// scaled by the share, in place, on the process clock.
func (g *guard) localRequest(r store.Request) store.Request {
	for i := range r.Limits {
		r.Limits[i].Count = scaled(r.Limits[i].Count, g.share)
	}
	r.Now, r.Deadline = 0, time.Time{}
	return r
}

// localCopy returns the local store's request for r, leaving r's limits as
// they are.
func (g *guard) localCopy(r store.Request) store.Request {
	r.Limits = slices.Clone(r.Limits)
	return g.localRequest(r)
}

// scaled returns count multiplied by share, rounded down, at least 1. A
// product within 1e-6 of a whole number is that number, so that 0.29 of
// 100 is 29, not 28.999999999999996 rounded down.
func scaled(count int64, share float64) int64 {
	x := float64(count) * share
	if r := math.Round(x); math.Abs(x-r) < 1e-6 {
		x = r
	}
	return max(int64(x), 1)
}

// failure returns err as it reaches the caller of an operation the failure
// mode does not answer (Reset, Block, Refund, a release): a failure of
// Redis as a backendError, the caller's own context's end as it is.
func failure(k kind, err error) error {
	if k == succeeded || k == abandoned {
		return err
	}
	return backendError{err}
}

// reservation is what a reservation made, and who made it.
type reservation struct {
	store.Reservation
	local  bool  // the failure mode's local store made it
	failed error // the failure the failure mode answered
}

// reserve makes a reservation (see store.Store.Reserve), and answers
// Redis's failure by the failure mode: FailOpen lets the caller proceed at
// once, FailLocal reserves in the local store, FailClosed returns the
// failure.
//
// The reservation runs to its reply even when the caller's context ends
// first: the script may have run, and only its reply names the units it
// recorded. A caller that leaves gets ctx's error at once; the reply is
// then read on another goroutine, and a reservation it holds is given back.
func (g *guard) reserve(ctx context.Context, r store.Request, longest int64) (reservation, error) {
	type outcome struct {
		res store.Reservation
		k   kind
		err error
	}
	run := func(ctx context.Context) (o outcome) {
		o.k, o.err = g.call(ctx, &r, func() (err error) {
			o.res, err = g.next.Reserve(ctx, r, longest)
			return err
		})
		return o
	}
	var o outcome
	if ctx.Done() == nil || g.remote == nil {
		o = run(ctx)
	} else {
		done := make(chan outcome, 1)
		detached := context.WithoutCancel(ctx)
		go func() { done <- run(detached) }()
		select {
		case o = <-done:
		case <-ctx.Done():
			go func() {
				if o := <-done; o.err == nil && o.res.OK {
					_ = g.release(detached, r, reservation{Reservation: o.res})
				}
			}()
			return reservation{}, ctx.Err()
		}
	}
	if o.k == succeeded || o.k == abandoned {
		return reservation{Reservation: o.res}, o.err
	}
	err := error(backendError{o.err})
	switch g.mode {
	case FailOpen:
		return reservation{Reservation: store.Reservation{OK: true}, failed: err}, nil
	case FailLocal:
		res, lerr := g.local.Reserve(ctx, g.localCopy(r), longest)
		return reservation{Reservation: res, local: true, failed: err}, lerr
	}
	return reservation{failed: err}, err
}

// release gives back a reservation: the local store's there; one of
// FailOpen recorded nothing.
func (g *guard) release(ctx context.Context, r store.Request, res reservation) error {
	switch {
	case res.local:
		return g.local.Release(ctx, g.localCopy(r), res.Reservation)
	case res.failed != nil:
		return nil
	}
	return failure(g.call(ctx, &r, func() error { return g.next.Release(ctx, r, res.Reservation) }))
}

// both runs f, a Block or a Reset of r, on the local store too (it
// decides while Redis is down), then on Redis; Redis's failure is returned.
func (g *guard) both(ctx context.Context, r store.Request, f func(store.Store, store.Request) error) error {
	if g.local != nil {
		_ = f(g.local, g.localCopy(r))
	}
	return failure(g.call(ctx, &r, func() error { return f(g.next, r) }))
}

// refund gives back units recorded by the local store (local: the failure
// mode decided) there, and any others in Redis. When Redis fails,
// FailLocal gives back the local store's newest units (it decided while
// Redis was down), and Redis's failure is returned.
func (g *guard) refund(ctx context.Context, r store.Request, local bool) error {
	if local {
		if g.local == nil {
			return nil // FailOpen recorded nothing
		}
		return g.local.Refund(ctx, g.localCopy(r))
	}
	k, err := g.call(ctx, &r, func() error { return g.next.Refund(ctx, r) })
	if k != succeeded && k != abandoned && g.local != nil {
		lr := g.localCopy(r)
		lr.At = 0
		_ = g.local.Refund(ctx, lr)
	}
	return failure(k, err)
}

// backendError is a failure of Redis that the caller is told of: an error
// reply, a lost connection, the timeout, or the open circuit.
type backendError struct{ err error }

func (e backendError) Error() string { return e.err.Error() }
func (e backendError) Unwrap() error { return e.err }

// cpuMeter tells whether this process was short of CPU since a call was
// sent (see guard.starvedSince), by the runtime's metrics: how long goroutines
// waited to run (/sched/latencies:seconds, counted when a goroutine gets to
// run) and how many wait now (/sched/goroutines/runnable:goroutines). Then
// a call that ran out of time without a reply may have waited for this
// process, not for Redis: the goroutine that would read its reply, woken by
// the network poller, stands in the run queue behind the runnable ones (in
// a flood on 2 cores: 100s of ms), while its caller, woken by its timer,
// runs at once and sees no reply. Answered by the failure mode, such calls
// let requests through while Redis was healthy (TestFlood; beside two busy
// loops, 1-3 runs in 10), and three of them in a row opened the breaker
// (CI, the whole suite beside TestFlood's flood). So the breaker does not
// count such a call, and when Redis answered a moment before it, it is
// overload: shed. On an idle machine a goroutine waits microseconds to run.
// It is looked at when the Limiter is made (the counts from which later
// looks count) and when a call ran out of time without a reply.
type cpuMeter struct {
	mu     sync.Mutex
	sample [2]metrics.Sample
	last   []uint64 // the histogram's counts at the last look
	// the store's clock at the last look that saw the process short of
	// CPU: a goroutine that waited guard.starved() to run, or a full run
	// queue
	long int64
}

// slice is the scheduler's time slice: a goroutine that waited that long
// to run waited for another's whole turn on the CPU.
const slice = 10 * time.Millisecond

// starvedSince reports whether this process was short of CPU since a's
// call was sent (see cpuMeter). Then a call out of time without a reply
// may have waited for this process, not for Redis: the breaker does not
// count it, and when Redis answered within a budget before the call was
// sent (it was alive a moment ago), the decision is shed. A Redis silent
// for longer is a failure, however busy the process: FailOpen and
// FailLocal answer.
func (g *guard) starvedSince(a attempt) bool {
	return g.budget > 0 && g.cpu.starvedSince(a.sent, g.remote.Clock(), g.starved(), g.budget)
}

// starved is how long a goroutine waits to run when this process is short
// of CPU (see cpuMeter): half a decision's budget, at most 20ms.
func (g *guard) starved() time.Duration { return min(g.budget/2, 20*time.Millisecond) }

// starvedSince reports whether the process was short of CPU between sent
// and now (the store's clock), looking at now (see look).
func (m *cpuMeter) starvedSince(sent, now int64, wait, budget time.Duration) bool {
	if wait <= 0 {
		return false // no budget: nothing to tell
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.look(now, wait, budget)
	return m.long != 0 && m.long >= sent
}

// look reads the metrics at now, and notes now as a moment short of CPU
// when a goroutine waited at least wait to run since the last look, or the
// goroutines waiting to run now would fill the processors for budget, if
// each used its time slice.
func (m *cpuMeter) look(now int64, wait, budget time.Duration) {
	m.sample[0].Name = "/sched/latencies:seconds"
	m.sample[1].Name = "/sched/goroutines/runnable:goroutines"
	metrics.Read(m.sample[:])
	if m.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return // not measured by this runtime
	}
	if m.sample[1].Value.Kind() == metrics.KindUint64 &&
		m.sample[1].Value.Uint64() >= uint64(runtime.GOMAXPROCS(0))*uint64(budget/slice) {
		m.long = now
	}
	h := m.sample[0].Value.Float64Histogram()
	if len(m.last) > 0 {
		for i, c := range h.Counts {
			if i < len(m.last) && c > m.last[i] && h.Buckets[i] >= wait.Seconds() {
				m.long = now
			}
		}
	}
	m.last = append(m.last[:0], h.Counts...)
}
