// Package margin widens the windows of an outbound throttler's limits, for
// nethttp.Transport and grpcmw's client interceptors alike: slots taken a
// window apart must still arrive a window apart after their trips.
package margin

import (
	"time"

	"github.com/ratewindow/ratewindow/core"
)

// Widen returns limits with each Window widened by m: 0 means 1% of the
// window (at least 1ms), a negative m none (limits as they are). A window
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
			d = max(l.Window/100, time.Millisecond)
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
