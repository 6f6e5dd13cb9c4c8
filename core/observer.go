package core

import "time"

// Op names the call that made a decision.
type Op uint8

const (
	OpAllow   Op = iota // Allow, AllowN and every rule's middleware (HTTP, gRPC, Connect)
	OpPeek              // Peek
	OpWait              // Wait and WaitN (one event per call)
	OpRefused           // an upstream refused a request (Decider.Refused): its key blocked for Result.RetryAfter
)

// String returns "allow", "peek", "wait" or "refused"; for a value that
// names none of them, "Op(n)".
func (o Op) String() string { return enumName(o, ops[:], "Op") }

var ops = [...]string{"allow", "peek", "wait", "refused"}

// Event describes one decision, for an Observer.
type Event struct {
	Op   Op     // what was decided: Allow (AllowN and the middleware's), Peek, Wait, or a refusal
	Rule string // the rule's Name for a rule's decisions and refusals (every adapter and throttler), else empty
	Key  string // the caller's key: high cardinality, never a metric label
	// Result is the answer given; its Limit is the binding limit. For
	// OpWait, Allowed means proceed and RetryAfter is the time waited.
	Result   Result
	Latency  time.Duration // the time the decision took (for OpWait, the wait included)
	CacheHit bool          // the deny cache answered without a round trip
	// Retried: for OpRefused, the request goes again after the block; for
	// OpAllow, the call to Redis went again after running out of time while
	// Redis answered its health check (Redis may have counted it twice).
	Retried bool
	// Banned reports that this denial reached the Rule's Penalty: the key
	// is banned from now on, on every replica, for Result.RetryAfter.
	Banned bool
	// Failed reports that Redis failed and the failure mode Fallback
	// answered; Err says why. A caller's context ending is no failure.
	Failed bool
	// Shed reports that the decision was shed for overload (see
	// WithTimeout): Err and Result.BackendErr match ErrShed; Failed is false.
	Shed     bool
	Fallback FailureMode // the failure mode that answered, when Failed
	// Err is the backend's error when Failed or Shed, else the error
	// returned to the caller, if any (for OpWait, ErrWaitExceedsDeadline or
	// ErrNeverFits too, wrapping the backend's error when a Wait ended
	// after a failure: errors.Is finds both).
	Err error
}

// Observer receives an Event for every decision, on the caller's goroutine
// before it is returned. It must be safe for concurrent use and fast.
// Without one, a Limiter builds no Event and reads no clock for it.
type Observer func(Event)

// Outcome names what became of a decision, as the metrics label it:
// "allowed", "denied", "error" (the failure mode answered for Redis, or the
// call got no decision of Redis's), or "shed" (see Event.Shed); "" for an
// event that is no decision counted as one (OpPeek, OpRefused).
func (e Event) Outcome() string {
	switch {
	case e.Op == OpPeek || e.Op == OpRefused:
		return ""
	case e.Shed:
		return "shed"
	case e.Failed, e.Op != OpWait && e.Err != nil:
		return "error"
	case e.Result.Allowed:
		return "allowed"
	}
	return "denied"
}
