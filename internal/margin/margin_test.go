package margin_test

import (
	"slices"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/margin"
)

func TestWiden(t *testing.T) {
	buckets := core.Limit{Count: 10, Window: time.Hour, Algorithm: core.SlidingBuckets, Precision: 6875 * time.Millisecond} // 524 buckets
	for _, c := range []struct {
		name   string
		limits []core.Limit
		m      time.Duration
		want   []core.Limit
	}{
		{"default: at least 50ms", []core.Limit{core.PerSecond(10)}, 0, []core.Limit{core.Per(10, 1050*time.Millisecond)}},
		{"default: 1%", []core.Limit{core.PerMinute(10)}, 0, []core.Limit{core.Per(10, 60600*time.Millisecond)}},
		{"default: at most a tenth", []core.Limit{core.Per(10, 50*time.Millisecond)}, 0, []core.Limit{core.Per(10, 55*time.Millisecond)}},
		{"default: at most a tenth of a short window", []core.Limit{core.Per(10, 5*time.Millisecond)}, 0, []core.Limit{core.Per(10, 5500*time.Microsecond)}},
		{"a margin of its own", []core.Limit{core.PerMinute(5), core.PerHour(50)}, time.Second, []core.Limit{core.Per(5, 61*time.Second), core.Per(50, time.Hour+time.Second)}},
		{"none", []core.Limit{core.PerSecond(10)}, -1, []core.Limit{core.PerSecond(10)}},
		{"a year's window stays valid", []core.Limit{core.Per(1, core.MaxWindow)}, 0, []core.Limit{core.Per(1, core.MaxWindow)}},
		{"buckets keep their number", []core.Limit{buckets}, time.Minute, []core.Limit{{Count: 10, Window: time.Hour + time.Minute,
			Algorithm: core.SlidingBuckets, Precision: (time.Hour + time.Minute + 523) / 524}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := margin.Widen(c.limits, c.m)
			if !slices.Equal(got, c.want) {
				t.Fatalf("Widen(%v, %s) = %v, want %v", c.limits, c.m, got, c.want)
			}
			if err := (core.Rule{Name: "r", Limits: got}).Validate(); err != nil {
				t.Fatalf("widened limits invalid: %v", err)
			}
		})
	}
}
