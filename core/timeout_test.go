package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// waitClosed fails t unless done closes within a generous bound.
func waitClosed(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done was not closed")
	}
}

// isClosed reports whether done is closed now.
func isClosed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

type ctxKey struct{}

func TestTimeoutCtx(t *testing.T) {
	background := func(*testing.T) context.Context { return context.Background() }
	cancelled := func(*testing.T) context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errTestCause)
		return ctx
	}
	tests := []struct {
		name   string
		parent func(*testing.T) context.Context
		asks   bool          // ask for Done before the timeout
		wait   time.Duration // then wait this long (the timeout is 20ms)
		err    error         // Err then
		cause  error         // cause then
		closed bool          // Done closed then (asked after the wait when !asks)
	}{
		{"background, before", background, false, 0, nil, nil, false},
		{"background, after", background, false, 50 * time.Millisecond, context.DeadlineExceeded, errTimeout, true},
		{"background, Done, after", background, true, 50 * time.Millisecond, context.DeadlineExceeded, errTimeout, true},
		{"background, Done, before", background, true, 0, nil, nil, false},
		{"detached caller, Done, after", func(t *testing.T) context.Context { return context.WithoutCancel(cancelled(t)) }, true, 50 * time.Millisecond, context.DeadlineExceeded, errTimeout, true},
		{"cancelled caller", cancelled, false, 0, context.Canceled, errTestCause, true},
		{"cancelled caller, Done", cancelled, true, 0, context.Canceled, errTestCause, true},
		{"cancelled caller, after", cancelled, false, 50 * time.Millisecond, context.Canceled, errTestCause, true},
		{"live caller, Done, after", liveCaller, true, 50 * time.Millisecond, context.DeadlineExceeded, errTimeout, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := context.WithValue(tt.parent(t), ctxKey{}, "v")
			ctx, tc := withTimeout(parent, 20*time.Millisecond)
			if tc == nil {
				t.Fatal("withTimeout returned the caller's context; want a timeoutCtx")
			}
			defer tc.release()
			if dl, ok := ctx.Deadline(); !ok || !dl.Equal(tc.limit) {
				t.Fatalf("Deadline() = %v, %v; want %v, true", dl, ok, tc.limit)
			}
			var done <-chan struct{}
			if tt.asks {
				done = ctx.Done()
			}
			if tt.wait > 0 {
				time.Sleep(tt.wait)
				if done != nil {
					waitClosed(t, done) // its timer may lag on a loaded machine
				}
			}
			if done == nil && tt.closed {
				done = ctx.Done()
			}
			if err := ctx.Err(); !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Errorf("Err() = %v; want %v", err, tt.err)
			}
			if c := cause(ctx); c != tt.cause {
				t.Errorf("cause() = %v; want %v", c, tt.cause)
			}
			if got := timedOut(ctx); got != (tt.cause == errTimeout) {
				t.Errorf("timedOut() = %v; want %v", got, tt.cause == errTimeout)
			}
			if done != nil && isClosed(done) != tt.closed {
				t.Errorf("Done closed: %v; want %v", isClosed(done), tt.closed)
			}
			if v := ctx.Value(ctxKey{}); v != "v" {
				t.Errorf("Value(ctxKey) = %v; want the caller's v", v)
			}
		})
	}
}

var errTestCause = errors.New("the caller's own cause")

// liveCaller returns a context that can end (it has a Done channel) but
// does not before t's end.
func liveCaller(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func TestTimeoutCtxCallerDeadline(t *testing.T) {
	sooner, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx, tc := withTimeout(sooner, time.Hour)
	if ctx != sooner || tc != nil {
		t.Fatalf("withTimeout(ctx due in a minute, an hour) = %v, %v; want the caller's context and nil", ctx, tc)
	}
	tc.release() // nil: nothing

	later, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	ctx, tc = withTimeout(later, time.Minute)
	if tc == nil {
		t.Fatal("withTimeout(ctx due in an hour, a minute) returned the caller's context; want a timeoutCtx")
	}
	defer tc.release()
	if dl, _ := ctx.Deadline(); !dl.Equal(tc.limit) || dl.After(time.Now().Add(time.Minute)) {
		t.Fatalf("Deadline() = %v; want the Limiter's, %v", dl, tc.limit)
	}
	cancel2() // the caller leaves
	waitClosed(t, ctx.Done())
	if err := ctx.Err(); err != context.Canceled {
		t.Errorf("Err() = %v after the caller left; want context.Canceled", err)
	}
	if timedOut(ctx) {
		t.Error("timedOut() after the caller left; want false")
	}
}

func TestTimeoutCtxRelease(t *testing.T) {
	for _, parent := range []context.Context{context.Background(), context.WithValue(context.Background(), ctxKey{}, 1)} {
		ctx, tc := withTimeout(parent, time.Hour)
		done := ctx.Done()
		tc.release()
		if !isClosed(done) {
			t.Fatal("Done is open after release; want it closed, as a CancelFunc closes it")
		}
		if err := ctx.Err(); err != context.Canceled {
			t.Errorf("Err() = %v after release; want context.Canceled", err)
		}
		if timedOut(ctx) {
			t.Error("timedOut() after release before the timeout; want false")
		}
		tc.release() // twice: nothing
	}
	// released without a Done channel: nothing to close, nothing left
	ctx, tc := withTimeout(context.Background(), time.Hour)
	tc.release()
	if err := ctx.Err(); err != nil {
		t.Errorf("Err() = %v after release without Done; want nil (its timeout has not passed)", err)
	}
}

// TestTimeoutCtxConcurrent asks Done, Err, Value and the cause from many
// goroutines while the timeout passes (for -race).
func TestTimeoutCtxConcurrent(t *testing.T) {
	for _, parent := range []context.Context{context.Background(), liveCaller(t)} {
		ctx, tc := withTimeout(parent, 5*time.Millisecond)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 100 {
					switch i % 4 {
					case 0:
						ctx.Done()
					case 1:
						_ = ctx.Err()
					case 2:
						ctx.Value(ctxKey{})
					default:
						cause(ctx)
					}
				}
			}()
		}
		wg.Wait()
		waitClosed(t, ctx.Done())
		if err := ctx.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err() = %v after the timeout; want context.DeadlineExceeded", err)
		}
		tc.release()
		if err := ctx.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err() = %v after the timeout and release; want context.DeadlineExceeded still", err)
		}
	}
}

// TestTimeoutCtxAllocs checks the point of timeoutCtx: one allocation for
// a call that never asks for Done (a queued decision), against five for
// context.WithTimeoutCause with its Done channel, and three more for one
// that does, of a caller's context that never ends.
func TestTimeoutCtxAllocs(t *testing.T) {
	tests := []struct {
		name string
		done bool
		want float64
	}{
		{"Err only", false, 1},
		{"Done", true, 4},
	}
	for _, tt := range tests {
		got := testing.AllocsPerRun(200, func() {
			ctx, tc := withTimeout(context.Background(), time.Hour)
			if tt.done {
				ctx.Done()
			}
			_ = ctx.Err()
			_ = timedOut(ctx)
			tc.release()
		})
		if got != tt.want {
			t.Errorf("%s: %v allocations; want %v", tt.name, got, tt.want)
		}
	}
}

// TestAwaitTimer checks the timer a queued call keeps for the Limiter's
// timeout (see batcher.await): reused from call to call, it never ends a
// later call with a value left from an earlier one, and a call still ends
// at its caller's end and at the timeout.
func TestAwaitTimer(t *testing.T) {
	b := &batcher{}
	c := &call{done: make(chan struct{}, 1)}
	var timer *time.Timer
	for i := range 30 {
		// answered at once; the timer, armed for 1ms, would fire during
		// the sleep below were it left running
		ctx, tc := withTimeout(context.Background(), time.Millisecond)
		c.reply = i
		c.done <- struct{}{}
		reply, err := b.await(ctx, c)
		tc.release()
		if err != nil || reply != i {
			t.Fatalf("call %d: await = %v, %v; want %d, nil", i, reply, err, i)
		}
		if timer == nil {
			timer = c.timer
		} else if c.timer != timer {
			t.Fatalf("call %d: a new timer; want the call's timer reused", i)
		}
		time.Sleep(2 * time.Millisecond)
	}

	// the caller leaves, its timeout an hour away: its own error, at once
	parent, cancel := context.WithCancel(context.Background())
	ctx, tc := withTimeout(parent, time.Hour)
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err := b.await(ctx, c)
	tc.release()
	if !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("await after the caller left = %v; want context.Canceled", err)
	}

	// no reply: the Limiter's timeout ends the wait
	c = &call{done: make(chan struct{}, 1), timer: timer}
	ctx, tc = withTimeout(context.Background(), 20*time.Millisecond)
	_, err = b.await(ctx, c)
	tc.release()
	if !errors.Is(err, context.DeadlineExceeded) || !timedOut(ctx) {
		t.Fatalf("await without a reply = %v (timed out: %v); want context.DeadlineExceeded at the timeout", err, timedOut(ctx))
	}
}
