package core

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseLimits reads limits from configuration: a comma-separated list of
// "<count>/<window>", where the window is a unit (ms, s, m, h, d) or a
// duration as time.ParseDuration reads it ("15m", "1h30m", "500ms",
// ".5s"), or a whole number of days ("2d"):
//
//	"10/s"          10 per second
//	"1000/h"        1000 per hour
//	"5/15m"         5 per 15 minutes
//	"10/s, 1000/h"  both at once
//
// The limits are sliding logs; change one with Limit.With. Spaces around
// items are ignored. Anything else is an error that wraps ErrInvalidLimit
// and quotes the item, as is a list whose limits fail validation.
func ParseLimits(s string) ([]Limit, error) {
	var limits []Limit
	for i, item := range strings.Split(s, ",") {
		lim, err := parseLimit(strings.TrimSpace(item))
		if err != nil {
			return nil, fmt.Errorf("%w: item %d of %q: %w", ErrInvalidLimit, i+1, s, err)
		}
		limits = append(limits, lim)
	}
	if err := validateLimits(limits); err != nil {
		return nil, fmt.Errorf("%w (in %q)", err, s)
	}
	return limits, nil
}

// parseLimit reads one "<count>/<window>".
func parseLimit(item string) (Limit, error) {
	count, window, ok := strings.Cut(item, "/")
	if !ok {
		return Limit{}, fmt.Errorf("%q is not <count>/<window>, such as 10/s or 5/15m", item)
	}
	if strings.Contains(window, "/") {
		return Limit{}, fmt.Errorf("%q holds more than one limit: separate them with commas, as in \"10/s, 1000/h\"", item)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(count), 10, 64)
	if errors.Is(err, strconv.ErrRange) && n > 0 {
		return Limit{}, fmt.Errorf("count %q in %q overflows a 64-bit integer (a sliding log holds at most MaxLogCount, %d)", count, item, MaxLogCount)
	}
	if err != nil || n <= 0 {
		return Limit{}, fmt.Errorf("count %q in %q is not a whole number above 0", count, item)
	}
	w, err := parseWindow(strings.TrimSpace(window))
	if err != nil {
		return Limit{}, fmt.Errorf("window %q in %q: %w", window, item, err)
	}
	lim := Per(n, w)
	if p := lim.problem(); p != "" {
		return Limit{}, errors.New(p)
	}
	return lim, nil
}

// parseWindow reads a window: a unit alone is one of it; "d" is 24h.
func parseWindow(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("empty; want a unit (ms, s, m, h, d) or a duration such as 15m")
	}
	if c := s[0] | 0x20; c >= 'a' && c <= 'z' { // a unit alone: one of it
		s = "1" + s
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err == nil && n <= 0 {
			return 0, errors.New("must be above 0, such as 1d")
		}
		if err != nil || n > int64(MaxWindow/(24*time.Hour)) {
			return 0, fmt.Errorf("want a whole number of days, such as 2d, or hours, such as 36h")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want a unit (ms, s, m, h, d) or a duration such as 15m")
	}
	if d <= 0 {
		return 0, errors.New("must be above 0, such as 15m")
	}
	return d, nil
}
