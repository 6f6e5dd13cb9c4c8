package core

import (
	"fmt"
	"slices"
	"strings"
)

// validate checks a call's input before anything is sent or stored.
func validate(key string, n int64, limits []Limit) error {
	switch {
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
// MaxLimits, and that no two would share storage (algorithm and window).
func validateLimits(limits []Limit) error {
	if len(limits) > MaxLimits {
		return fmt.Errorf("%w: %d limits in one call, above MaxLimits %d", ErrInvalidLimit, len(limits), MaxLimits)
	}
	for i, lim := range limits {
		if p := lim.problem(); p != "" {
			return fmt.Errorf("%w #%d: %s", ErrInvalidLimit, i, p)
		}
		if j := slices.IndexFunc(limits[:i], func(p Limit) bool { return p.Algorithm == lim.Algorithm && p.Window == lim.Window }); j >= 0 {
			return fmt.Errorf("%w: limits #%d and #%d would share storage (two %s limits with the window %s)", ErrInvalidLimit, j, i, lim.Algorithm, lim.Window)
		}
	}
	return nil
}

// unprefixed is err without its leading "ratewindow: ", for wrapping.
type unprefixed struct{ err error }

func (e unprefixed) Error() string { return strings.TrimPrefix(e.err.Error(), "ratewindow: ") }
func (e unprefixed) Unwrap() error { return e.err }
