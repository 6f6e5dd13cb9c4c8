// Package core decides whether a request may pass a set of sliding-window
// rate limits, consistently across every replica of a service.
//
// A Limiter keeps its counts in Redis (New) or in the process's memory
// (NewMemory). Each decision is one Lua script call that checks every
// limit of the call and records the units under all of them or under none,
// so a denied request consumes nothing. The script reads the Redis
// server's TIME, so replicas with skewed clocks agree.
//
//	r, err := l.Allow(ctx, key, limits...)
//	if err != nil {
//		return err // no decision: bad input, or ctx ended first
//	}
//	if r.BackendErr != nil {
//		log.Print(r.BackendErr) // Redis failed; the failure mode answered
//	}
//	if !r.Allowed {
//		// deny; r.RetryAfter says when the same request would pass
//	}
//
// # Limits and keys
//
// A Limit admits at most Count units in any window of length Window,
// counted by SlidingLog (exact), SlidingBuckets or SlidingCounter (O(1)
// memory, approximate). Invalid limits are rejected with ErrInvalidLimit
// before Redis is called.
//
// Each limit of a key is stored at "<prefix>{<key>}:v2:<algorithm><window>",
// such as "rw:{ip:203.0.113.9}:v2:r1m": all limits of one key share the
// Redis Cluster hash tag. Keys longer than 128 bytes, and keys with braces,
// are hashed. Every stored key expires at most two windows after its use.
//
// # Failures
//
// Every decision's call to Redis is bounded by WithTimeout (Wait's by
// WithWaitTimeout). When Redis fails, the failure mode (FailOpen,
// FailClosed or FailLocal) answers with a nil error and the failure in
// Result.BackendErr. A circuit breaker skips Redis while it is down; a deny
// cache answers a denied key's repeats without a round trip (WithDenyCache).
//
// # Beyond allow and deny
//
// Refund gives units back; Block makes a key exhausted on every replica;
// Wait, WaitN and Throttle throttle. For HTTP, a Rule says which requests
// to limit and how to answer, and an Enforcer applies it for every adapter.
package core
