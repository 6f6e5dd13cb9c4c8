package core

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// guard wraps each call of a Limiter to its store. Over Redis it bounds
// the call by a timeout, keeps a circuit breaker, and tells what a failed
// call means (a kind, see classify); the failure mode (fail) then answers
// for Redis. Over the memory store it only passes calls on.
type guard struct {
	next base       // the Redis scripts or the memory store
	t    *transport // the Redis transport; nil: the memory store
	br   breaker    // the client's (see breakerFor)
	// masterOf returns the address of the Cluster master that serves a
	// key, "" when unknown; nil: not a Cluster
	masterOf func(key string) string
	masters  sync.Map // master address → *breaker
	mode     FailureMode
	// local is FailLocal's store; nil for the other modes
	local *memoryStore
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
	// client since this one was sent: Redis or this process is slow, not
	// down. The breaker does not count it.
	overloaded
	// timedOut: no reply in time, and no other reply since the call was
	// sent (Redis failing, or a slow moment: a cold start, a process
	// starved of CPU). The breaker counts it.
	timedOut
	// failed: a connection failure, and no other reply since the call was
	// sent, which the breaker counts; or the breaker is open (ErrCircuitOpen,
	// not counted again).
	failed
)

// retried reports whether a decision of this kind goes again once before
// the failure mode answers (see Limiter.decide).
func (k kind) retried() bool { return k == overloaded || k == timedOut }

// attempt is one call to Redis under way.
type attempt struct {
	ctx    context.Context // the call's: the caller's, bounded by the timeout
	cancel context.CancelFunc
	sent   int64    // the transport's clock when it was sent
	br     *breaker // the breaker of the node that serves the key
	probe  bool     // the call is br's probe
}

// begin starts a call to Redis about key within d (0: no bound but ctx);
// or returns ErrCircuitOpen.
func (g *guard) begin(ctx context.Context, d time.Duration, key string) (attempt, error) {
	a := attempt{ctx: ctx, sent: g.t.clock(), br: g.breakerFor(key)}
	ok, probe := a.br.allow(a.sent)
	if !ok {
		return a, ErrCircuitOpen
	}
	a.probe = probe
	if d > 0 {
		a.ctx, a.cancel = context.WithTimeout(ctx, d)
	}
	return a, nil
}

// breakerFor returns the breaker of the node that serves key: on a
// Cluster, its master's, where the client knows it (one breaker per
// master, so that a failing master stops calls for its keys only); else
// the client's.
func (g *guard) breakerFor(key string) *breaker {
	if g.masterOf == nil || !g.t.answeredSince(1) { // the client knows no master before a reply
		return &g.br
	}
	addr := g.masterOf(key)
	if addr == "" {
		return &g.br
	}
	if b, ok := g.masters.Load(addr); ok {
		return b.(*breaker)
	}
	b, _ := g.masters.LoadOrStore(addr, new(breaker))
	return b.(*breaker)
}

// answeredSince reports whether the node that serves a's key answered
// since a was sent: on a Cluster, its master (the replies to this
// Limiter's calls on its keys), so that a silent master's timeouts count
// while the others answer; else the client.
func (g *guard) answeredSince(a attempt) bool {
	if a.br != &g.br {
		return a.br.lastReply.Load() >= a.sent
	}
	return g.t.answeredSince(a.sent)
}

// end classifies the outcome err of attempt a by the caller's ctx, and
// tells the breaker.
func (g *guard) end(ctx context.Context, a attempt, err error) (kind, error) {
	if a.cancel != nil {
		a.cancel()
	}
	var k kind
	switch {
	case err == nil:
		k = succeeded
	case ctx.Err() != nil:
		k = abandoned
	case replied(err):
		k = rejected
	case g.answeredSince(a):
		k = overloaded
	case isTimeout(err):
		k = timedOut
	default:
		k = failed
	}
	switch k {
	case succeeded, rejected:
		a.br.success()
		if a.br != &g.br {
			a.br.lastReply.Store(g.t.clock())
		}
	case timedOut, failed:
		a.br.failure(a.sent, g.t.clock())
		if !g.t.noteDial(err) {
			g.t.checkDial()
		}
	default:
		if a.probe {
			a.br.abandon() // it said nothing about Redis: the next call probes
		}
	}
	return k, err
}

// isTimeout reports whether err is a deadline's: the context's, or a
// read's or write's.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout()
}

// call runs f, a call about key, with a context bounded by d, behind the
// breaker.
func (g *guard) call(ctx context.Context, d time.Duration, key string, f func(context.Context) error) (kind, error) {
	if g.t == nil {
		return g.plain(f(ctx))
	}
	a, err := g.begin(ctx, d, key)
	if err != nil {
		return failed, err
	}
	return g.end(ctx, a, f(a.ctx))
}

// plain is the outcome of a call to the memory store: it fails only when
// its caller's context ends.
func (g *guard) plain(err error) (kind, error) {
	if err != nil {
		return abandoned, err
	}
	return succeeded, nil
}

// allow decides q within d (see store.allow); the failure mode does not
// answer here (see fail).
func (g *guard) allow(ctx context.Context, q *query, d time.Duration) (kind, error) {
	if g.t == nil {
		return g.plain(g.next.allow(ctx, q))
	}
	a, err := g.begin(ctx, 0, q.key)
	if err != nil {
		return failed, err
	}
	// the transport keeps d itself: a queued decision needs no context of
	// its own (see transport.run)
	return g.end(ctx, a, g.next.(*redisStore).allowWithin(ctx, q, d))
}

// failClosedRetry is the RetryAfter and ResetAfter of a FailClosed denial.
const failClosedRetry = int64(1e6) // µs

// fail answers q by the failure mode, Redis having failed with err: the
// decision holds the failure in q.backendErr (Result.BackendErr). The
// error is FailLocal's store's, if any.
func (g *guard) fail(ctx context.Context, q *query, err error) error {
	switch g.mode {
	case FailClosed:
		for i := range q.decided(false) {
			q.states[i] = limitState{retry: failClosedRetry, reset: failClosedRetry}
		}
	case FailLocal:
		g.localQuery(q)
		if lerr := g.local.allow(ctx, q); lerr != nil {
			return lerr
		}
	default: // FailOpen
		for i := range q.decided(true) {
			q.states[i] = limitState{remaining: max(q.limits[i].Count-q.n, 0)}
		}
	}
	q.backendErr = g.backendError(err)
	return nil
}

// backendError returns err, a failure of Redis, as its caller is told of
// it: explained by a failed dial when there is a recent one.
func (g *guard) backendError(err error) error {
	if g.t != nil {
		err = g.t.explain(err)
	}
	return backendError{err}
}

// localQuery turns q into the local store's query: each Count scaled by
// the share (the decision's Result then names the scaled limit), on the
// process clock.
func (g *guard) localQuery(q *query) {
	for i := range q.limits {
		q.limits[i].Count = scaled(q.limits[i].Count, g.share)
	}
	q.now = 0
}

// localCopy returns a copy of q for the local store, leaving q as it is.
func (g *guard) localCopy(q *query) *query {
	lq := *q
	lq.limits = append([]Limit(nil), q.limits...)
	g.localQuery(&lq)
	return &lq
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

// reserve makes a reservation within d (see store.reserve), and answers
// Redis's failure by the failure mode: FailOpen lets the caller proceed at
// once, FailLocal reserves in the local store, FailClosed returns the
// failure.
//
// The reservation runs to its reply even when the caller's context ends
// first: the script may have run, and only its reply names the units it
// recorded. A caller that leaves gets ctx's error at once; the reply is
// then read on another goroutine, and a reservation it holds is given back.
func (g *guard) reserve(ctx context.Context, q *query, longest int64, d time.Duration) (reservation, error) {
	type outcome struct {
		r   reservation
		k   kind
		err error
	}
	run := func(ctx context.Context) outcome {
		var r reservation
		k, err := g.call(ctx, d, q.key, func(ctx context.Context) (err error) {
			r, err = g.next.reserve(ctx, q, longest)
			return err
		})
		return outcome{r, k, err}
	}
	var o outcome
	if ctx.Done() == nil || g.t == nil {
		o = run(ctx)
	} else {
		done := make(chan outcome, 1)
		detached := context.WithoutCancel(ctx)
		go func() { done <- run(detached) }()
		select {
		case o = <-done:
		case <-ctx.Done():
			go func() {
				if o := <-done; o.err == nil && o.r.ok {
					_ = g.release(detached, q, o.r, d)
				}
			}()
			return reservation{}, ctx.Err()
		}
	}
	if o.k == succeeded || o.k == abandoned {
		return o.r, o.err
	}
	err := g.backendError(o.err)
	switch g.mode {
	case FailOpen:
		return reservation{ok: true, failed: err}, nil
	case FailLocal:
		r, lerr := g.local.reserve(ctx, g.localCopy(q), longest)
		r.local, r.failed = true, err
		return r, lerr
	}
	return reservation{failed: err}, err
}

// release gives back a reservation: the local store's there; one of
// FailOpen recorded nothing.
func (g *guard) release(ctx context.Context, q *query, r reservation, d time.Duration) error {
	switch {
	case r.local:
		return g.local.release(ctx, q, r)
	case r.failed != nil:
		return nil
	}
	return failure(g.call(ctx, d, q.key, func(ctx context.Context) error { return g.next.release(ctx, q, r) }))
}

// block blocks the key in the local store too (it decides while Redis is
// down), then in Redis; Redis's failure is returned.
func (g *guard) block(ctx context.Context, q *query, d int64, timeout time.Duration) error {
	if g.local != nil {
		_ = g.local.block(ctx, q, d)
	}
	return failure(g.call(ctx, timeout, q.key, func(ctx context.Context) error { return g.next.block(ctx, q, d) }))
}

// reset forgets the key in the local store too, then in Redis; Redis's
// failure is returned.
func (g *guard) reset(ctx context.Context, q *query, d time.Duration) error {
	if g.local != nil {
		_ = g.local.reset(ctx, q)
	}
	return failure(g.call(ctx, d, q.key, func(ctx context.Context) error { return g.next.reset(ctx, q) }))
}

// refund gives back units recorded by the local store (q.local: the
// failure mode decided) there, and any others in Redis. When Redis fails,
// FailLocal gives back the local store's newest units (it decided while
// Redis was down), and Redis's failure is returned.
func (g *guard) refund(ctx context.Context, q *query, d time.Duration) error {
	if q.local {
		if g.local == nil {
			return nil // FailOpen recorded nothing
		}
		return g.local.refund(ctx, g.localCopy(q))
	}
	k, err := g.call(ctx, d, q.key, func(ctx context.Context) error { return g.next.refund(ctx, q) })
	if k != succeeded && k != abandoned && g.local != nil {
		lq := g.localCopy(q)
		lq.at = 0
		_ = g.local.refund(ctx, lq)
	}
	return failure(k, err)
}

// backendError is a failure of Redis that the caller is told of: an error
// reply, a lost connection, the timeout, or the open circuit.
type backendError struct{ err error }

func (e backendError) Error() string { return e.err.Error() }
func (e backendError) Unwrap() error { return e.err }

func isBackendError(err error) bool {
	var be backendError
	return errors.As(err, &be)
}
