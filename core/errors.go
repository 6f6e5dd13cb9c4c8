package core

import (
	"errors"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// Sentinel errors. Test for them with errors.Is: the errors returned by the
// Limiter wrap them with details.
var (
	ErrInvalidKey = errors.New("ratewindow: invalid key") // returned for an empty key
	// ErrInvalidLimit is returned for a Limit that fails Validate, or two
	// limits of one call of the same algorithm and window.
	ErrInvalidLimit = errors.New("ratewindow: invalid limit")
	ErrNoLimits     = errors.New("ratewindow: no limits")    // returned when a call names no limit
	ErrInvalidCost  = errors.New("ratewindow: invalid cost") // returned when the units asked are <= 0
	// ErrUnexpectedReply is returned for a reply the scripts never send.
	ErrUnexpectedReply = store.ErrUnexpectedReply
	// ErrWaitExceedsDeadline is returned by Wait when the request cannot
	// start before the context's deadline. Nothing was recorded.
	ErrWaitExceedsDeadline = errors.New("ratewindow: wait would exceed the context deadline")
	// ErrNeverFits is returned by Wait when the cost exceeds a limit's Count.
	ErrNeverFits = errors.New("ratewindow: cost exceeds the limit")
	// ErrEvictionPolicy is returned by Check when Redis would evict the
	// Limiter's keys: maxmemory is set, maxmemory-policy is not noeviction.
	ErrEvictionPolicy = store.ErrEvictionPolicy
	// ErrCheckIncomplete is returned by Check when neither CONFIG GET nor
	// INFO could read the eviction policy (an ACL, or no answer).
	ErrCheckIncomplete = store.ErrCheckIncomplete
	// ErrNoWrites is returned by Check, and matched by Result.BackendErr,
	// when Redis refuses the Limiter's writes (OOM under noeviction,
	// READONLY, MISCONF, NOREPLICAS); the error says what to do.
	ErrNoWrites = store.ErrNoWrites
	// ErrInvalidDuration is returned by Block for a duration outside (0, MaxBlock].
	ErrInvalidDuration = errors.New("ratewindow: invalid duration")
	// ErrCircuitOpen is the Result.BackendErr while the circuit breaker skips Redis.
	ErrCircuitOpen = errors.New("ratewindow: redis unavailable, circuit open")
	// ErrShed is the Result.BackendErr of a decision shed for overload: its
	// time ran out while Redis answered this process's other calls. Whatever
	// the failure mode, it is answered as FailClosed answers, never
	// admitted; Redis may still have counted it.
	ErrShed = errors.New("ratewindow: decision shed: redis answered other calls but not this one in time")
)
