package core

import "time"

// Op names the call that made a decision.
type Op uint8

const (
	OpAllow Op = iota // Allow, AllowN and the HTTP middleware
	OpPeek            // Peek
	OpWait            // Wait and WaitN (one event per call)
)

// String returns "allow", "peek" or "wait".
func (o Op) String() string {
	switch o {
	case OpPeek:
		return "peek"
	case OpWait:
		return "wait"
	}
	return "allow"
}

// Event describes one decision, for an Observer.
type Event struct {
	Op   Op
	Rule string // the Rule's Name for the HTTP middleware, else empty
	Key  string // the caller's key: high cardinality, never a metric label
	// Result is the answer given; its Limit is the binding limit. For
	// OpWait, Result.Allowed reports that the caller may proceed and
	// Result.RetryAfter is the time waited.
	Result Result
	// Latency is the time the decision took, including any round trip (and,
	// for OpWait, the wait).
	Latency time.Duration
	// CacheHit reports that the deny cache answered without a round trip.
	CacheHit bool
	// Failed reports that Redis gave no answer (an error, the timeout, the
	// open circuit breaker, or the caller's context ending first): Result
	// is then the failure mode's, named by Fallback, and Err says why.
	Failed bool
	// Fallback is the failure mode that answered, when Failed.
	Fallback FailureMode
	// Err is the error returned to the caller, if any: the backend's error
	// when Failed; for OpWait it may also be ErrWaitExceedsDeadline,
	// ErrNeverFits or the context's error.
	Err error
}

// Observer receives an Event for every decision made by Allow, AllowN,
// Peek, Wait, WaitN and the HTTP middleware, synchronously, on the
// caller's goroutine, after the decision and before it is returned. It
// must be safe for concurrent use and fast. A Limiter without an observer
// builds no Event and reads no clock for it.
type Observer func(Event)
