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

// guard wraps a Limiter's calls to its store: over Redis it keeps a breaker
// per node and classifies failures (see end); over memory it passes them on.
type guard struct {
	next    store.Store
	remote  store.Remote // next, over Redis; nil: the memory store
	br      breaker      // the client's
	masters sync.Map     // Cluster master address → *breaker: a failing master stops its keys only
	mode    FailureMode
	cpu     cpuMeter
	budget  time.Duration   // a decision's: the Limiter's timeout
	local   *memstore.Store // FailLocal's store; else nil
	// released drops the Limiter's cached denials of a key whose
	// reservation went back to Redis (its units are free); nil: none
	released func(key string)
	share    float64 // FailLocal's share of each Count
}

// kind is what the outcome of a call says about Redis.
type kind uint8

const (
	succeeded kind = iota // Redis answered
	abandoned             // the caller's context ended first: nothing learnt of Redis
	rejected              // Redis answered an error: alive, so the breaker does not count it
	// overloaded: no reply, while Redis answered other calls since the
	// decision began: slow, not down. Not counted; the decision is shed.
	overloaded
	// timedOut: no reply in time, and no other reply since the decision
	// began. Counted, unless this process was short of CPU (see cpuMeter).
	timedOut
	// failed: a connection failure with no other reply since the decision
	// began (counted), or the breaker is open (not counted again).
	failed
)

// retried reports whether a decision of this kind goes again once.
func (k kind) retried() bool { return k == overloaded || k == timedOut }

// attempt is one call to Redis under way.
type attempt struct {
	// sent is the store's clock when the decision's budget began (else when
	// the call was sent): the outcome is judged by what happened since, so a
	// budget spent before the call counts against this process, not Redis.
	sent  int64
	node  string   // the Cluster master that serves the key (store.Remote.Node); "": any
	br    *breaker // node's breaker, else the client's
	probe bool     // the call is br's probe
}

// begin starts a call to Redis about key for a decision whose budget
// began at began (zero: now), or returns ErrCircuitOpen.
func (g *guard) begin(key string, began time.Time) (attempt, error) {
	now := g.remote.Clock()
	a := attempt{sent: now, node: g.remote.Node(key), br: &g.br}
	if a.node != "" {
		b, ok := g.masters.Load(a.node)
		if !ok {
			b, _ = g.masters.LoadOrStore(a.node, new(breaker))
		}
		a.br = b.(*breaker)
	}
	if !began.IsZero() && g.budget > 0 {
		spent := min(max(time.Since(began), 0), g.budget)
		a.sent = max(now-int64(spent), 1)
	}
	var ok bool
	if ok, a.probe = a.br.allow(now); !ok {
		return a, ErrCircuitOpen
	}
	return a, nil
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
	case g.remote.AnsweredSince(a.node, a.sent):
		k = overloaded
	case store.IsTimeout(err):
		starved := g.starvedSince(a)
		k, counted = timedOut, !starved
		if starved && g.remote.AnsweredSince(a.node, 1) && a.sent < g.silentSince(a)+int64(g.budget) {
			k = overloaded // sent as Redis fell silent, if it did: shed
		}
	default:
		k, counted = failed, true
	}
	switch {
	case k == succeeded || k == rejected:
		a.br.success()
	case counted:
		a.br.failure(a.sent, g.remote.Clock(), a.probe)
	case a.probe:
		a.br.abandon() // it said nothing about Redis: the next call probes
	}
	return k, err
}

// callerGone reports whether ctx ended or its deadline passed (a read cut
// at that deadline may fail just before ctx's timer fires).
func callerGone(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// call runs f, a call about r.Key, behind the breaker, for a decision whose
// budget began at began (see begin; zero for a Wait's calls and the rest).
func (g *guard) call(ctx context.Context, r *store.Request, began time.Time, f func() error) (kind, error) {
	if err := ctx.Err(); err != nil {
		return abandoned, err // nothing decided, not even by an open breaker's failure mode
	}
	if g.remote == nil {
		return succeeded, f() // the memory store returns no error
	}
	a, err := g.begin(r.Key, began)
	if err != nil {
		return failed, err
	}
	return g.end(ctx, a, f())
}

// allow decides *r without the failure mode (see fail), for a decision
// whose budget began at began (zero: now).
func (g *guard) allow(ctx context.Context, r *store.Request, began time.Time) (d store.Decision, k kind, err error) {
	k, err = g.call(ctx, r, began, func() (err error) {
		d, err = g.next.Allow(ctx, *r)
		return err
	})
	return d, k, err
}

// fail answers r by the failure mode after Redis failed with err, returning
// the failure for Result.BackendErr. FailLocal scales r.Limits' Counts in
// place (the Result names the scaled limits).
func (g *guard) fail(ctx context.Context, r store.Request, err error) (store.Decision, error) {
	d := store.Decision{Allowed: g.mode != FailClosed, States: r.Room()}
	switch g.mode {
	case FailClosed:
		d = closed(r)
	case FailLocal:
		d, _ = g.local.Allow(ctx, g.localRequest(r)) // the memory store returns no error
	default: // FailOpen
		for i, lim := range r.Limits {
			d.States[i] = store.State{Remaining: max(lim.Count-r.N, 0)}
		}
	}
	return d, backendError{err}
}

// shed answers an overloaded r as FailClosed does, whatever the mode (ErrShed).
func shed(r store.Request, err error) (store.Decision, error) {
	return closed(r), backendError{fmt.Errorf("%w (%w)", ErrShed, err)}
}

// closed is FailClosed's answer to r: denied under every limit for a second.
func closed(r store.Request) store.Decision {
	d := store.Decision{States: r.Room()}
	for i := range r.Limits {
		d.States[i] = store.State{Retry: 1e6, Reset: 1e6} // µs
	}
	return d
}

// localRequest turns r into the local store's: Counts scaled in place, on
// the process clock. localCopy does so on a copy of the limits.
func (g *guard) localRequest(r store.Request) store.Request {
	for i := range r.Limits {
		r.Limits[i].Count = scaled(r.Limits[i].Count, g.share)
	}
	r.Now, r.Deadline = 0, time.Time{}
	return r
}

func (g *guard) localCopy(r store.Request) store.Request {
	r.Limits = slices.Clone(r.Limits)
	return g.localRequest(r)
}

// scaled returns count*share rounded down, at least 1; within 1e-6 of a
// whole number it is that number (0.29 of 100 is 29, not 28).
func scaled(count int64, share float64) int64 {
	x := float64(count) * share
	if r := math.Round(x); math.Abs(x-r) < 1e-6 {
		x = r
	}
	return max(int64(x), 1)
}

// failure returns err for an operation the failure mode does not answer: a
// failure of Redis as a backendError, the caller's context's end as it is.
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

// reserve makes a reservation; on Redis's failure FailOpen lets the caller
// proceed, FailLocal reserves locally, FailClosed returns the failure.
// The call runs to its reply even if ctx ends (only the reply names the
// units recorded): the caller gets ctx's error at once, and a reservation
// the reply holds is given back on another goroutine (see release).
func (g *guard) reserve(ctx context.Context, r store.Request, longest int64, wait time.Duration) (reservation, error) {
	type outcome struct {
		res store.Reservation
		k   kind
		err error
	}
	run := func(ctx context.Context) (o outcome) {
		o.k, o.err = g.call(ctx, &r, time.Time{}, func() (err error) {
			o.res, err = g.next.Reserve(ctx, r, longest)
			return err
		})
		return o
	}
	var o outcome
	if ctx.Done() == nil || g.remote == nil || ctx.Err() != nil { // ended: call sends nothing
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
					_ = g.release(detached, r, reservation{Reservation: o.res}, wait)
				}
			}()
			return reservation{}, ctx.Err()
		}
	}
	switch o.k {
	case succeeded, abandoned:
		return reservation{Reservation: o.res}, o.err
	case overloaded: // shed: no slot, whatever the failure mode (see poll)
		_, err := shed(r, o.err)
		return reservation{failed: err}, nil
	}
	err := error(backendError{o.err})
	switch g.mode {
	case FailOpen:
		return reservation{Reservation: store.Reservation{OK: true}, failed: err}, nil
	case FailLocal:
		res, _ := g.local.Reserve(ctx, g.localCopy(r), longest)
		return reservation{Reservation: res, local: true, failed: err}, nil
	}
	return reservation{failed: err}, err
}

// release gives back a reservation where it was made (FailOpen's: nowhere),
// best effort, ctx ended or not, on a call bounded by wait (WithWaitTimeout;
// 0: DefaultWaitTimeout) alone: r's deadline, the reservation's, may have
// passed while its caller slept.
func (g *guard) release(ctx context.Context, r store.Request, res reservation, wait time.Duration) error {
	if wait <= 0 {
		wait = DefaultWaitTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	r.Deadline, _ = ctx.Deadline()
	switch {
	case res.local:
		return g.local.Release(ctx, g.localCopy(r), res.Reservation)
	case res.failed != nil:
		return nil
	}
	err := failure(g.call(ctx, &r, time.Time{}, func() error { return g.next.Release(ctx, r, res.Reservation) }))
	if g.released != nil {
		g.released(r.Key)
	}
	return err
}

// both runs f (a Block or Reset) on the local store, if any, then on Redis,
// returning Redis's failure.
func (g *guard) both(ctx context.Context, r store.Request, f func(store.Store, store.Request) error) error {
	if g.local != nil {
		_ = f(g.local, g.localCopy(r))
	}
	return failure(g.call(ctx, &r, time.Time{}, func() error { return f(g.next, r) }))
}

// refund gives back units where they were recorded (local: FailLocal's store,
// the only failure mode whose units a Decision charges); when Redis fails,
// FailLocal gives back its store's newest units. It returns Redis's failure.
func (g *guard) refund(ctx context.Context, r store.Request, local bool) error {
	if local {
		return g.local.Refund(ctx, g.localCopy(r))
	}
	k, err := g.call(ctx, &r, time.Time{}, func() error { return g.next.Refund(ctx, r) })
	if k != succeeded && k != abandoned && g.local != nil {
		r.At = 0
		_ = g.local.Refund(ctx, g.localCopy(r))
	}
	return failure(k, err)
}

// backendError is a failure of Redis that the caller is told of.
type backendError struct{ err error }

func (e backendError) Error() string { return e.err.Error() }
func (e backendError) Unwrap() error { return e.err }

// cpuMeter tells, by the runtime's scheduler metrics, whether this process
// was short of CPU since a call was sent. Then a call out of time may have
// waited for this process, not Redis: the goroutine that would read the
// reply sat in the run queue while its caller's timer fired. Counting such
// calls once let floods through and opened the breaker on a healthy Redis.
// So the breaker does not count them, and the decision is shed when Redis
// has answered this client and the call went within a budget of when Redis
// fell silent (silentSince): a starved process's first calls after a quiet
// spell are shed, not admitted, while a Redis that stopped answering gets
// the failure mode for calls sent a budget later.
type cpuMeter struct {
	mu     sync.Mutex
	sample [2]metrics.Sample
	last   []uint64 // the histogram's counts at the last look
	long   int64    // the store's clock at the last look that saw a shortage
}

// silentSince returns when Redis fell silent for a's node, a's call out of
// time without a reply: when the first call went of those out of time since
// Redis last answered (a's, or an earlier).
func (g *guard) silentSince(a attempt) int64 {
	for {
		s := a.br.silence.Load()
		if s != 0 && s <= a.sent && !g.remote.AnsweredSince(a.node, s) {
			return s // the silence goes on
		}
		if a.br.silence.CompareAndSwap(s, a.sent) {
			return a.sent // a new silence, or a's call went before the one noted
		}
	}
}

// starvedSince reports whether this process was short of CPU since a went.
func (g *guard) starvedSince(a attempt) bool {
	now, wait := g.remote.Clock(), g.starved()
	if wait <= 0 {
		return false // no budget: nothing to tell
	}
	g.cpu.mu.Lock()
	defer g.cpu.mu.Unlock()
	g.cpu.look(now, wait, g.budget)
	return g.cpu.long != 0 && g.cpu.long >= a.sent
}

// starved is how long a goroutine waits to run when this process is short
// of CPU: half a decision's budget, at most 20ms.
func (g *guard) starved() time.Duration { return min(g.budget/2, 20*time.Millisecond) }

// look reads the metrics, noting now as short of CPU when a goroutine waited
// at least wait to run since the last look, or the runnable goroutines would
// fill the processors for budget at a scheduler time slice (10ms) each.
func (m *cpuMeter) look(now int64, wait, budget time.Duration) {
	m.sample[0].Name = "/sched/latencies:seconds"
	m.sample[1].Name = "/sched/goroutines/runnable:goroutines"
	metrics.Read(m.sample[:])
	if m.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return // not measured by this runtime
	}
	if m.sample[1].Value.Kind() == metrics.KindUint64 &&
		m.sample[1].Value.Uint64() >= uint64(runtime.GOMAXPROCS(0))*uint64(budget/(10*time.Millisecond)) {
		m.long = now
	}
	h := m.sample[0].Value.Float64Histogram()
	for i, c := range h.Counts {
		if i < len(m.last) && c > m.last[i] && h.Buckets[i] >= wait.Seconds() {
			m.long = now
		}
	}
	m.last = append(m.last[:0], h.Counts...)
}
