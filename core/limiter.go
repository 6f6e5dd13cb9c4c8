package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/core/internal/redisstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
)

// Limiter decides whether requests pass. It is safe for concurrent use by
// many goroutines; create one per process and share it. When Redis fails,
// the failure mode answers (see WithTimeout and WithFailureMode).
type Limiter struct {
	guard    *guard        // breaker, health rule, failure mode; then the store
	waitTime time.Duration // bounds each call of Wait
	clock    func() time.Time
	cache    *denyCache
	observer Observer  // nil: none
	scratch  sync.Pool // of *scratch: one on the stack escapes via the Store interface
	denied   denied    // the denials of the rules that track them (operate.go)
	born     time.Time // New's time: elapsed's origin
	skew     skew      // Redis's clock against elapsed, for Wait's slots
	peekMu   sync.Mutex
	peeks    map[slotOf]*peek // blockedAt's peeks under way
}

// New returns a Limiter that keeps its counts in Redis. rdb may be a
// *redis.Client, *redis.ClusterClient, *redis.Ring or a failover client:
// every call is one script run on the keys of one hash slot. New adds no
// hook to rdb and does not contact Redis (see Check). A nil rdb, or a nil
// pointer in it, is an error.
func New(rdb redis.Scripter, opts ...Option) (*Limiter, error) {
	if v := reflect.ValueOf(rdb); rdb == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, errors.New("ratewindow: nil redis client")
	}
	c := configure(opts)
	if err := c.validate(); err != nil {
		return nil, err
	}
	l := newLimiter(c)
	rs := redisstore.New(rdb, c.prefix)
	l.guard = &guard{next: rs, remote: rs, mode: c.mode, share: c.share, budget: c.timeout, released: l.forget}
	if c.mode == FailLocal {
		l.guard.local = memstore.New(l.micros)
	}
	return l, nil
}

// NewMemory returns a Limiter that keeps its counts in this process's memory:
// limits hold per process, not across replicas. It applies WithClock and
// WithObserver and ignores every other option, invalid ones included.
func NewMemory(opts ...Option) *Limiter {
	c := configure(opts)
	c.mode, c.cacheSize = FailOpen, 0
	l := newLimiter(c)
	l.guard = &guard{next: memstore.New(l.micros)}
	return l
}

func newLimiter(c config) *Limiter {
	l := &Limiter{clock: c.clock, observer: c.observer, waitTime: c.waitTime, born: time.Now()}
	if c.cacheSize > 0 {
		l.cache = newDenyCache(c.cacheSize)
	}
	l.scratch.New = func() any { return new(scratch) }
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

// storeTime is the store's Now: the injected clock, or 0 (Redis's TIME).
func (l *Limiter) storeTime() int64 {
	if l.clock == nil {
		return 0
	}
	return l.micros()
}

// Check reports whether the Limiter can do its job: nil only when Redis is
// reachable, lets this client run the scripts on keys under its prefix (and,
// by its ACL, every command they run there), takes a write there (a key with
// a 1s TTL), loads the scripts, and will not evict the Limiter's keys
// (maxmemory 0 or noeviction). Call it at start-up and in readiness probes.
// It checks every master of a Cluster, every shard of a Ring; the memory
// Limiter always passes. A refused write matches ErrNoWrites, an evicting
// policy ErrEvictionPolicy, an unreadable one ErrCheckIncomplete; other
// errors wrap Redis's own (WRONGPASS, NOPERM). A nil ctx is an error.
func (l *Limiter) Check(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	return l.guard.next.Check(ctx)
}

// Allow reports whether one unit under every limit fits now, and records it
// under all of them when it does; a denial records nothing. The error is
// non-nil only when no decision was made (invalid arguments, a nil or ended ctx);
// when Redis fails, the failure mode decides and Result.BackendErr says why.
func (l *Limiter) Allow(ctx context.Context, key string, limits ...Limit) (Result, error) {
	return l.AllowN(ctx, key, 1, limits...)
}

// AllowN is Allow for n units at once, such as the cost of an expensive
// request. A cost above a limit's Count is denied with RetryAfter < 0.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64, limits ...Limit) (Result, error) {
	r, _, err := l.decide(ctx, OpAllow, "", key, n, limits, nil)
	return r, err
}

// Peek reports whether one unit would be allowed now, and what remains,
// without recording anything. Its errors are those of Allow.
func (l *Limiter) Peek(ctx context.Context, key string, limits ...Limit) (Result, error) {
	r, _, err := l.decide(ctx, OpPeek, "", key, 1, limits, nil)
	return r, err
}

// Reset forgets every unit recorded for key under limits, lifts the key's
// Block, and forgets this Limiter's cached denials of key (another
// replica's within a second). A Redis failure is returned.
func (l *Limiter) Reset(ctx context.Context, key string, limits ...Limit) error {
	if err := validate(ctx, key, 1, limits); err != nil {
		return err
	}
	defer l.forget(key) // once done: a denial decided meanwhile may be from before the reset
	reset := func(s store.Store, r store.Request) error { return s.Reset(ctx, r) }
	return l.guard.both(ctx, l.request(key, 1, limits, nil, l.guard.budget), reset)
}

// Refund gives back n units of key under every limit: units recorded
// within the last window, the newest first, never reservations in the
// future, never below empty. It undoes a charge, as Rule.CountIf does, and
// forgets this Limiter's cached denials of key (see Reset). A Redis
// failure is returned: no failure mode answers.
func (l *Limiter) Refund(ctx context.Context, key string, n int64, limits ...Limit) error {
	if err := validate(ctx, key, n, limits); err != nil {
		return err
	}
	return l.refundAt(ctx, key, n, limits, 0, false)
}

// refundAt gives back the n units of key recorded at at (µs; 0: the newest),
// by the local store when local.
func (l *Limiter) refundAt(ctx context.Context, key string, n int64, limits []Limit, at int64, local bool) error {
	defer l.forget(key) // once done (see Reset)
	r := l.request(key, n, limits, nil, l.guard.budget)
	r.At = at
	return l.guard.refund(ctx, r, local)
}

// forget drops this Limiter's cached denials of key.
func (l *Limiter) forget(key string) {
	if l.cache != nil {
		l.cache.forget(store.HeldKey(key), l.now().UnixNano())
	}
}

// MaxBlock is the longest Block: MaxWindow.
const MaxBlock = MaxWindow

// Block makes key exhausted under any limits for d, on every replica:
// until then Allow, AllowN and Peek deny it with RetryAfter of at least the
// time left, and Wait and WaitN wait it out (or return
// ErrWaitExceedsDeadline at once when it outlasts ctx's deadline); a
// sliding-log Wait that reserved a slot before the Block and wakes inside
// it gives the slot back and waits again, after the Block. A later
// Block never shortens an earlier one; Reset lifts it. It forgets this
// Limiter's cached denials of key (see Reset). d must be in [1µs,
// MaxBlock]; a Redis failure is returned (no failure mode answers).
func (l *Limiter) Block(ctx context.Context, key string, d time.Duration) error {
	switch {
	case ctx == nil:
		return errNilContext
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case d < time.Microsecond || d > MaxBlock:
		return fmt.Errorf("%w: block for %s; it must be in [1µs, %s]", ErrInvalidDuration, d, MaxBlock)
	}
	defer l.forget(key) // once done (see Reset): a cached denial would hide the block for up to a second
	block := func(s store.Store, r store.Request) error { return s.Block(ctx, r, d) }
	return l.guard.both(ctx, l.request(key, 1, nil, nil, l.guard.budget), block)
}

// decide makes a decision for the Rule named rule (pen: its Penalty) and
// returns the µs the store decided at (0: unknown). Its budget, retry and
// cached answers are WithTimeout's.
func (l *Limiter) decide(ctx context.Context, op Op, rule, key string, n int64, limits []Limit, pen *Penalty) (Result, int64, error) {
	if err := validate(ctx, key, n, limits); err != nil {
		return Result{}, 0, err
	}
	start, deadline := time.Now(), time.Time{} // start: the decision's one clock read but an injected clock's
	if l.guard.budget > 0 {
		deadline = start.Add(l.guard.budget)
	}
	commit, ck := op != OpPeek, key // ck: the deny cache's form of key
	var (
		r        Result
		cacheHit bool
		err      error
		cachedAt int64
		probing  *probe // this call asks about an expired denial: settle it
	)
	if l.cache != nil && commit {
		ck = store.HeldKey(key)
		cachedAt = start.UnixNano()
		if l.clock != nil {
			cachedAt = l.clock().UnixNano()
		}
		if r, cacheHit, probing, err = l.cached(ctx, ck, n, limits, pen, deadline, cachedAt); cacheHit || err != nil {
			l.observe(Event{Op: op, Rule: rule, Key: key, Result: r, Err: err, CacheHit: cacheHit}, start) // err: ctx's
			return r, 0, err
		}
	}
	buf := l.scratch.Get().(*scratch)
	req := l.request(key, n, limits, buf, 0)
	req.Commit, req.Deadline = commit, deadline
	if pen != nil {
		req.Penalty = store.Penalty(*pen)
	}
	d, o, err := l.guard.allow(ctx, &req)
	if (o == failed || o == shed) && l.cache != nil && commit {
		r, cacheHit = l.cache.last(ck, n, limits, l.now().UnixNano()) // the key's last denial answers
	}
	if !cacheHit {
		r, err = l.answer(ctx, req, limits, &d, o, err)
	} else {
		err = nil
	}
	l.scratch.Put(buf)
	// a denial that ended while decided is not kept: near a high limit (a
	// RetryAfter of µs) each later decision waited for a probe of it, then
	// asked again: two round trips, half the decisions a second of no cache
	if err == nil && l.cache != nil && commit && !r.Allowed && r.BackendErr == nil && !cacheHit &&
		cachedAt+int64(r.RetryAfter) > l.now().UnixNano() {
		l.cache.put(ck, n, limits, cachedAt, r)
	}
	if err == nil && !r.Allowed && o == succeeded && !cacheHit && rule != "" {
		l.recordDenied(rule, key) // a denial that reached the store (TopDenied)
	}
	if probing != nil {
		l.cache.settle(ck, n, limits, probing, l.now().UnixNano(), err == nil && !cacheHit && r.BackendErr == nil, r)
	}
	if l.observer != nil {
		l.observe(Event{Op: op, Rule: rule, Key: key, Result: r, Err: err, Banned: d.Banned, CacheHit: cacheHit, Shed: o == shed && !cacheHit,
			Retried: !deadline.IsZero() && req.Deadline.After(deadline)}, start) // the guard moved the deadline: it went again
	}
	return r, d.At, err
}

// cached answers a denial from the deny cache while it stands, and true.
// Once expired, one caller asks the store (its probe, returned: settle it
// after) while the others wait for its answer until deadline, then take the
// last denial. Under a penalty only a ban answers, and no probe is waited
// for (the store counts the denials). now is the Limiter's clock in ns at
// the start. The error is ctx's.
func (l *Limiter) cached(ctx context.Context, key string, n int64, limits []Limit, pen *Penalty, deadline time.Time, now int64) (Result, bool, *probe, error) {
	var bound <-chan time.Time
	for ; ; now = l.now().UnixNano() {
		r, ok, p, wait := l.cache.get(key, n, limits, now)
		switch {
		case ok && (pen == nil || r.blocked):
			return r, true, nil, nil
		case pen != nil && wait:
			return Result{}, false, nil, nil
		case p == nil || !wait:
			return Result{}, false, p, nil
		}
		if bound == nil && !deadline.IsZero() {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			bound = t.C
		}
		select { // another request of the key asks: its answer is ours
		case <-p.done:
		case <-ctx.Done():
			return Result{}, false, nil, ctx.Err()
		case <-bound:
			r, ok := l.cache.last(key, n, limits, l.now().UnixNano())
			return r, ok, nil, nil
		}
	}
}

// observe hands ev to the observer, if any, with its latency since start. A
// failure the failure mode answered (Result.BackendErr) is ev's Err, and
// Failed, with its Fallback, unless the decision was Shed.
func (l *Limiter) observe(ev Event, start time.Time) {
	if l.observer == nil {
		return
	}
	if err := ev.Result.BackendErr; err != nil {
		if ev.Err == nil || errors.Is(ev.Err, err) {
			ev.Err = err
		} else { // a Wait's own error, after the failure
			ev.Err = fmt.Errorf("%w (after %w)", ev.Err, err)
		}
		if !ev.Shed {
			ev.Failed, ev.Fallback = true, l.guard.mode
		}
	}
	ev.Latency = time.Since(start)
	l.observer(ev)
}

// started is a decision's start for its observer: zero, no clock read, without one.
func (l *Limiter) started() (t time.Time) {
	if l.observer != nil {
		t = time.Now()
	}
	return t
}

// scratch is the room of a decision's Request: limits and states.
type scratch struct {
	limits [MaxLimits]store.Limit
	states [MaxLimits]store.State
}

// request returns the store's Request for n units of key under limits,
// bounded by within (0: not), in sc's room (nil: a slice of its own).
func (l *Limiter) request(key string, n int64, limits []Limit, sc *scratch, within time.Duration) store.Request {
	r := store.Request{Key: key, N: n, Now: l.storeTime()}
	if within > 0 {
		r.Deadline = time.Now().Add(within)
	}
	if sc != nil {
		r.Limits, r.States = sc.limits[:len(limits)], sc.states[:]
	} else {
		r.Limits = make([]store.Limit, len(limits))
	}
	for i, lim := range limits {
		r.Limits[i] = lim.spec()
	}
	return r
}

// answer turns a decision's call (req on limits, outcome o) into its Result:
// the store's decision *d, or the failure mode's, put in *d. The error is ctx's.
func (l *Limiter) answer(ctx context.Context, req store.Request, limits []Limit, d *store.Decision, o outcome, err error) (Result, error) {
	switch o {
	case succeeded:
		return result(d, limits, nil), nil
	case abandoned:
		return Result{}, err
	case shed:
		*d, err = shedding(req, err)
		return result(d, limits, err), nil
	}
	*d, err = l.guard.fail(ctx, req, err)
	if l.guard.mode == FailLocal {
		var buf [MaxLimits]Limit
		limits = append(buf[:0], limits...)
		for i := range limits {
			limits[i].Count = req.Limits[i].Count
		}
	}
	return result(d, limits, err), nil
}

// result turns d, a decision on limits, into a Result with its binding
// limit (see binds), the first of those tied.
func result(d *store.Decision, limits []Limit, backendErr error) Result {
	b := 0
	for i := 1; i < len(limits); i++ {
		if binds(d.Allowed, d.States[i], d.States[b]) {
			b = i
		}
	}
	s, lim := d.States[b], limits[b]
	if s.Count > 0 { // the key's override's
		lim.Count = s.Count
	}
	r := Result{Allowed: d.Allowed, Limit: lim, Remaining: max(s.Remaining, 0), ResetAfter: usec(max(s.Reset, 0)), BackendErr: backendErr,
		blocked: d.Blocked}
	if !d.Allowed {
		r.RetryAfter = usec(s.Retry)
		if s.Retry < 0 {
			r.RetryAfter = -1
		}
		for i := range limits {
			if d.States[i].Retry != 0 || d.Blocked {
				r.violated |= 1 << i
			}
		}
	}
	return r
}

// binds reports whether s binds rather than cur: when denied, the longest
// retry (never is longest); else the fewest remaining, then latest reset.
func binds(allowed bool, s, cur store.State) bool {
	// as uint64, a Retry of -1 (never) is longer than any other
	if r, c := uint64(s.Retry), uint64(cur.Retry); !allowed && r != c {
		return r > c
	}
	if r, c := max(s.Remaining, 0), max(cur.Remaining, 0); r != c {
		return r < c
	}
	return max(s.Reset, 0) > max(cur.Reset, 0)
}

// Wait blocks until one unit fits under every limit, and records it: the
// throttler. It returns nil when the caller may proceed.
func (l *Limiter) Wait(ctx context.Context, key string, limits ...Limit) error {
	return l.WaitN(ctx, key, 1, limits...)
}

// Throttle calls fn(ctx) once Wait lets one unit of key through, and returns
// its result. When Wait gives up, fn is not called and Wait's error is
// returned. For several units, call WaitN, then fn.
func Throttle[T any](ctx context.Context, l *Limiter, key string, limits []Limit, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	switch {
	case l == nil:
		return zero, errors.New("ratewindow: Throttle: nil Limiter")
	case fn == nil:
		return zero, errors.New("ratewindow: Throttle: nil function")
	}
	if err := l.Wait(ctx, key, limits...); err != nil {
		return zero, err
	}
	return fn(ctx)
}

// WaitN blocks until n units fit under every limit, and records them. When
// every limit is SlidingLog, it reserves the earliest time they fit and
// sleeps until then: callers are served in order. A caller that cannot
// start within 1% of the shortest window (at least 1ms) after its slot, as
// in a process short of CPU (its reply read late, or its sleep overrun),
// gives the slot back and reserves again, far enough ahead to make it, so
// that late starts do not bunch with on-time ones (see docs/throttling.md).
// Other algorithms poll.
//
// If the units cannot start before ctx's deadline, WaitN records nothing
// and returns ErrWaitExceedsDeadline at once; if they never fit,
// ErrNeverFits. If ctx ends while waiting, the units are given back and
// ctx's error returned. When Redis fails, FailOpen returns nil at once,
// FailClosed the failure, FailLocal waits on this process's share; a call
// shed for overload (ErrShed) asks again a second later, whatever the mode.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64, limits ...Limit) error {
	return l.waitN(ctx, "", key, n, limits)
}

// waitN is WaitN for the rule named rule.
func (l *Limiter) waitN(ctx context.Context, rule, key string, n int64, limits []Limit) error {
	if err := validate(ctx, key, n, limits); err != nil {
		return err
	}
	start := l.started()
	wait := l.poll
	if !slices.ContainsFunc(limits, func(l Limit) bool { return l.Algorithm != SlidingLog }) {
		wait = l.reserveAndSleep
	}
	waited, failed, err := wait(ctx, key, n, limits) // failed: the failure the failure mode answered
	if l.observer != nil {
		l.observe(Event{Op: OpWait, Rule: rule, Key: key, Result: Result{Allowed: err == nil, Limit: limits[0], RetryAfter: waited, BackendErr: failed},
			Shed: errors.Is(failed, ErrShed), Err: err}, start)
	}
	return err
}

// reserveAndSleep makes one reservation and sleeps until its time, giving
// it back if ctx ends first, or moving it if it would start late or a Block
// covers it (see WaitN).
func (l *Limiter) reserveAndSleep(ctx context.Context, key string, n int64, limits []Limit) (time.Duration, error, error) {
	dl, hasDL := ctx.Deadline()
	tol := lateness(limits).Microseconds()
	var (
		slept time.Duration // after sheddings, and to slots missed or a Block then covered
		moved store.Request // the reservation to move (From): given back by the next one, in its call
	)
	for {
		r := l.request(key, n, limits, nil, l.waitTime)
		r.Lead, r.From = moved.Lead, moved.From
		longest := int64(-1) // the wait ctx allows in µs; -1: no bound
		if hasDL {
			longest = max(time.Until(dl).Microseconds(), 0)
		}
		sent := l.elapsed()
		res, err := l.guard.reserve(ctx, r, longest, l.waitTime)
		read := l.elapsed()
		wait := usec(res.Wait)
		again := false
		switch {
		case err != nil:
			return slept, res.failed, err
		case errors.Is(res.failed, ErrShed): // no slot: asked again a second later
			// A move shed may have been made: asked again, it could give
			// back another caller's unit of the same time; the slot to
			// move is left to expire instead.
			moved = store.Request{}
			wait = time.Second
			_, err = sleep(ctx, wait, wait)
			again = err == nil
		case res.Wait < 0:
			return -1, res.failed, fmt.Errorf("%w: %d units", ErrNeverFits, n)
		case !res.OK:
			return slept + wait, res.failed, exceedsDeadline(wait)
		default: // ErrWaitExceedsDeadline if the reply took the slack; again if late, or if a Block covers the slot
			moved = store.Request{}
			// The slot on this process's clock: Redis's time less the
			// skew between the clocks, and never before the call was
			// sent plus the wait; a reply read late leaves less to sleep.
			slot := read + res.Wait
			redis := res.failed == nil && !res.local
			if redis {
				slot = max(res.At-l.skew.note(res.At-res.Wait, read), sent+res.Wait)
			}
			wait = usec(max(slot-read, 0))
			// The peek for a Block made while it slept goes one round
			// trip (this call's) before the slot, so that a caller on
			// time starts on time: a peek after the wake would make
			// every start late by a round trip, which a loaded machine
			// makes long (and never more than 5% of the shortest window
			// before it: a reply read late makes it look long). A Block
			// it sees may end before the slot: the slot is then peeked
			// at again, at its time.
			early := max(min(read-sent, slot-read, shortest(limits).Microseconds()/20), 0)
			if res.Wait == 0 {
				early = 0
			}
			_, err = sleep(ctx, wait-usec(early), wait-usec(early))
			woke := l.elapsed()
			blocked := err == nil && res.Wait > 0 && l.blockedAt(ctx, key, n, limits, res.At, true)
			if now := l.elapsed(); err == nil { // the rest of early the peek left (an injected clock may not move)
				rest := usec(max(min(early-(now-woke), slot-now), 0))
				_, err = sleep(ctx, rest, rest)
			}
			if blocked && err == nil {
				blocked = l.blockedAt(ctx, key, n, limits, res.At, false)
			}
			missed := l.elapsed() - slot // when it would start
			switch {
			case err != nil:
			case redis && missed > tol: // moved twice as far ahead as it was late
				again, moved = true, store.Request{From: res.At, Lead: min(2*missed, shortest(limits).Microseconds())}
			case redis && blocked:
				again, moved = true, store.Request{From: res.At}
			default:
				again = blocked
			}
		}
		if err != nil || again && moved.From == 0 {
			_ = l.guard.release(ctx, r, res, l.waitTime)
		}
		if again {
			slept += wait
			continue
		}
		return slept + wait, res.failed, err
	}
}

// lateness is how long after its slot a waiter may still go: 1% of the
// shortest window, at least 1ms (within nethttp.Transport's default
// Margin, which leaves the rest to the trip). A
// waiter that would start later (this process was short of CPU) gives its
// slot back and takes another: going then would put more than Count
// arrivals in a window at the upstream, though Redis's log holds the limit.
func lateness(limits []Limit) time.Duration {
	return max(shortest(limits)/100, time.Millisecond)
}

// shortest is the shortest Window of limits.
func shortest(limits []Limit) time.Duration {
	w := limits[0].Window
	for _, l := range limits[1:] {
		w = min(w, l.Window)
	}
	return w
}

// elapsed is the Limiter's clock in µs for measuring waits: the monotonic
// time since New, or the injected clock's time.
func (l *Limiter) elapsed() int64 {
	if l.clock != nil {
		return l.micros()
	}
	return time.Since(l.born).Microseconds()
}

// skew estimates Redis's clock against elapsed's, for Wait's slots: the
// most that Redis's time at a reservation exceeded elapsed when its reply
// was read, over the last 5 to 10 seconds. A reply read late (the process
// short of CPU) shows less, so the most is the truest, and a slot placed
// by it is never earlier than the real one; a clock that drifts or steps
// is followed within 10 seconds (and a slot is never placed before its
// call was sent plus its wait).
type skew struct {
	mu        sync.Mutex
	cur, prev int64 // the most in this period and in the one before
	period    int64 // this period's number: elapsed / skewPeriod; 0: none yet
}

// skewPeriod is how long one period of the estimate lasts.
const skewPeriod = 5 * time.Second

// note takes a reservation's Redis time and elapsed when its reply was
// read (µs) and returns the estimate.
func (s *skew) note(redis, read int64) int64 {
	d, p := redis-read, read/skewPeriod.Microseconds()+1
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case p == s.period:
		s.cur = max(s.cur, d)
	case p == s.period+1:
		s.prev, s.cur, s.period = s.cur, d, p
	default: // the first, or none for a whole period
		s.prev, s.cur, s.period = d, d, p
	}
	return max(s.cur, s.prev)
}

// blockedAt reports whether key is blocked now, by a peek, and now is at or
// past at (µs, the store's clock: a Block covers the slot at at), or,
// early, whether it is blocked now at all; false when the store cannot
// tell. The waiters of one slot (a group a window apart from the last)
// wake together: they share one peek, so that their starts do not wait in
// line for as many round trips.
func (l *Limiter) blockedAt(ctx context.Context, key string, n int64, limits []Limit, at int64, early bool) bool {
	k := slotOf{key, at, early}
	l.peekMu.Lock()
	if f := l.peeks[k]; f != nil {
		l.peekMu.Unlock()
		select {
		case <-f.done:
			return f.blocked
		case <-ctx.Done():
			return false
		}
	}
	f := &peek{done: make(chan struct{})}
	if l.peeks == nil {
		l.peeks = map[slotOf]*peek{}
	}
	l.peeks[k] = f
	l.peekMu.Unlock()
	r := l.request(key, n, limits, nil, l.waitTime)
	// The others wait on this peek: it is not cut short when this caller's
	// ctx ends (they would read "cannot tell" and go under a Block); the
	// wait's budget (WithWaitTimeout) bounds it.
	d, o, err := l.guard.allow(context.WithoutCancel(ctx), &r)
	f.blocked = err == nil && o == succeeded && d.Blocked && (early || d.At >= at)
	l.peekMu.Lock()
	delete(l.peeks, k)
	l.peekMu.Unlock()
	close(f.done)
	return f.blocked
}

// slotOf names a slot of a key, its time in µs on the store's clock, and
// which of its peeks (before it, or at it).
type slotOf struct {
	key   string
	at    int64
	early bool
}

// peek is blockedAt's peek of a slot, shared by its waiters.
type peek struct {
	done    chan struct{} // closed when blocked is set
	blocked bool
}

// poll asks until n units of key fit, sleeping RetryAfter and some jitter.
func (l *Limiter) poll(ctx context.Context, key string, n int64, limits []Limit) (time.Duration, error, error) {
	var waited time.Duration
	var failed error
	var buf scratch
	for {
		req := l.request(key, n, limits, &buf, l.waitTime) // FailLocal scales its limits
		req.Commit = true
		dec, o, err := l.guard.allow(ctx, &req)
		r, err := l.answer(ctx, req, limits, &dec, o, err)
		if err != nil {
			return waited, failed, err
		}
		if r.BackendErr != nil {
			failed = r.BackendErr
			if l.guard.mode == FailClosed && !errors.Is(failed, ErrShed) { // shed: ask again after its RetryAfter
				return waited, failed, failed
			}
		}
		if r.Allowed {
			return waited, failed, nil
		}
		if r.RetryAfter < 0 {
			return waited, failed, fmt.Errorf("%w: %d units", ErrNeverFits, n)
		}
		d, err := sleep(ctx, r.RetryAfter+rand.N(r.RetryAfter/10+time.Millisecond), r.RetryAfter)
		if err != nil {
			return waited, failed, err
		}
		waited += d
	}
}

// exceedsDeadline is Wait's error for units that fit in wait, after ctx's deadline.
func exceedsDeadline(wait time.Duration) error {
	return fmt.Errorf("%w: the units fit in %s", ErrWaitExceedsDeadline, wait)
}

// sleep sleeps d, or until ctx ends (its error), and returns the time slept:
// d cut to end 1ms before ctx's deadline (a jitter must not pass it), not
// below least; ErrWaitExceedsDeadline at once if least outlasts it.
func sleep(ctx context.Context, d, least time.Duration) (time.Duration, error) {
	if dl, ok := ctx.Deadline(); ok {
		if time.Until(dl) < least {
			return 0, exceedsDeadline(least)
		}
		d = max(min(d, time.Until(dl)-time.Millisecond), least)
	}
	if d <= 0 {
		return 0, ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return d, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
