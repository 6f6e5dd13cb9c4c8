// Package margin widens the windows of an outbound throttler's limits, for
// nethttp.Transport and grpcmw's client interceptors alike: slots taken a
// window apart must still arrive a window apart after their trips.
package margin

import (
	"time"

	"github.com/ratewindow/ratewindow/core"
)

// Widen returns limits with each Window widened by m: 0 means Default's,
// a negative m none (limits as they are). A window
// stops at core.MaxWindow, and sliding buckets keep their number of
// buckets (the Precision widens too), so that limits a Rule takes stay
// valid.
func Widen(limits []core.Limit, m time.Duration) []core.Limit {
	if m < 0 {
		return limits
	}
	out := make([]core.Limit, len(limits))
	for i, l := range limits {
		d := m
		if d == 0 {
			d = Default(l.Window)
		}
		w := min(l.Window+d, core.MaxWindow)
		if l.Algorithm == core.SlidingBuckets && l.Precision != 0 {
			k := (l.Window + l.Precision - 1) / l.Precision
			l.Precision = (w + k - 1) / k
		}
		l.Window = w
		out[i] = l
	}
	return out
}

// Default is the margin of a window w when none is set: 1% of w, and at
// least 50ms, but at most a tenth of w. A start may be up to 1% of the
// window late (core's WaitN moves a later one), and a loaded machine's
// scheduler alone delays a trip by 20ms: 1% of a second (10ms) covered
// the first and left the trip nothing, and a strict upstream refused.
func Default(w time.Duration) time.Duration {
	return max(w/100, min(50*time.Millisecond, w/10))
}
