package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
)

// The health rule: the failure mode answers only on evidence that Redis
// cannot answer (the connection refused, reset or closed, a client error,
// or the node's health check's PING without a byte of reply for twice
// the timeout), never for a call that merely ran out of time, which asks the
// health check and then goes again.
//
// Why not the timeout alone: a process short of CPU (a flood, a busy
// machine, a spent CPU quota) cannot read replies that Redis already sent;
// its timers fire first, and a call out of time says nothing of Redis. The
// health check's PING goes on a connection of its own, and at its deadline
// it looks into the socket: a reply that waits there unread is a reply.

// guard wraps a Limiter's calls to its store: over Redis it keeps the health
// of each node (see the rule above); over memory it passes them on.
type guard struct {
	next   store.Store
	remote store.Remote // next, over Redis; nil: the memory store
	one    node         // a single server's
	nodes  sync.Map     // a Cluster's master or a Ring's shard → *node: a failing node stops its keys only
	mode   FailureMode
	budget time.Duration   // a decision's: the Limiter's timeout
	local  *memstore.Store // FailLocal's store; else nil
	// released drops the Limiter's cached denials of a key whose
	// reservation went back to Redis (its units are free); nil: none
	released func(key string)
	share    float64 // FailLocal's share of each Count
}

// outcome is what the outcome of a call says about Redis.
type outcome uint8

const (
	succeeded outcome = iota // Redis answered
	abandoned                // the caller's context ended first: nothing learnt of Redis
	rejected                 // Redis answered an error: this call's failure alone
	failed                   // evidence that Redis cannot answer: the failure mode answers
	// shed: out of time again and again while the health check found
	// Redis answering; denied for a second whatever the failure mode.
	shed
)

const (
	// callTries bounds the calls of one operation that run out of time
	// while the health check finds Redis answering: then it is shed. A
	// reservation goes once: one whose reply was lost may stand in Redis,
	// and another would hold a second slot for the window.
	callTries = 3
	// downFor is how long a node found down skips Redis before the next
	// health check, which runs in the background while the failure mode
	// answers.
	downFor = 250 * time.Millisecond
)

// node is the health of one Redis node.
type node struct {
	down  atomic.Pointer[outage] // nil: up
	mu    sync.Mutex
	check *healthCheck // the health check under way; nil: none
}

// outage is a node found down: why, and when to check it again.
type outage struct {
	err      error
	until    time.Time
	checking atomic.Bool
}

// healthCheck is a health check of a node: err, once done, is its evidence
// that the node cannot answer; nil when the node answered.
type healthCheck struct {
	done chan struct{}
	err  error
}

// node returns the health of the node serving key.
func (g *guard) node(key string) *node {
	name := g.remote.Node(key)
	if name == "" {
		return &g.one
	}
	n, ok := g.nodes.Load(name)
	if !ok {
		n, _ = g.nodes.LoadOrStore(name, new(node))
	}
	return n.(*node)
}

// fail notes evidence that n cannot answer.
func (n *node) fail(err error) { n.down.Store(&outage{err: err, until: time.Now().Add(downFor)}) }

// call runs f, a call about r.Key, by the health rule. A call out of time
// goes again, with a deadline as far as its first one, once the health
// check found Redis answering, tries times in all.
func (g *guard) call(ctx context.Context, r *store.Request, tries int, f func() error) (outcome, error) {
	if err := ctx.Err(); err != nil {
		return abandoned, err // nothing decided, not even by a down node's failure mode
	}
	if g.remote == nil {
		return succeeded, f() // the memory store returns no error
	}
	n, span := g.node(r.Key), g.span(r)
	for try := 1; ; try++ {
		if err := g.skip(n, r.Key); err != nil {
			return failed, err
		}
		if o, err, again := g.judge(ctx, n, r, span, f(), try, tries); !again {
			return o, err
		}
	}
}

// span is how far a call's deadline lies: r's, else the budget.
func (g *guard) span(r *store.Request) time.Duration {
	if r.Deadline.IsZero() {
		return g.budget
	}
	return max(time.Until(r.Deadline), time.Millisecond)
}

// skip returns ErrCircuitOpen, with the evidence, while n is down (and
// checks it again when due).
func (g *guard) skip(n *node, key string) error {
	o := n.down.Load()
	if o == nil {
		return nil
	}
	g.recheck(n, key, o)
	return fmt.Errorf("%w (%w)", ErrCircuitOpen, o.err)
}

// judge classifies err, the try-th call of tries about r on n, by the
// health rule; again: the call goes again, r's deadline moved span ahead.
func (g *guard) judge(ctx context.Context, n *node, r *store.Request, span time.Duration, err error, try, tries int) (o outcome, _ error, again bool) {
	switch {
	case err == nil:
		return succeeded, nil, false
	case callerGone(ctx):
		if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err) // the caller's deadline
		}
		return abandoned, err, false
	case store.Replied(err):
		return rejected, err, false
	case !store.IsTimeout(err):
		n.fail(err)
		return failed, err, false
	}
	if down := g.verify(ctx, n, r.Key); down != nil {
		return failed, fmt.Errorf("%w (%w)", err, down), false // down: the health check's finding
	}
	if err := ctx.Err(); err != nil {
		return abandoned, err, false
	}
	if try >= tries {
		return shed, err, false
	}
	if !r.Deadline.IsZero() {
		r.Deadline = time.Now().Add(span)
	}
	return 0, nil, true
}

// verify waits for n's health check (started if none is under way), and
// returns its evidence that n cannot answer; nil when n answered, or ctx
// ended first.
func (g *guard) verify(ctx context.Context, n *node, key string) error {
	n.mu.Lock()
	v := n.check
	if v == nil {
		v = &healthCheck{done: make(chan struct{})}
		n.check = v
		go g.health(n, key, v)
	}
	n.mu.Unlock()
	select {
	case <-v.done:
		return v.err
	case <-ctx.Done():
		return nil
	}
}

// silence is how long a health check's PING may go without a reply before
// the node is down: twice a decision's budget (200ms without one), as a
// healthy Redis on a loaded machine took up to 94ms to answer a PING.
func (g *guard) silence() time.Duration {
	if g.budget <= 0 {
		return 2 * DefaultTimeout
	}
	return 2 * g.budget
}

// ping runs a health check's PING about key's node; its dial may take up
// to a second, for a process short of CPU.
func (g *guard) ping(key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return g.remote.Ping(ctx, key, g.silence())
}

// evidence reports whether err, a health check's PING's, is evidence that
// its node cannot answer: no reply (ErrSilent, no timeout) or the
// connection's failure (refused, reset, closed). A reply, even an error,
// is not, nor is a timeout, which tells nothing (see store.Remote.Ping).
func evidence(err error) bool {
	return err != nil && !store.Replied(err) && !store.IsTimeout(err)
}

// health checks n by a PING, and puts it down on evidence.
func (g *guard) health(n *node, key string, v *healthCheck) {
	err := g.ping(key)
	if evidence(err) {
		v.err = err
		n.fail(err)
	}
	n.mu.Lock()
	n.check = nil
	n.mu.Unlock()
	close(v.done)
}

// recheck checks a down node in the background once its outage o is due:
// a PING without evidence brings it up (one that ran out of time too, as
// in health: a process short of CPU may not have run its dial); else it
// stays down for another downFor.
func (g *guard) recheck(n *node, key string, o *outage) {
	if time.Now().Before(o.until) || !o.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		if err := g.ping(key); !evidence(err) {
			n.down.CompareAndSwap(o, nil)
			return
		}
		n.down.CompareAndSwap(o, &outage{err: o.err, until: time.Now().Add(downFor)})
	}()
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

// allow decides *r without the failure mode (see fail): call's loop with
// the store's Allow in it, not in a closure (two frames fewer on every
// decision's way to Redis).
func (g *guard) allow(ctx context.Context, r *store.Request) (d store.Decision, o outcome, err error) {
	if err = ctx.Err(); err != nil {
		return d, abandoned, err
	}
	if g.remote == nil {
		d, err = g.next.Allow(ctx, *r)
		return d, succeeded, err
	}
	n, span := g.node(r.Key), g.span(r)
	for try := 1; ; try++ {
		if err = g.skip(n, r.Key); err != nil {
			return d, failed, err
		}
		d, err = g.next.Allow(ctx, *r)
		var again bool
		if o, err, again = g.judge(ctx, n, r, span, err, try, callTries); !again {
			return d, o, err
		}
	}
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

// shedding answers r as FailClosed does, whatever the mode (ErrShed).
func shedding(r store.Request, err error) (store.Decision, error) {
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
func failure(o outcome, err error) error {
	if o == succeeded || o == abandoned {
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
	type reply struct {
		res store.Reservation
		o   outcome
		err error
	}
	run := func(ctx context.Context) (o reply) {
		o.o, o.err = g.call(ctx, &r, 1, func() (err error) {
			o.res, err = g.next.Reserve(ctx, r, longest)
			return err
		})
		return o
	}
	var o reply
	if ctx.Done() == nil || g.remote == nil || ctx.Err() != nil { // ended: call sends nothing
		o = run(ctx)
	} else {
		done := make(chan reply, 1)
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
	switch o.o {
	case succeeded, abandoned:
		return reservation{Reservation: o.res}, o.err
	case shed: // no slot, whatever the failure mode (see poll)
		_, err := shedding(r, o.err)
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
	err := failure(g.call(ctx, &r, callTries, func() error { return g.next.Release(ctx, r, res.Reservation) }))
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
	return failure(g.call(ctx, &r, callTries, func() error { return f(g.next, r) }))
}

// refund gives back units where they were recorded (local: FailLocal's store,
// the only failure mode whose units a Decision charges); when Redis fails,
// FailLocal gives back its store's newest units. It returns Redis's failure.
func (g *guard) refund(ctx context.Context, r store.Request, local bool) error {
	if local {
		return g.local.Refund(ctx, g.localCopy(r))
	}
	o, err := g.call(ctx, &r, callTries, func() error { return g.next.Refund(ctx, r) })
	if o != succeeded && o != abandoned && g.local != nil {
		r.At = 0
		_ = g.local.Refund(ctx, g.localCopy(r))
	}
	return failure(o, err)
}

// backendError is a failure of Redis that the caller is told of.
type backendError struct{ err error }

func (e backendError) Error() string { return e.err.Error() }
func (e backendError) Unwrap() error { return e.err }
