package core

import (
	"context"
	"math"
)

// failover is the layer of the chain that answers Redis's failures by the
// failure mode: a backendError from below becomes a decision, with the
// failure in query.backendErr (Result.BackendErr) and a nil error. Errors
// that are not Redis's (the caller's context ending first) pass through:
// no decision was made.
type failover struct {
	next  store // the bounds over the Redis scripts
	mode  FailureMode
	local *memoryStore // FailLocal's store; nil for the other modes
	share float64      // FailLocal's share of each Count
}

// failClosedRetry is the RetryAfter and ResetAfter of a FailClosed denial.
const failClosedRetry = int64(1e6) // µs

func (f *failover) allow(ctx context.Context, q *query) error {
	err := f.next.allow(ctx, q)
	if err == nil || !isBackendError(err) {
		return err
	}
	switch f.mode {
	case FailClosed:
		for i := range q.decided(false) {
			q.states[i] = limitState{retry: failClosedRetry, reset: failClosedRetry}
		}
	case FailLocal:
		f.localQuery(q)
		if lerr := f.local.allow(ctx, q); lerr != nil {
			return lerr
		}
	default: // FailOpen
		for i := range q.decided(true) {
			q.states[i] = limitState{remaining: max(q.limits[i].Count-q.n, 0)}
		}
	}
	q.backendErr = err
	return nil
}

// localQuery turns q into the local store's query: each Count scaled by
// the share (the decision's Result then names the scaled limit), on the
// process clock.
func (f *failover) localQuery(q *query) {
	for i := range q.limits {
		q.limits[i].Count = scaled(q.limits[i].Count, f.share)
	}
	q.now = 0
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

// reserve answers a failed reservation: FailOpen lets the caller proceed at
// once, FailLocal reserves in the local store, FailClosed returns the
// failure.
func (f *failover) reserve(ctx context.Context, q *query, longest int64) (reservation, error) {
	r, err := f.next.reserve(ctx, q, longest)
	if err == nil || !isBackendError(err) {
		return r, err
	}
	switch f.mode {
	case FailOpen:
		return reservation{ok: true, failed: err}, nil
	case FailLocal:
		r, lerr := f.local.reserve(ctx, f.localCopy(q), longest)
		r.local, r.failed = true, err
		return r, lerr
	}
	return reservation{failed: err}, err
}

func (f *failover) release(ctx context.Context, q *query, r reservation) error {
	switch {
	case r.local:
		return f.local.release(ctx, q, r)
	case r.failed != nil: // FailOpen: nothing was recorded
		return nil
	}
	return f.next.release(ctx, q, r)
}

// block blocks the key in the local store too (it decides while Redis is
// down), then in Redis; Redis's failure is returned.
func (f *failover) block(ctx context.Context, q *query, d int64) error {
	if f.local != nil {
		_ = f.local.block(ctx, q, d)
	}
	return f.next.block(ctx, q, d)
}

// reset forgets the key in the local store too, then in Redis; Redis's
// failure is returned.
func (f *failover) reset(ctx context.Context, q *query) error {
	if f.local != nil {
		_ = f.local.reset(ctx, q)
	}
	return f.next.reset(ctx, q)
}

// refund gives back units recorded by the local store (q.local: the
// failure mode decided) there, and any others in Redis. When Redis fails,
// FailLocal gives back the local store's newest units (it decided while
// Redis was down), and Redis's failure is returned.
func (f *failover) refund(ctx context.Context, q *query) error {
	if q.local {
		if f.local == nil {
			return nil // FailOpen recorded nothing
		}
		return f.local.refund(ctx, f.localCopy(q))
	}
	err := f.next.refund(ctx, q)
	if err != nil && f.local != nil && isBackendError(err) {
		lq := f.localCopy(q)
		lq.at = 0
		_ = f.local.refund(ctx, lq)
	}
	return err
}

// localCopy returns a copy of q for the local store, leaving q as it is.
func (f *failover) localCopy(q *query) *query {
	lq := *q
	lq.limits = append([]Limit(nil), q.limits...)
	f.localQuery(&lq)
	return &lq
}
