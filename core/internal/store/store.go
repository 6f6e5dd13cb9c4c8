// Package store is the seam between a Limiter and its backends
// (redisstore, memstore), which storetest's conformance suite runs through.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store is a backend of a Limiter, safe for concurrent use. An error means
// that nothing was decided or done.
type Store interface {
	// Allow decides r: every limit admits r.N units now, or none records
	// anything; without r.Commit nothing is recorded (a peek). Under a
	// Penalty, a committed denial counts towards a ban.
	Allow(ctx context.Context, r Request) (Decision, error)
	// Reserve records r.N units at the earliest time they fit under every
	// limit (all SlidingLog), counting reservations already made, and at
	// least r.Lead µs from now, unless that is more than longest µs from
	// now (longest < 0: no bound). With r.From it first gives back the
	// reservation of that time, in the same step, whatever it answers.
	Reserve(ctx context.Context, r Request, longest int64) (Reservation, error)
	// Release gives back a reservation Reserve made for r.
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
	// Check reports whether the backend can do its job (core.Limiter.Check).
	Check(ctx context.Context) error
	// Operator: what the Limiter's operating methods call (see operate.go).
	Operator
}

// Remote is a Store across a network (Redis): a failed call returns an
// *Error, or a timeout (IsTimeout) when no reply came in time.
type Remote interface {
	Store
	// Node names the node serving key (a Cluster's master, a Ring's
	// shard), as the client knows it without a round trip; "" when there
	// is one server, or unknown.
	Node(key string) string
	// Ping asks the server serving key for any reply to PING, on a
	// connection of its own, and waits silence for its first byte: nil
	// when one came, whenever this process looked; ErrSilent when none
	// came, however late this process looked; a timeout when nothing can
	// tell, such as a dial out of time (no evidence); else the
	// connection's failure.
	Ping(ctx context.Context, key string, silence time.Duration) error
}

// Error is a failed call of a Remote store.
type Error struct {
	// Replied: the server answered with an error reply; it is alive, and
	// the failure is this call's alone.
	Replied bool
	Err     error // what failed, with what a recent health check found
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Replied reports whether err is an *Error the server replied, or an
// unexpected reply.
func Replied(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Replied || errors.Is(err, ErrUnexpectedReply)
}

// MaxLimits is the most limits of one Request (core.MaxLimits).
const MaxLimits = 16

// Algorithm is how a Limit counts (core.Algorithm, the same numbers).
type Algorithm uint8

// The algorithms, numbered as core's and the Lua scripts'.
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
	Precision time.Duration // SlidingBuckets' bucket length; 0: the default (see Step)
}

// Step is a SlidingBuckets limit's bucket length: Precision, or the default.
func (l Limit) Step() time.Duration {
	if l.Precision != 0 {
		return l.Precision
	}
	return DefaultPrecision(l.Window)
}

// DefaultPrecision is the bucket length of a SlidingBuckets limit of
// window w without a Precision: w/60, at least a millisecond.
func DefaultPrecision(w time.Duration) time.Duration { return max(w/60, time.Millisecond) }

// Penalty bans a key for Ban when its committed denials reach Denials
// within Within (core.Penalty); the zero Penalty is none.
type Penalty struct {
	Denials     int64
	Within, Ban time.Duration
}

// Request is one call's input, validated by the Limiter.
type Request struct {
	Key     string
	N       int64   // units: at least 1
	Limits  []Limit // at least 1, at most MaxLimits; read during the call only
	Commit  bool    // Allow records the units when every limit admits; false: a peek
	Now     int64   // µs since the epoch; 0: the store's clock (Redis's TIME)
	Penalty Penalty
	At      int64 // Refund: the µs of the units to give back (a Decision's At); 0: the newest
	Lead    int64 // Reserve: the units' time is at least this many µs after now
	From    int64 // Reserve: a reservation of r's to give back first, by its time (a move); 0: none
	// Deadline ends the call beside ctx's: the decision's budget (see
	// core.WithTimeout); zero: ctx alone.
	Deadline time.Time
	States   []State // room for Allow's states (see Room)
}

// Room returns r.States zeroed, one per limit, or a new slice when it is
// too short.
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
	Count     int64 // an override's Count, in force for this limit; 0: none
}

// Decision is a store's answer to Allow.
type Decision struct {
	Allowed bool
	Blocked bool    // the key is blocked (Block, or a ban)
	Banned  bool    // this denial reached the penalty and banned the key
	At      int64   // µs the store decided at (Refund's Request.At); 0: unknown
	States  []State // one per limit, in the Request's order
}

// Reservation is what Reserve made.
type Reservation struct {
	OK   bool  // the units were recorded
	Wait int64 // µs from now until the units' time; -1: they never fit
	At   int64 // the units' time in µs
}

// Errors a backend returns, which core exports under the same names.
var (
	// ErrUnexpectedReply: a reply the scripts never send.
	ErrUnexpectedReply = errors.New("ratewindow: unexpected reply from redis")
	// ErrEvictionPolicy: Check found that Redis may evict the keys.
	ErrEvictionPolicy = errors.New("ratewindow: redis may evict the limiter's keys")
	// ErrCheckIncomplete: Check could not read the eviction policy.
	ErrCheckIncomplete = errors.New("ratewindow: check incomplete")
	// ErrSilent: Redis sent nothing back to a health check's PING.
	ErrSilent = errors.New("redis sent no reply")
	// ErrNoWrites: OOM, READONLY, MISCONF or NOREPLICAS.
	ErrNoWrites = errors.New("ratewindow: redis refuses the limiter's writes")
)

// IsTimeout reports whether err is a context's or a network deadline's, or
// a wait for one of the client's connections that ran out of time (all of
// them busy: no evidence against Redis).
func IsTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout() || errors.Is(err, redis.ErrPoolTimeout)
}
