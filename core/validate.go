package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// errNilContext is the error of a call given a nil context.
var errNilContext = errors.New("ratewindow: nil context")

// validate checks a call's input before anything is sent or stored.
func validate(ctx context.Context, key string, n int64, limits []Limit) error {
	switch {
	case ctx == nil:
		return errNilContext
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case n <= 0:
		return fmt.Errorf("%w: %d units; it must be > 0", ErrInvalidCost, n)
	case len(limits) == 0:
		return ErrNoLimits
	}
	return validateLimits(limits)
}

// validateLimits checks each limit (numbered from 0), that there are at most
// MaxLimits, that no two would share storage (algorithm and window), and
// that the sliding logs hold at most MaxLogCount units together and the
// sliding buckets at most MaxBuckets buckets: a call's work in Redis grows
// with both, summed over its limits.
func validateLimits(limits []Limit) error {
	if len(limits) > MaxLimits {
		return fmt.Errorf("%w: %d limits in one call, above MaxLimits %d", ErrInvalidLimit, len(limits), MaxLimits)
	}
	var units, buckets int64
	for i, lim := range limits {
		if p := lim.problem(); p != "" {
			return fmt.Errorf("%w #%d: %s", ErrInvalidLimit, i, p)
		}
		if j := slices.IndexFunc(limits[:i], func(p Limit) bool { return p.Algorithm == lim.Algorithm && p.Window == lim.Window }); j >= 0 {
			return fmt.Errorf("%w: limits #%d and #%d would share storage (two %s limits with the window %s)", ErrInvalidLimit, j, i, lim.Algorithm, lim.Window)
		}
		switch lim.Algorithm {
		case SlidingLog:
			units += lim.Count
		case SlidingBuckets:
			buckets += lim.buckets()
		}
	}
	switch {
	case units > MaxLogCount:
		return fmt.Errorf("%w: the sliding logs of one call count %d units together, above MaxLogCount %d; use SlidingBuckets for the larger", ErrInvalidLimit, units, MaxLogCount)
	case buckets > MaxBuckets:
		return fmt.Errorf("%w: the sliding buckets of one call hold %d buckets together, above MaxBuckets %d; use a longer Precision", ErrInvalidLimit, buckets, MaxBuckets)
	}
	return nil
}

// unprefixed is err without its leading "ratewindow: ", for wrapping.
type unprefixed struct{ err error }

func (e unprefixed) Error() string { return strings.TrimPrefix(e.err.Error(), "ratewindow: ") }
func (e unprefixed) Unwrap() error { return e.err }
