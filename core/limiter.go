package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter decides whether requests pass. It is safe for concurrent use by
// many goroutines; create one per process and share it.
type Limiter struct {
	store    store
	remote   bool         // store is Redis: timeouts, breaker and failure mode apply
	local    *memoryStore // FailLocal's store
	clock    func() time.Time
	timeout  time.Duration
	waitTime time.Duration // WithWaitTimeout
	mode     FailureMode
	share    float64
	cache    *denyCache
	observer Observer
	breaker  breaker
}

// New returns a Limiter that keeps its counts in Redis. rdb may be a
// *redis.Client, *redis.ClusterClient, *redis.Ring or a failover client:
// every call is one script run on the keys of one hash slot.
func New(rdb redis.Scripter, opts ...Option) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("ratewindow: nil redis client")
	}
	c := defaults()
	for _, o := range opts {
		if o.apply != nil {
			o.apply(&c)
		}
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	l := newLimiter(c)
	l.store, l.remote = newRedisStore(rdb, c.prefix), true
	if c.mode == FailLocal {
		l.local = newMemoryStore(l.micros)
	}
	return l, nil
}

// NewMemory returns a Limiter that keeps its counts in this process's
// memory, with the same algorithms as Redis. Limits then hold per process,
// not across replicas. Options about Redis (prefix, timeout, failure mode,
// deny cache) have no effect.
func NewMemory(opts ...Option) *Limiter {
	c := defaults()
	for _, o := range opts {
		if o.apply != nil {
			o.apply(&c)
		}
	}
	// the deny cache saves round trips; the memory store has none to save
	c.mode, c.timeout, c.cacheSize = FailOpen, 0, 0
	l := newLimiter(c)
	l.store = newMemoryStore(l.micros)
	return l
}

func newLimiter(c config) *Limiter {
	l := &Limiter{clock: c.clock, timeout: c.timeout, waitTime: c.waitTime, mode: c.mode, share: c.share, observer: c.observer}
	if c.cacheSize > 0 {
		l.cache = newDenyCache(c.cacheSize)
	}
	return l
}

func (l *Limiter) now() time.Time {
	if l.clock != nil {
		return l.clock()
	}
	return time.Now()
}

// micros is the time in µs since the epoch on the Limiter's clock.
func (l *Limiter) micros() int64 { return l.now().UnixMicro() }

// queryTime is the time passed to the store: the injected clock, or 0 for
// the store's own (Redis TIME).
func (l *Limiter) queryTime() int64 {
	if l.clock != nil {
		return l.clock().UnixMicro()
	}
	return 0
}

// Allow reports whether one unit under every limit fits now, and records it
// under all of them when it does. A denied request records nothing.
func (l *Limiter) Allow(ctx context.Context, key string, limits ...Limit) (Result, error) {
	return l.decide(ctx, OpAllow, "", key, 1, limits)
}

// AllowN is Allow for n units at once, such as the cost of an expensive
// request. A cost above a limit's Count is denied with RetryAfter < 0.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64, limits ...Limit) (Result, error) {
	return l.decide(ctx, OpAllow, "", key, n, limits)
}

// Peek reports whether one unit would be allowed now, and what remains,
// without recording anything.
func (l *Limiter) Peek(ctx context.Context, key string, limits ...Limit) (Result, error) {
	return l.decide(ctx, OpPeek, "", key, 1, limits)
}

// Reset forgets every unit recorded for key under limits, and this
// Limiter's cached denials of key.
func (l *Limiter) Reset(ctx context.Context, key string, limits ...Limit) error {
	if err := validate(key, 1, limits); err != nil {
		return err
	}
	if l.cache != nil {
		l.cache.forget(key)
	}
	q := query{key: key, n: 1, limits: limits}
	if l.local != nil {
		_ = l.local.reset(ctx, &q)
	}
	return l.guarded().reset(ctx, &q)
}

// decide validates, consults the deny cache, asks the store and applies the
// failure mode. rule is the Rule's name for observers.
func (l *Limiter) decide(ctx context.Context, op Op, rule, key string, n int64, limits []Limit) (Result, error) {
	if err := validate(key, n, limits); err != nil {
		return Result{}, err
	}
	var start time.Time
	if l.observer != nil {
		start = time.Now()
	}
	commit := op != OpPeek
	var cachedAt int64
	if l.cache != nil && commit {
		cachedAt = l.now().UnixNano()
		if r, ok := l.cache.get(key, n, limits, cachedAt); ok {
			l.observe(Event{Op: op, Rule: rule, Key: key, Result: r, CacheHit: true}, start)
			return r, nil
		}
	}
	var (
		r   Result
		err error
	)
	if ms, ok := l.store.(*memoryStore); ok {
		r = ms.decide(key, n, limits, commit, l.queryTime()) // no allocation
	} else {
		// the query crosses an interface: give it its own copy of limits
		// so that the caller's variadic slice can stay on its stack
		q := &query{key: key, n: n, limits: slices.Clone(limits), commit: commit, now: l.queryTime()}
		r, err = l.run(ctx, q)
	}
	if err == nil && l.cache != nil && commit && !r.Allowed {
		l.cache.put(key, n, limits, cachedAt, r)
	}
	if l.observer != nil {
		ev := Event{Op: op, Rule: rule, Key: key, Result: r, Err: err}
		if err != nil { // run answered by the failure mode
			ev.Failed, ev.Fallback = true, l.mode
		}
		l.observe(ev, start)
	}
	return r, err
}

func (l *Limiter) observe(ev Event, start time.Time) {
	if l.observer != nil {
		ev.Latency = time.Since(start)
		l.observer(ev)
	}
}

func (l *Limiter) withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if l.remote && d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return ctx, func() {}
}

// run asks the store; a failure is answered by the failure mode, with the
// error.
func (l *Limiter) run(ctx context.Context, q *query) (Result, error) {
	r, err := l.guarded().allow(ctx, q)
	if err != nil {
		return l.fallback(ctx, q, err)
	}
	return r, nil
}

// guarded returns the store behind the decision timeout and the circuit
// breaker.
func (l *Limiter) guarded() store { return l.guardedBy(l.timeout) }

// guardedBy returns the store behind the timeout d and the circuit breaker.
func (l *Limiter) guardedBy(d time.Duration) store {
	if !l.remote {
		return l.store
	}
	return guard{l, d}
}

// guard applies a timeout and the Limiter's circuit breaker to every call
// to Redis, and marks Redis's errors as backendError.
type guard struct {
	l       *Limiter
	timeout time.Duration
}

// guardCall runs f on Redis behind the breaker, with a context bounded by
// the timeout and the caller's.
func guardCall[T any](l *Limiter, timeout time.Duration, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	var zero T
	b := &l.breaker
	ok, probe := b.allow(time.Now().UnixNano())
	if !ok {
		return zero, backendError{ErrCircuitOpen}
	}
	cctx, cancel := l.withTimeout(ctx, timeout)
	v, err := f(cctx) // the batcher returns at cctx's deadline, whatever the client
	cancel()
	switch {
	case err == nil:
		b.success()
		return v, nil
	case ctx.Err() != nil: // the caller gave up: not Redis's fault
		if probe {
			b.abandon()
		}
		return zero, err
	}
	b.failure(time.Now().UnixNano())
	return zero, backendError{err}
}

func (g guard) allow(ctx context.Context, q *query) (Result, error) {
	return guardCall(g.l, g.timeout, ctx, func(ctx context.Context) (Result, error) { return g.l.store.allow(ctx, q) })
}

// reserve runs the reservation to its reply even when the caller's
// context ends first: the script may have run, and only its reply names the
// units it recorded. A caller that leaves gets ctx's error at once; the
// reply is then read on another goroutine, and a reservation it holds is
// given back. Only a Redis that does not answer within the timeout leaves
// the outcome unknown (the units then leave with the window).
func (g guard) reserve(ctx context.Context, q *query, longest int64) (reservation, error) {
	run := func(ctx context.Context) (reservation, error) {
		return guardCall(g.l, g.timeout, ctx, func(ctx context.Context) (reservation, error) { return g.l.store.reserve(ctx, q, longest) })
	}
	if ctx.Done() == nil {
		return run(ctx)
	}
	type outcome struct {
		r   reservation
		err error
	}
	done := make(chan outcome, 1)
	detached := context.WithoutCancel(ctx)
	go func() {
		r, err := run(detached)
		done <- outcome{r, err}
	}()
	select {
	case o := <-done:
		return o.r, o.err
	case <-ctx.Done():
		go func() {
			if o := <-done; o.err == nil && o.r.ok {
				_ = g.release(detached, q, o.r)
			}
		}()
		return reservation{}, ctx.Err()
	}
}

func (g guard) release(ctx context.Context, q *query, r reservation) error {
	_, err := guardCall(g.l, g.timeout, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, g.l.store.release(ctx, q, r) })
	return err
}

func (g guard) reset(ctx context.Context, q *query) error {
	_, err := guardCall(g.l, g.timeout, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, g.l.store.reset(ctx, q) })
	return err
}

// backendError is a failure of Redis: an error reply, a lost connection,
// the timeout, or the open circuit.
type backendError struct{ err error }

func (e backendError) Error() string { return e.err.Error() }
func (e backendError) Unwrap() error { return e.err }

func isBackendError(err error) bool {
	var be backendError
	return errors.As(err, &be)
}

// fallback answers q by the failure mode after err.
func (l *Limiter) fallback(ctx context.Context, q *query, err error) (Result, error) {
	switch l.mode {
	case FailClosed:
		return Result{Limit: q.limits[0], RetryAfter: time.Second, ResetAfter: time.Second}, err
	case FailLocal:
		lq := *q
		lq.limits = scale(q.limits, l.share)
		lq.now = 0
		r, _ := l.local.allow(ctx, &lq)
		return r, err
	}
	return Result{Allowed: true, Limit: q.limits[0], Remaining: max(q.limits[0].Count-q.n, 0)}, err
}

// scale returns limits with each Count multiplied by share, rounded down,
// at least 1. A product within 1e-6 of a whole number is that number, so
// that 0.29 of 100 is 29, not 28.999999999999996 rounded down.
func scale(limits []Limit, share float64) []Limit {
	out := make([]Limit, len(limits))
	for i, lim := range limits {
		x := float64(lim.Count) * share
		if r := math.Round(x); math.Abs(x-r) < 1e-6 {
			x = r
		}
		lim.Count = max(int64(x), 1)
		out[i] = lim
	}
	return out
}

// Wait blocks until one unit fits under every limit, and records it: the
// throttler. It returns nil when the caller may proceed.
func (l *Limiter) Wait(ctx context.Context, key string, limits ...Limit) error {
	return l.WaitN(ctx, key, 1, limits...)
}

// WaitN blocks until n units fit under every limit, and records them.
//
// When every limit is SlidingLog, one script call finds the earliest time
// the units fit, counting reservations already made by every replica,
// records them at that time and WaitN sleeps once: callers are served in
// order, with no polling. Other algorithms poll: sleep RetryAfter plus a
// little jitter, then try again.
//
// If the units cannot start before ctx's deadline, WaitN records nothing
// and returns ErrWaitExceedsDeadline at once; if they never fit (n above a
// Count) it returns ErrNeverFits. If ctx is cancelled while sleeping, the
// reservation is given back and ctx's error is returned.
//
// When Redis fails, the failure mode decides: FailOpen returns nil at once
// (the caller proceeds, the error goes to the observer), FailClosed returns
// the error, FailLocal waits on this process's share of the limits.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64, limits ...Limit) error {
	return l.waitN(ctx, "", key, n, limits)
}

// waitN is WaitN for the rule named rule (for observers).
func (l *Limiter) waitN(ctx context.Context, rule, key string, n int64, limits []Limit) error {
	if err := validate(key, n, limits); err != nil {
		return err
	}
	var start time.Time
	if l.observer != nil {
		start = time.Now()
	}
	q := &query{key: key, n: n, limits: limits, now: l.queryTime()}
	wait, err := l.waitOn(ctx, l.guardedBy(l.waitTime), q)
	failed := err != nil && isBackendError(err)
	final := err // what the caller gets: nil means proceed
	if failed {
		switch l.mode {
		case FailOpen:
			final = nil
		case FailLocal:
			wait, final = l.waitOn(ctx, l.local, &query{key: key, n: n, limits: scale(limits, l.share)})
		}
	}
	if l.observer != nil {
		ev := Event{Op: OpWait, Rule: rule, Key: key, Result: Result{Allowed: final == nil, Limit: limits[0], RetryAfter: wait}, Err: err, Failed: failed}
		if failed {
			ev.Fallback = l.mode
		}
		l.observe(ev, start)
	}
	return final
}

// waitOn runs the wait on s: one reservation for sliding logs, else polls.
func (l *Limiter) waitOn(ctx context.Context, s store, q *query) (time.Duration, error) {
	if allLog(q.limits) {
		return l.reserveAndSleep(ctx, s, q)
	}
	return l.poll(ctx, s, q)
}

func allLog(limits []Limit) bool {
	for _, lim := range limits {
		if lim.Algorithm != SlidingLog {
			return false
		}
	}
	return true
}

// longest is the wait ctx allows in µs, or -1 without a deadline.
func longest(ctx context.Context) int64 {
	d, ok := ctx.Deadline()
	if !ok {
		return -1
	}
	return max(time.Until(d).Microseconds(), 0)
}

func (l *Limiter) reserveAndSleep(ctx context.Context, s store, q *query) (time.Duration, error) {
	r, err := s.reserve(ctx, q, longest(ctx))
	if err != nil {
		return 0, err
	}
	wait := usec(r.wait)
	switch {
	case r.wait < 0:
		return -1, fmt.Errorf("%w: %d units", ErrNeverFits, q.n)
	case !r.ok:
		return wait, fmt.Errorf("%w: the units fit in %s", ErrWaitExceedsDeadline, wait)
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		// the reply took the slack: the slot would come after the deadline
		release(ctx, s, q, r)
		return wait, fmt.Errorf("%w: the units fit in %s", ErrWaitExceedsDeadline, wait)
	}
	if err := sleep(ctx, wait); err != nil {
		release(ctx, s, q, r)
		return wait, err
	}
	return wait, nil
}

// release gives a reservation back, best effort, though ctx may be done.
func release(ctx context.Context, s store, q *query, r reservation) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultWaitTimeout)
	_ = s.release(rctx, q, r)
	cancel()
}

func (l *Limiter) poll(ctx context.Context, s store, q *query) (time.Duration, error) {
	q.commit = true
	var waited time.Duration
	for {
		if q.now != 0 {
			q.now = l.micros()
		}
		r, err := s.allow(ctx, q)
		if err != nil {
			return waited, err
		}
		if r.Allowed {
			return waited, nil
		}
		if r.RetryAfter < 0 {
			return waited, fmt.Errorf("%w: %d units", ErrNeverFits, q.n)
		}
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(r.RetryAfter).After(dl) {
			return waited, fmt.Errorf("%w: the units fit in %s", ErrWaitExceedsDeadline, r.RetryAfter)
		}
		d := r.RetryAfter + rand.N(r.RetryAfter/10+time.Millisecond)
		if dl, ok := ctx.Deadline(); ok {
			// the jitter must not push the next try past the deadline
			d = max(min(d, time.Until(dl)-time.Millisecond), r.RetryAfter)
		}
		if err := sleep(ctx, d); err != nil {
			return waited, err
		}
		waited += d
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
