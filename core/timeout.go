package core

import (
	"context"
	"sync"
	"time"
)

// timeoutCtx is the context of one call to Redis within the Limiter's
// timeout (see within): its caller's context, ended at limit too, as
// context.WithTimeoutCause's would be (see cause for errTimeout).
//
// context.WithTimeoutCause costs five allocations and a timer a call
// (the context, the timer and its function, the cancel function, and the
// Done channel that go-redis's pool asks for). A timeoutCtx is one
// allocation and no timer until something asks for its Done channel: a
// decision queued in the batcher waits on a timer kept in its pooled call
// instead (see batcher.await), and a flusher asks only Err. A call run by
// go-redis on its caller's goroutine (direct) or a sender's asks for Done:
// a channel closed by a timer, or, when the caller's context can end
// (it has a Done channel), the standard context made then.
type timeoutCtx struct {
	context.Context // the caller's; its deadline, if any, is after limit
	limit           time.Time

	mu sync.Mutex
	// Done's channel, nil until asked for: of a caller's context that can
	// end, inner's (the standard context, with its cancel); else own,
	// closed by timer at limit (err DeadlineExceeded) or by release (err
	// Canceled).
	inner  context.Context
	cancel context.CancelFunc
	own    chan struct{}
	err    error
	timer  *time.Timer
}

// withTimeout returns ctx ended after d as well, and the timeoutCtx to
// release when the call is over; or ctx itself and nil when ctx's own
// deadline comes first (as context.WithTimeoutCause, whose cause is then
// ctx's own).
func withTimeout(ctx context.Context, d time.Duration) (context.Context, *timeoutCtx) {
	limit := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && !dl.After(limit) {
		return ctx, nil
	}
	t := &timeoutCtx{Context: ctx, limit: limit}
	return t, t
}

// Deadline returns the Limiter's timeout, which comes before the caller's
// deadline, if any.
func (t *timeoutCtx) Deadline() (time.Time, bool) { return t.limit, true }

// Done returns a channel closed when the caller's context ends or the
// timeout passes, made at the first call.
func (t *timeoutCtx) Done() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.inner != nil:
		return t.inner.Done()
	case t.own != nil:
		return t.own
	case t.Context.Done() != nil:
		t.inner, t.cancel = context.WithDeadlineCause(t.Context, t.limit, errTimeout)
		return t.inner.Done()
	}
	t.own = make(chan struct{})
	if d := time.Until(t.limit); d > 0 {
		t.timer = time.AfterFunc(d, t.expire)
	} else {
		t.end(context.DeadlineExceeded)
	}
	return t.own
}

// expire ends t at its limit (Done's timer).
func (t *timeoutCtx) expire() {
	t.mu.Lock()
	t.end(context.DeadlineExceeded)
	t.mu.Unlock()
}

// end closes Done's own channel with err, unless it is closed already;
// t.mu is held.
func (t *timeoutCtx) end(err error) {
	if t.err == nil {
		t.err = err
		close(t.own)
	}
}

// Err returns the caller's context's error, or context.DeadlineExceeded
// once the timeout has passed. Once Done has made its channel, it is the
// error that closed it (nil while it is open), which agrees with Done.
func (t *timeoutCtx) Err() error {
	t.mu.Lock()
	inner, own, err := t.inner, t.own, t.err
	t.mu.Unlock()
	switch {
	case inner != nil:
		return inner.Err()
	case own != nil:
		return err
	}
	if err := t.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(t.limit) {
		return context.DeadlineExceeded
	}
	return nil
}

// Value returns the caller's context's value (or the standard context's,
// once made: context.Cause then finds its cause).
func (t *timeoutCtx) Value(key any) any {
	t.mu.Lock()
	inner := t.inner
	t.mu.Unlock()
	if inner != nil {
		return inner.Value(key)
	}
	return t.Context.Value(key)
}

// String describes the context, as the standard ones do.
func (t *timeoutCtx) String() string {
	return "ratewindow.timeout(" + t.limit.String() + ")"
}

// release ends the context when the call is over, as a CancelFunc does:
// Done's channel, if made, is closed (context.Canceled), and its timer
// stopped. A nil t does nothing.
func (t *timeoutCtx) release() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.cancel != nil:
		t.cancel()
	case t.own != nil:
		if t.timer != nil {
			t.timer.Stop()
		}
		t.end(context.Canceled)
	}
}

// timedOut reports whether the Limiter's timeout has passed while the
// caller's context is still alive.
func (t *timeoutCtx) timedOut() bool {
	return t.Context.Err() == nil && !time.Now().Before(t.limit)
}

// cause returns why ctx ended: errTimeout when the Limiter's timeout ended
// it (a timeoutCtx, or a context made with errTimeout as its cause), else
// context.Cause's answer; nil while it has not ended.
func cause(ctx context.Context) error {
	if t, ok := ctx.(*timeoutCtx); ok {
		if t.timedOut() {
			return errTimeout
		}
		return context.Cause(t.Context)
	}
	return context.Cause(ctx)
}

// timedOut reports whether the Limiter's timeout ended ctx (see cause).
func timedOut(ctx context.Context) bool { return cause(ctx) == errTimeout }
