// Package core decides whether a request may pass a set of sliding-window
// rate limits, consistently across every replica of a service.
//
// A Limiter keeps its counts in Redis (New) or in the process's memory
// (NewMemory). Each decision is one Lua script call (FCALL of ratewindow's
// function library on Redis 7, else EVALSHA, with EVAL when the script is
// not cached): every limit of the call is checked first, and
// the units are recorded under all of them or under none, so a denied
// request consumes nothing. The script reads the Redis server's TIME, so
// replicas with skewed clocks agree.
//
// # Algorithms
//
// SlidingLog keeps the time of every admitted unit still in the window, in
// order, in one string value: offsets from a base, 1 to 7 bytes each. It is
// exact: no window of length Window ever holds more than Count units,
// RetryAfter is the exact time until enough of the oldest units leave, and
// Wait reserves a future slot in one round trip. A decision reads and
// writes a fixed number of bytes, however many units the window holds;
// memory grows with the units in the window (never more than Count).
//
// SlidingBuckets keeps a hash of counts per sub-window of Precision (default
// Window/60, so about 61 fields, in Redis's compact encoding), and their sum
// once more than 8 are live, so that an admission reads two fields. A unit counts
// from its bucket until the bucket's end plus Window, so it never admits
// more than Count in any window; it may deny up to one Precision early.
//
// SlidingCounter keeps the counts of the previous and the current fixed
// window and estimates the sliding count as
//
//	previous × (Window − elapsed)/Window + current
//
// It uses O(1) memory but is approximate. It assumes the previous window's
// requests were spread evenly. Its worst case: when the previous window's
// Count units all arrived at its very end, the estimate forgets them
// linearly while they are all still inside the sliding window, so a sliding
// window can hold up to nearly 2×Count units (Count at the end of one fixed
// window, then up to Count·elapsed/Window more as the next one goes on).
// When the previous window's units arrived early, it denies requests that an
// exact log would admit. Use it where memory matters more than exactness.
//
// # Keys
//
// Each limit of a key is stored at "<prefix>{<key>}:<algorithm><window>",
// such as "rw:{ip:203.0.113.9}:r1m": all limits of one key share the
// Redis Cluster hash tag, so one script can touch them all. Keys longer than
// 128 bytes, and keys with braces, are replaced by a fixed-length hash.
// Every stored key carries a TTL of about one window (up to two for the
// counter, and for a sliding log long enough to be kept as a ring),
// so idle keys vanish.
//
// # Bounds
//
// A Limit's Window is from 1ms to MaxWindow (a year); a SlidingBuckets
// window holds at most MaxBuckets buckets; a SlidingLog Count is at most
// MaxLogCount; one call or Rule has at most MaxLimits limits. Anything
// beyond is rejected with ErrInvalidLimit before Redis is called, so every
// script's work and every time stays in range.
//
// # Failures
//
// Every call to Redis is bounded by WithTimeout. When Redis fails, the
// failure mode answers (FailOpen, FailClosed or FailLocal): that answer is a
// decision, returned with a nil error, and Result.BackendErr holds the
// failure. An error from Allow, AllowN or Peek means that no decision was
// made (bad input, or the caller's context ended first), so the natural
//
//	r, err := l.Allow(ctx, key, limits...)
//	if err != nil {
//		return err
//	}
//	if r.BackendErr != nil {
//		log.Print(r.BackendErr) // Redis failed; the failure mode answered
//	}
//	if !r.Allowed {
//		// deny
//	}
//
// keeps a fail-open service up while Redis is down. A small circuit
// breaker stops paying the timeout on every call while Redis is down.
// Denials are remembered in a local deny cache until their RetryAfter
// passes, answering repeat requests without a round trip; this never
// changes a decision. When one expires, one request of the key asks Redis
// again while the others wait for its answer, at most the timeout. A
// decision that times out while Redis answered the Limiter's other calls
// (Redis or the process is overloaded, not down) is not counted by the
// circuit breaker and leaves a key that was just denied denied, so the
// limit holds under a flood; a timeout goes again once before the failure
// mode answers (but under FailLocal, whose local decision counts units).
// Only failures without any reply of Redis count towards the
// breaker, one after the other, never a burst of concurrent timeouts as
// many; an error that Redis answered for one key is that key's failure.
//
// # Beyond allow and deny
//
// Refund gives units back (undo a charge); Block makes a key exhausted on
// every replica for a while; Wait and WaitN throttle instead of rejecting.
// For HTTP, a Rule can choose its limits per request (LimitsFor), count
// only some responses (CountIf, built on Refund) and ban a key that keeps
// being denied (Penalty, built on Block); an Enforcer applies it for every
// adapter (nethttp, chimw, ginmw, echomw).
//
// No request passes a Rule because its decision could not be made: one
// whose own context ends first (its client went away) never reaches the
// handler, and one whose key cannot be computed (a missing header, no
// user) is counted under the rule's FallbackKey, its client IP by default.
// The failure mode answers Redis's failures only.
package core
