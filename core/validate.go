package core

import "fmt"

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

// validateLimits checks each limit, and that no two would share storage
// (the same algorithm and window). Rule.Validate uses it too.
func validateLimits(limits []Limit) error {
	for i, lim := range limits {
		if err := lim.Validate(); err != nil {
			return fmt.Errorf("limit %d: %w", i, err)
		}
		for j, prev := range limits[:i] {
			if prev.Algorithm == lim.Algorithm && prev.Window == lim.Window {
				return fmt.Errorf("limits %d and %d: %w: two %s limits with the window %s would share storage", j, i, ErrInvalidLimit, lim.Algorithm, lim.Window)
			}
		}
	}
	return nil
}
