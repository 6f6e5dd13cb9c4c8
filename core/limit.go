package core

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// Algorithm selects how a Limit counts requests inside its sliding window.
type Algorithm uint8

const (
	// SlidingLog keeps the time of every admitted unit still in the window
	// (at most Count). It is exact: no window ever holds more than Count
	// units, RetryAfter is exact, and Wait reserves a slot in one round trip.
	SlidingLog Algorithm = iota
	// SlidingBuckets keeps one count per sub-window of Precision (default
	// Window/60): it never over-admits, may deny up to one Precision early.
	SlidingBuckets
	// SlidingCounter keeps the counts of the previous and the current fixed
	// window and weighs the previous by the part of it still in the window:
	// O(1) memory, approximate (a window may hold nearly 2×Count).
	SlidingCounter
)

// String returns the algorithm's name, such as "sliding-log".
func (a Algorithm) String() string { return enumName(a, algorithmNames[:], "algorithm") }

var algorithmNames = [...]string{"sliding-log", "sliding-buckets", "sliding-counter"}

// enumName returns names[v], or kind(v) for a value without a name.
func enumName[T ~uint8](v T, names []string, kind string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return kind + "(" + strconv.Itoa(int(v)) + ")"
}

// Limit admits at most Count units in any sliding window of length Window.
type Limit struct {
	// Name identifies the limit in the RateLimit-Policy header, at most
	// MaxLimitName bytes. Empty: derived from Count and Window ("100-per-1m").
	Name      string
	Count     int64         // units admitted in any Window; must be > 0
	Window    time.Duration // from 1ms to MaxWindow
	Algorithm Algorithm     // the zero value is SlidingLog
	// Precision is the sub-window of SlidingBuckets: zero means Window/60
	// (at least 1ms); else 1ms to Window, at most MaxBuckets in Window.
	Precision time.Duration
}

// Penalty bans a key that keeps hitting its limits: after Denials denials
// of one key within Within (from the first), the key is banned for Ban on
// every replica: denied with a Retry-After of the ban's time left (problem
// type ProblemAbnormalUsage), counted nowhere. A ban is a Limiter.Block.
type Penalty struct {
	Denials int64         // the denials that ban the key: at least 1
	Within  time.Duration // from the first denial counted: 1ms to MaxWindow
	Ban     time.Duration // how long a ban lasts: 1ms to MaxBlock
}

// Bounds of a Limit, and of the limits of one call.
const (
	// MaxLogCount is the largest Count of a SlidingLog limit, and of the
	// SlidingLog limits of one call summed. It bounds the costliest calls
	// on a long log (a refund of half of it, a decision after half of it
	// left the window at once), which read and remove up to MaxLogCount/2
	// members: at this bound no call holds Redis for 10 ms or more
	// (docs/performance.md has the measurement). Larger limits belong to
	// SlidingBuckets.
	MaxLogCount = 1 << 13
	// MaxCount is the largest Count of any limit: 2^53 - 1, the largest
	// integer the scripts' numbers (doubles) hold exactly.
	MaxCount  = 1<<53 - 1
	MaxWindow = 366 * 24 * time.Hour // the longest Window: a year (and a day)
	// MaxBuckets is the most Precision sub-windows of a SlidingBuckets
	// Window, and of the SlidingBuckets limits of one call together.
	MaxBuckets   = 1024
	MaxLimits    = 16 // the most limits of one call or Rule
	MaxLimitName = 64 // the longest Name of a Limit, in bytes
)

// Per returns a SlidingLog limit of n units per window.
func Per(n int64, window time.Duration) Limit { return Limit{Count: n, Window: window} }

// PerSecond returns a SlidingLog limit of n units per second.
func PerSecond(n int64) Limit { return Per(n, time.Second) }

// PerMinute returns a SlidingLog limit of n units per minute.
func PerMinute(n int64) Limit { return Per(n, time.Minute) }

// PerHour returns a SlidingLog limit of n units per hour.
func PerHour(n int64) Limit { return Per(n, time.Hour) }

// With returns a copy of l that uses algorithm a.
func (l Limit) With(a Algorithm) Limit { l.Algorithm = a; return l }

// String describes the limit, such as "100 per 1m0s (sliding-log)".
func (l Limit) String() string {
	return strconv.FormatInt(l.Count, 10) + " per " + l.Window.String() + " (" + l.Algorithm.String() + ")"
}

// Validate reports whether the limit can be enforced; errors wrap ErrInvalidLimit.
func (l Limit) Validate() error {
	if p := l.problem(); p != "" {
		return fmt.Errorf("%w: %s", ErrInvalidLimit, p)
	}
	return nil
}

// problem says what is wrong with l, or "".
func (l Limit) problem() string {
	switch {
	case l.Count <= 0:
		return fmt.Sprintf("count %d must be > 0", l.Count)
	case l.Count > MaxCount:
		return fmt.Sprintf("count %d is above MaxCount %d, the largest the scripts count exactly", l.Count, int64(MaxCount))
	case l.Window < time.Millisecond || l.Window > MaxWindow:
		return fmt.Sprintf("window %s must be from 1ms to MaxWindow (%s)", l.Window, MaxWindow)
	case l.Algorithm > SlidingCounter:
		return "unknown " + l.Algorithm.String()
	case l.Algorithm == SlidingLog && l.Count > MaxLogCount:
		return fmt.Sprintf("count %d is above MaxLogCount %d for a sliding log; use SlidingBuckets", l.Count, MaxLogCount)
	case l.Precision != 0 && (l.Precision < time.Millisecond || l.Precision > l.Window):
		return fmt.Sprintf("precision %s must be between 1ms and the window %s", l.Precision, l.Window)
	case l.Algorithm == SlidingBuckets && l.buckets() > MaxBuckets:
		return fmt.Sprintf("a window of %s holds %d buckets of %s, above MaxBuckets %d: use a longer Precision", l.Window, l.buckets(), l.precision(), MaxBuckets)
	case len(l.Name) > MaxLimitName:
		return fmt.Sprintf("a name of %d bytes is longer than MaxLimitName %d", len(l.Name), MaxLimitName)
	}
	return ""
}

// PolicyName is the limit's name for the RateLimit-Policy header: Name, or
// one derived from Count and Window ("100-per-1m", "5-per-1500ms").
func (l Limit) PolicyName() string {
	if l.Name != "" {
		return l.Name
	}
	return strconv.FormatInt(l.Count, 10) + "-per-" + string(store.AppendDuration(nil, l.Window))
}

// ownLimits returns a copy of limits to keep, with names of their own (a
// caller's may be cut from a larger string).
func ownLimits(limits []Limit) []Limit {
	own := slices.Clone(limits)
	for i := range own {
		own[i].Name = strings.Clone(own[i].Name)
	}
	return own
}

// spec returns l as the store takes it.
func (l Limit) spec() store.Limit {
	return store.Limit{Algorithm: store.Algorithm(l.Algorithm), Count: l.Count, Window: l.Window, Precision: l.Precision}
}

// precision returns the sub-window length used by SlidingBuckets.
func (l Limit) precision() time.Duration { return l.spec().Step() }

// buckets returns how many sub-windows of SlidingBuckets its Window holds.
func (l Limit) buckets() int64 { return int64((l.Window + l.precision() - 1) / l.precision()) }

// usec converts microseconds to a Duration.
func usec(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
