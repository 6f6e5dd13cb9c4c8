package core

import "time"

// Result is the outcome of a decision.
type Result struct {
	// Allowed reports whether the request may pass (Peek: whether one would).
	Allowed bool
	// Limit is the binding limit: the one that denied the request (with the
	// longest RetryAfter), or when allowed the one with the fewest remaining.
	Limit Limit
	// Remaining is the units the binding limit still admits, after this one.
	Remaining int64
	// RetryAfter is 0 when allowed; when denied, how long until the same
	// request would pass, negative when it never can (cost above Count).
	RetryAfter time.Duration
	// ResetAfter is how long until the binding limit is back to its Count.
	ResetAfter time.Duration
	// BackendErr is the Redis failure (an error reply, a lost connection,
	// the timeout, ErrCircuitOpen) that the failure mode answered, or nil:
	// FailOpen allowed, FailClosed denied with a RetryAfter of a second,
	// FailLocal the local decision. Log it; branch on Allowed.
	BackendErr error

	violated uint16 // bit i: the call's limit i denied (MaxLimits fit)
	blocked  bool   // by Limiter.Block or a Penalty's ban
}

// Never reports whether the request can never pass: its cost exceeds Count.
func (r Result) Never() bool { return !r.Allowed && r.RetryAfter < 0 }
