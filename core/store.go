package core

import "context"

// store is a backend of a Limiter: the Redis scripts (redis.go) or the
// memory backend (memory.go). Over Redis the Limiter's guard (guard.go)
// wraps each call: the timeout, the circuit breaker, the failure mode.
type store interface {
	// allow decides q: it sets q.allowed and one state per limit in
	// q.states and, when q.commit is set and every limit admits, records
	// q.n units under every limit. An error means that no decision was
	// made.
	allow(ctx context.Context, q *query) error
	// reserve records q.n units at the earliest time they fit under every
	// (sliding-log) limit, unless that is more than longest µs away
	// (longest < 0: no bound).
	reserve(ctx context.Context, q *query, longest int64) (reservation, error)
	// release gives back a reservation.
	release(ctx context.Context, q *query, r reservation) error
	// reset forgets every unit of q.key under q.limits, and its block.
	reset(ctx context.Context, q *query) error
	// block makes q.key exhausted under any limits for d µs from now,
	// unless it is blocked longer already (see Limiter.Block).
	block(ctx context.Context, q *query, d int64) error
	// refund gives back up to q.n units of q.key under every limit: those
	// recorded at q.at, or with q.at 0 the newest ones (see Limiter.Refund).
	refund(ctx context.Context, q *query) error
}

// base is a store that Check can ask directly, past the breaker and the
// failure mode.
type base interface {
	store
	check(ctx context.Context) error
}

// query is one call's input, validated, and the decision the store made.
type query struct {
	key    string
	n      int64
	limits []Limit // the failure mode may scale their Counts (FailLocal)
	commit bool
	now    int64 // µs since the epoch; 0: the store's own clock
	// penalty counts a committed denial towards a ban (Rule.Penalty); nil:
	// none
	penalty *Penalty

	allowed    bool
	states     []limitState // one per limit
	blocked    bool         // the key is blocked (Limiter.Block, or a ban)
	banned     bool         // this denial reached the penalty and banned the key
	backendErr error        // the failure the failure mode answered
	// at is the time in µs the store decided at, the time of the units it
	// recorded; for refund, the time of the units to give back (0: the
	// newest)
	at int64
	// local: for refund, the units were recorded by the failure mode's
	// local store (FailLocal answered the decision)
	local bool
}

// limitState is one limit's part of a decision.
type limitState struct {
	remaining int64 // units still admitted now, after this request
	retry     int64 // µs until the request fits: 0 now, -1 never
	reset     int64 // µs until the limit is back to its full Count
}

// decided sets q's outcome to allowed, with room for one state per limit,
// and returns the states to fill.
func (q *query) decided(allowed bool) []limitState {
	q.allowed, q.blocked, q.banned, q.at = allowed, false, false, 0
	if n := len(q.limits); cap(q.states) >= n {
		q.states = q.states[:n]
		clear(q.states)
	} else {
		q.states = make([]limitState, n)
	}
	return q.states
}

// reservation is what reserve made.
type reservation struct {
	ok     bool  // units were recorded
	wait   int64 // µs from now until the units' time; -1: never fits
	at     int64 // the units' time in µs
	local  bool  // the failure mode's local store made it
	failed error // the failure the failure mode answered
}
