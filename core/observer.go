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
	// Result is the answer given; for OpWait, Result.RetryAfter is the wait.
	Result Result
	// Latency is the time the decision took, including any round trip.
	Latency time.Duration
	// CacheHit reports that the deny cache answered without a round trip.
	CacheHit bool
	// Err is the backend error, if any. The result was then decided by the
	// failure mode, reported in Fallback.
	Err error
	// Fallback is set when Err is set: the failure mode that answered.
	Fallback FailureMode
}

// Observer receives events. It must be safe for concurrent use.
type Observer func(Event)
