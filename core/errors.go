package core

import (
	"errors"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// Sentinel errors. Test for them with errors.Is: the errors returned by the
// Limiter wrap them with details.
var (
	ErrInvalidKey = errors.New("ratewindow: invalid key") // returned for an empty key
	// ErrInvalidLimit: a Limit fails Validate, or two share algorithm and window.
	ErrInvalidLimit = errors.New("ratewindow: invalid limit")
	ErrNoLimits     = errors.New("ratewindow: no limits")    // returned when a call names no limit
	ErrInvalidCost  = errors.New("ratewindow: invalid cost") // returned when the units asked are <= 0
	// ErrUnexpectedReply is returned for a reply the scripts never send.
	ErrUnexpectedReply = store.ErrUnexpectedReply
	// ErrWaitExceedsDeadline: Wait's request cannot start before ctx's deadline; nothing recorded.
	ErrWaitExceedsDeadline = errors.New("ratewindow: wait would exceed the context deadline")
	// ErrNeverFits is returned by Wait when the cost exceeds a limit's Count.
	ErrNeverFits = errors.New("ratewindow: cost exceeds the limit")
	// ErrEvictionPolicy: Check found maxmemory set without noeviction.
	ErrEvictionPolicy = store.ErrEvictionPolicy
	// ErrCheckIncomplete: Check could not read the eviction policy.
	ErrCheckIncomplete = store.ErrCheckIncomplete
	// ErrNoWrites is returned by Check, and matched by Result.BackendErr,
	// when Redis refuses writes (OOM, READONLY, ...); it says what to do.
	ErrNoWrites = store.ErrNoWrites
	// ErrInvalidDuration is returned by Block for a duration outside [1µs, MaxBlock].
	ErrInvalidDuration = errors.New("ratewindow: invalid duration")
	// ErrCircuitOpen is the Result.BackendErr while Redis is skipped: its
	// node was found down (see WithFailureMode).
	ErrCircuitOpen = errors.New("ratewindow: redis unavailable, circuit open")
	// ErrShed is the Result.BackendErr of a decision shed: its calls ran
	// out of time again and again while Redis answered its health check (a
	// process short of CPU, see WithTimeout): denied whatever the failure
	// mode; Redis may have counted it.
	ErrShed = errors.New("ratewindow: decision shed: redis is up but this decision ran out of time")
)
