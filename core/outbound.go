package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Outbound configures Decider.Throttle, the loop of an outbound throttler
// (nethttp.Transport, grpcmw's client interceptors). Zero fields mean the
// defaults.
type Outbound struct {
	// MaxRetries is how many times a refused request is sent again. Zero
	// means DefaultMaxRetries; a negative value turns retrying off.
	MaxRetries int
	// MaxBlock caps the time an upstream's refusal blocks the key. Zero
	// means DefaultMaxBlock.
	MaxBlock time.Duration
	// DefaultBlock is how long a refusal that names no time (or less than
	// 1µs) blocks the key. Zero means DefaultRefusalBlock.
	DefaultBlock time.Duration
}

// Defaults of Outbound's fields.
const (
	DefaultMaxRetries   = 3
	DefaultMaxBlock     = time.Minute
	DefaultRefusalBlock = time.Second
)

// Upstream is what an upstream's answer to an outbound request says.
type Upstream struct {
	// Refused: the upstream refused the request (HTTP 429, gRPC
	// RESOURCE_EXHAUSTED, ...): the key is blocked, and the request may go
	// again.
	Refused bool
	// Spent: the upstream served the request but says its quota is spent:
	// the key is blocked, and the answer goes to the caller.
	Spent bool
	// Delay is the time the upstream asked for; below 1µs: DefaultBlock.
	Delay time.Duration
	// Final: the request cannot be sent again (its body cannot be replayed,
	// or the upstream asked not to retry).
	Final bool
}

// Block returns how long a refusal that asked for asked blocks the key:
// DefaultBlock for less than 1µs (none, or Retry-After: 0), at most
// MaxBlock.
func (o Outbound) Block(asked time.Duration) time.Duration {
	maxBlock, d := o.MaxBlock, o.DefaultBlock
	if maxBlock <= 0 {
		maxBlock = DefaultMaxBlock
	}
	if d <= 0 {
		d = DefaultRefusalBlock
	}
	if asked >= time.Microsecond {
		d = asked
	}
	return min(d, maxBlock, MaxBlock)
}

// Throttle sends an outbound request of key and cost n: it waits for its
// slot (Limiter.WaitN), sends it (send, told the attempt, from 0, and the time it
// waited), and while the upstream refuses it, blocks key on every replica
// for the time asked (Refused; DefaultBlock when none, at most MaxBlock)
// and sends it again, up to MaxRetries times, each attempt waiting for its
// slot like any other. It returns nil when the last answer send got goes
// to the caller (a refusal too, when the next slot lies past ctx's
// deadline), else the error that stopped the request before an answer:
// the Wait's (ctx's, ErrWaitExceedsDeadline, ErrNeverFits, a failure
// mode's) or send's.
func (d *Decider[R]) Throttle(ctx context.Context, key string, n int64, o Outbound, send func(attempt int, waited time.Duration) (Upstream, error)) error {
	retries := o.MaxRetries
	if retries == 0 {
		retries = DefaultMaxRetries
	}
	for attempt := 0; ; attempt++ {
		start := time.Now()
		if err := d.wait(ctx, key, n); err != nil {
			if attempt > 0 && errors.Is(err, ErrWaitExceedsDeadline) {
				return nil // the upstream's refusal goes to the caller
			}
			return err
		}
		up, err := send(attempt, time.Since(start))
		if err != nil || !up.Refused && !up.Spent {
			return err
		}
		delay := o.Block(up.Delay)
		retry := up.Refused && !up.Final && attempt < retries && retries > 0
		// the refusal is the fleet's: blocking is best effort; when it
		// fails, Refused waits the delay out itself before a retry, and an
		// error says the retry cannot go (ctx ended, or the delay outlasts it)
		if err := d.Refused(ctx, key, delay, retry); !retry || err != nil {
			return nil
		}
	}
}

// Refused reports that an upstream refused a request of key: it blocks key
// for d on every replica (Limiter.Block) and tells the observer (an
// OpRefused Event; retried: the request goes again). Block's errors are
// returned; but when retried, a Block that failed (Redis down) is waited
// out here, on this replica alone (but under FailClosed, whose retry would
// fail), so that the retry still goes after d: then the error is nil once
// d has passed, else ctx's, or ErrWaitExceedsDeadline when d outlasts
// ctx's deadline (the retry should not go). Throttle uses it.
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
