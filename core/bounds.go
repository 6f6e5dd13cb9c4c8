package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// bounds is the layer of the chain that keeps calls to Redis within a
// timeout and behind the circuit breaker, and marks Redis's failures as
// backendError for the failure mode above it. Decisions and waits have a
// bounds each (their timeouts differ) sharing one breaker.
type bounds struct {
	next    store // the Redis scripts
	timeout time.Duration
	breaker *breaker
	dials   *dialErrors // explains the open circuit; may be nil
}

// within runs f behind b's breaker, with a context bounded by b's timeout
// and the caller's ctx. A failure of Redis comes back as a backendError; the
// caller's ctx ending first comes back as it is.
func within[T any](b *bounds, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	var zero T
	sent := time.Now().UnixNano()
	ok, probe := b.breaker.allow(sent)
	if !ok {
		return zero, backendError{b.dials.explain(ErrCircuitOpen)}
	}
	healthy := b.breaker.healthy()
	cctx, t := ctx, (*timeoutCtx)(nil)
	if b.timeout > 0 {
		cctx, t = withTimeout(ctx, b.timeout)
	}
	v, err := f(cctx) // the batcher returns at cctx's deadline, whatever the client
	late := err != nil && timedOut(cctx)
	t.release()
	switch {
	case err == nil:
		b.breaker.success()
		return v, nil
	case ctx.Err() != nil: // the caller gave up: not Redis's fault
		if probe {
			b.breaker.abandon()
		}
		return zero, err
	case errors.Is(err, errStarved): // the process was slow, not Redis
		if probe {
			b.breaker.abandon()
		}
		return zero, backendError{err}
	}
	b.breaker.failure(sent, time.Now().UnixNano())
	if healthy && late {
		// the first timeout while Redis was healthy: a slow moment until
		// proven otherwise (see errFirstTimeout)
		err = fmt.Errorf("%w (%w)", err, errFirstTimeout)
	}
	return zero, backendError{err}
}

// errFirstTimeout marks a timeout of a call sent while Redis was healthy
// (no failure counted since its last success, or since the start): a
// decision sends it once more before the failure mode answers, so that one
// slow moment (a loaded machine, a burst of callers, a cold start: the
// first dial and script load) is not taken for an outage. Its failure is
// counted by the circuit breaker, so the retry of a Redis that is really
// gone times out unmarked.
var errFirstTimeout = errors.New("the first timeout while Redis was healthy")

func (b *bounds) allow(ctx context.Context, q *query) error {
	_, err := within(b, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.next.allow(ctx, q) })
	return err
}

// reserve runs the reservation to its reply even when the caller's
// context ends first: the script may have run, and only its reply names the
// units it recorded. A caller that leaves gets ctx's error at once; the
// reply is then read on another goroutine, and a reservation it holds is
// given back. Only a Redis that does not answer within the timeout leaves
// the outcome unknown (the units then leave with the window).
func (b *bounds) reserve(ctx context.Context, q *query, longest int64) (reservation, error) {
	run := func(ctx context.Context) (reservation, error) {
		return within(b, ctx, func(ctx context.Context) (reservation, error) { return b.next.reserve(ctx, q, longest) })
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
				_ = b.release(detached, q, o.r)
			}
		}()
		return reservation{}, ctx.Err()
	}
}

func (b *bounds) release(ctx context.Context, q *query, r reservation) error {
	_, err := within(b, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.next.release(ctx, q, r) })
	return err
}

func (b *bounds) block(ctx context.Context, q *query, d int64) error {
	_, err := within(b, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.next.block(ctx, q, d) })
	return err
}

func (b *bounds) reset(ctx context.Context, q *query) error {
	_, err := within(b, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.next.reset(ctx, q) })
	return err
}

func (b *bounds) refund(ctx context.Context, q *query) error {
	_, err := within(b, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.next.refund(ctx, q) })
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
