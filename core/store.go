package core

import "context"

// store is a backend that runs the algorithms: Redis or memory.
type store interface {
	// allow decides q and, when q.commit is set and every limit admits,
	// records q.n units under every limit.
	allow(ctx context.Context, q *query) (Result, error)
	// reserve records q.n units at the earliest time they fit under every
	// (sliding-log) limit, unless that is more than longest µs away
	// (longest < 0: no bound).
	reserve(ctx context.Context, q *query, longest int64) (reservation, error)
	// release gives back a reservation.
	release(ctx context.Context, q *query, r reservation) error
	// reset forgets every unit of q.key under q.limits.
	reset(ctx context.Context, q *query) error
}

// query is one call's input, validated.
type query struct {
	key    string
	n      int64
	limits []Limit
	commit bool
	now    int64 // µs since the epoch; 0: the store's own clock
}

// reservation is what reserve made.
type reservation struct {
	ok      bool    // units were recorded
	wait    int64   // µs from now until the units' time; -1: never fits
	at      int64   // the units' time in µs (memory store)
	members []int64 // the sorted-set members recorded, key after key (Redis)
}

// binder picks the binding limit of a decision, one limit at a time.
type binder struct {
	set                     bool
	limit                   Limit
	remaining, retry, reset int64 // retry and reset in µs; retry -1: never
}

// add considers limit l's outcome. allowed is the decision over all limits.
// Denied: the limit with the longest retry binds (never is longest).
// Allowed, or a tie: the one with the fewest remaining, then the latest reset.
func (b *binder) add(l Limit, allowed bool, remaining, retry, reset int64) {
	remaining = max(remaining, 0)
	reset = max(reset, 0)
	if b.set && !b.beats(allowed, remaining, retry, reset) {
		return
	}
	*b = binder{set: true, limit: l, remaining: remaining, retry: retry, reset: reset}
}

func (b *binder) beats(allowed bool, remaining, retry, reset int64) bool {
	if !allowed {
		if r, cur := retryRank(retry), retryRank(b.retry); r != cur {
			return r > cur
		}
	}
	if remaining != b.remaining {
		return remaining < b.remaining
	}
	return reset > b.reset
}

func retryRank(retry int64) int64 {
	if retry < 0 {
		return 1<<63 - 1
	}
	return retry
}

func (b *binder) result(allowed bool) Result {
	r := Result{Allowed: allowed, Limit: b.limit, Remaining: b.remaining, ResetAfter: usec(b.reset)}
	if !allowed {
		r.RetryAfter = usec(b.retry)
		if b.retry < 0 {
			r.RetryAfter = -1
		}
	}
	return r
}
