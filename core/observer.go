package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Op names the call that made a decision.
type Op uint8

const (
	OpAllow   Op = iota // Allow, AllowN and every rule's middleware (HTTP, gRPC, Connect)
	OpPeek              // Peek
	OpWait              // Wait and WaitN (one event per call)
	OpRefused           // an upstream refused a request (Enforcer.Refused): its key blocked for Result.RetryAfter
)

// String returns "allow", "peek", "wait" or "refused"; for a value that
// names none of them, "Op(n)".
func (o Op) String() string { return enumName(o, ops[:], "Op") }

var ops = [...]string{"allow", "peek", "wait", "refused"}

// Event describes one decision, for an Observer.
type Event struct {
	Op   Op     // what was decided: Allow (AllowN and the middleware's), Peek, Wait, or a refusal
	Rule string // the rule's Name for a rule's decisions and refusals (every adapter and throttler), else empty
	Key  string // the caller's key: high cardinality, never a metric label
	// Result is the answer given; its Limit is the binding limit. For
	// OpWait, Allowed means proceed and RetryAfter is the time waited.
	Result   Result
	Latency  time.Duration // the time the decision took (for OpWait, the wait included)
	CacheHit bool          // the deny cache answered without a round trip
	Retried  bool          // for OpRefused: the request goes again after the block
	// Banned reports that this denial reached the Rule's Penalty: the key
	// is banned from now on, on every replica, for Result.RetryAfter.
	Banned bool
	// Failed reports that Redis failed and the failure mode Fallback
	// answered; Err says why. A caller's context ending is no failure.
	Failed bool
	// Shed reports that the decision was shed for overload (see
	// WithTimeout): Err and Result.BackendErr match ErrShed; Failed is false.
	Shed     bool
	Fallback FailureMode // the failure mode that answered, when Failed
	// Err is the backend's error when Failed or Shed, else the error
	// returned to the caller, if any (for OpWait, ErrWaitExceedsDeadline or
	// ErrNeverFits too, wrapping the backend's error when a Wait ended
	// after a failure: errors.Is finds both).
	Err error
}

// Observer receives an Event for every decision, on the caller's goroutine
// before it is returned. It must be safe for concurrent use and fast.
// Without one, a Limiter builds no Event and reads no clock for it.
type Observer func(Event)

// Refused reports that an upstream refused a request of key: it blocks key
// for d on every replica (Limiter.Block) and tells the observer (an
// OpRefused Event; retried: the request goes again). Block's errors are
// returned; but when retried, a Block that failed (Redis down) is waited
// out here, on this replica alone (but under FailClosed, whose retry would
// fail), so that the retry still goes after d: then the error is nil once
// d has passed, else ctx's, or ErrWaitExceedsDeadline when d outlasts
// ctx's deadline (the retry should not go). nethttp.Transport uses it.
func (e *Enforcer) Refused(ctx context.Context, key string, d time.Duration, retried bool) error {
	return e.d.Refused(ctx, key, d, retried)
}

// Refused is Enforcer.Refused for any transport.
func (d *Decider[R]) Refused(ctx context.Context, key string, dur time.Duration, retried bool) error {
	start := d.l.started()
	err := d.l.Block(ctx, key, dur)
	d.l.observe(Event{Op: OpRefused, Rule: d.p.Name, Key: key, Retried: retried, Err: err,
		Result: Result{Limit: d.p.Limits[0], RetryAfter: dur}}, start)
	if !retried || d.l.guard.mode == FailClosed || !errors.As(err, new(backendError)) {
		return err // FailClosed's retry would fail: no wait for it; nor for bad input, an ended ctx
	}
	// the upstream's time is waited out here: a retry sent at once (3 in
	// a millisecond) would ignore it
	if _, serr := sleep(ctx, dur, dur); serr != nil {
		return fmt.Errorf("%w (after %w)", serr, err)
	}
	return nil
}
