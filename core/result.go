package core

import "time"

// Result is the outcome of a decision.
type Result struct {
	// Allowed reports whether the request may pass. Peek reports whether one
	// unit would pass.
	Allowed bool
	// Limit is the binding limit: the one that denied the request (the one
	// with the longest RetryAfter), or, when allowed, the one with the fewest
	// units remaining.
	Limit Limit
	// Remaining is the number of units the binding limit still admits now,
	// after this request.
	Remaining int64
	// RetryAfter is 0 when allowed. When denied, it is how long until the
	// same request would pass; it is negative when it never can (its cost
	// exceeds the limit's Count).
	RetryAfter time.Duration
	// ResetAfter is how long until the binding limit is back to its full
	// Count.
	ResetAfter time.Duration
	// BackendErr is the Redis failure (an error reply, a lost connection,
	// the timeout, ErrCircuitOpen) that the failure mode answered, or nil
	// when Redis decided. The rest of the Result is then the failure mode's
	// answer: FailOpen allowed, FailClosed denied with a RetryAfter of a
	// second, FailLocal the local decision. Log it; branch on Allowed.
	BackendErr error

	violated uint16 // bit i: the call's limit i denied (MaxLimits fit)
	blocked  bool   // by Limiter.Block or a Penalty's ban
}

// Never reports whether the request can never pass: its cost exceeds Count.
func (r Result) Never() bool { return !r.Allowed && r.RetryAfter < 0 }
