// Package store is the seam between a Limiter and its backends: the Redis
// backend (package redisstore) and the memory backend (package memstore).
// A backend takes a Request, a value, and answers with values: a Decision,
// a Reservation, or an error when no decision was made. The conformance
// suite (package storetest) runs against every backend through this seam
// alone.
package store

import (
	"context"
	"errors"
	"time"
)

// Store is a backend of a Limiter. Every method is safe for concurrent
// use. An error means that nothing was decided or done: the caller's
// context ended, or the backend failed (for Redis, see Remote).
type Store interface {
	// Allow decides r: every limit admits r.N units now, or none records
	// anything. When r.Commit is set and every limit admits, the units are
	// recorded under every limit; else nothing is (a peek). Under a
	// Penalty, a committed denial counts towards a ban.
	Allow(ctx context.Context, r Request) (Decision, error)
	// Reserve records r.N units at the earliest time they fit under every
	// limit (all SlidingLog), counting reservations already made, unless
	// that is more than longest µs from now (longest < 0: no bound).
	Reserve(ctx context.Context, r Request, longest int64) (Reservation, error)
	// Release gives back the units of a reservation that Reserve made for
	// the same key and limits.
	Release(ctx context.Context, r Request, res Reservation) error
	// Refund gives back up to r.N units of r.Key under every limit: those
	// recorded at r.At, or with r.At 0 the newest ones; never below empty,
	// never units in the future (reservations).
	Refund(ctx context.Context, r Request) error
	// Block makes r.Key exhausted under any limits for d from now, unless
	// it is blocked longer already. r.Limits is not used.
	Block(ctx context.Context, r Request, d time.Duration) error
	// Reset forgets every unit of r.Key under r.Limits, its block and its
	// penalty's denials.
	Reset(ctx context.Context, r Request) error
	// Check reports whether the backend can do its job (see
	// core.Limiter.Check).
	Check(ctx context.Context) error
}

// Remote is a Store whose calls cross a network: the Redis backend. A
// failed call returns an *Error; what the guard needs beside it, to apply
// one health rule above the store, is when the server last answered.
type Remote interface {
	Store
	// Clock is the time in ns on the store's monotonic clock, never 0:
	// when a call was sent, for AnsweredSince.
	Clock() int64
	// AnsweredSince reports whether the server answered any call of this
	// store's client since sent (a reply, or an error reply).
	AnsweredSince(sent int64) bool
	// Node names the server that serves key where there are several (a
	// Cluster master's address), as far as the client knows without a
	// round trip; "" when there is one, or it is unknown.
	Node(key string) string
}

// Error is a failed call of a Remote store.
type Error struct {
	// Replied reports that the server answered the call with an error (a
	// script error, NOPERM, OOM, TRYAGAIN, WRONGTYPE): it is alive, and the
	// failure is this call's alone.
	Replied bool
	Err     error // what failed, with what a recent health check found
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Replied reports whether err is a call's failure that the server answered
// (see Error), or a reply the scripts never send.
func Replied(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Replied || errors.Is(err, ErrUnexpectedReply)
}

// MaxLimits is the most limits of one Request (core.MaxLimits).
const MaxLimits = 16

// Algorithm is how a Limit counts (core.Algorithm, the same numbers).
type Algorithm uint8

// The algorithms, numbered as core's and as the Lua scripts take them.
const (
	SlidingLog Algorithm = iota
	SlidingBuckets
	SlidingCounter
)

// Limit is a limit as a backend needs it: core.Limit without its name.
type Limit struct {
	Algorithm Algorithm
	Count     int64
	Window    time.Duration
	// Precision is SlidingBuckets' bucket length as configured; 0: the
	// default (see Step).
	Precision time.Duration
}

// Step is the bucket length of a SlidingBuckets limit: its Precision, or
// by default Window/60, at least a millisecond.
func (l Limit) Step() time.Duration {
	if l.Precision != 0 {
		return l.Precision
	}
	return DefaultPrecision(l.Window)
}

// DefaultPrecision is the bucket length of a SlidingBuckets limit of
// window w without a Precision: w/60, at least a millisecond.
func DefaultPrecision(w time.Duration) time.Duration { return max(w/60, time.Millisecond) }

// Penalty bans a key whose committed denials reach Denials within Within,
// for Ban (core.Penalty). The zero Penalty is none.
type Penalty struct {
	Denials     int64
	Within, Ban time.Duration
}

// Request is one call's input, validated by the Limiter.
type Request struct {
	Key    string
	N      int64   // units: at least 1
	Limits []Limit // at least 1, at most MaxLimits; read during the call only
	// Commit records the units when every limit admits them (Allow); false:
	// a peek.
	Commit bool
	// Now is the time in µs since the epoch; 0: the store's own clock
	// (Redis's TIME).
	Now     int64
	Penalty Penalty
	// At is, for Refund, the time in µs of the units to give back (a
	// Decision's At); 0: the newest.
	At int64
	// Deadline ends the call, beside ctx's deadline: the end of the
	// decision's one budget (see core.WithTimeout); zero: ctx alone. The
	// memory store never waits.
	Deadline time.Time
	// States is room for the states of Allow's Decision, one per limit
	// (see Room); with less, the store makes its own.
	States []State
}

// Room returns the slice for the states of r's Decision: r.States, zeroed,
// one per limit, or a new slice when r.States is too short.
func (r *Request) Room() []State {
	if cap(r.States) < len(r.Limits) {
		return make([]State, len(r.Limits))
	}
	s := r.States[:len(r.Limits)]
	clear(s)
	return s
}

// State is one limit's part of a decision.
type State struct {
	Remaining int64 // units still admitted now, after this request
	Retry     int64 // µs until the request fits: 0 now, -1 never
	Reset     int64 // µs until the limit is back to its full Count
}

// Decision is a store's answer to Allow.
type Decision struct {
	Allowed bool
	Blocked bool // the key is blocked (Block, or a ban)
	Banned  bool // this denial reached the penalty and banned the key
	// At is the time in µs the store decided at: the time of the units it
	// recorded (Refund's Request.At); 0 when unknown.
	At int64
	// States holds one State per limit of the Request, in its order (in
	// the Request's States when they had room).
	States []State
}

// Reservation is what Reserve made.
type Reservation struct {
	OK   bool  // the units were recorded
	Wait int64 // µs from now until the units' time; -1: they never fit
	At   int64 // the units' time in µs
}

// Errors a backend returns, which core exports under the same names.
var (
	// ErrUnexpectedReply: Redis answered with something the scripts never
	// send.
	ErrUnexpectedReply = errors.New("ratewindow: unexpected reply from redis")
	// ErrEvictionPolicy: Check found that Redis may evict the keys.
	ErrEvictionPolicy = errors.New("ratewindow: redis may evict the limiter's keys")
	// ErrCheckIncomplete: Check could not read the eviction policy.
	ErrCheckIncomplete = errors.New("ratewindow: check incomplete")
	// ErrNoWrites: Redis refuses writes (OOM, READONLY, MISCONF,
	// NOREPLICAS).
	ErrNoWrites = errors.New("ratewindow: redis refuses the limiter's writes")
)

// IsTimeout reports whether err is a deadline's: a context's, or a network
// read's or write's.
func IsTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout()
}
