package core

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

func TestParseLimits(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []Limit
	}{
		{"10/s", []Limit{PerSecond(10)}},
		{"1000/h", []Limit{PerHour(1000)}},
		{"5/15m", []Limit{Per(5, 15*time.Minute)}},
		{"10/s, 1000/h", []Limit{PerSecond(10), PerHour(1000)}},
		{" 3/500ms ,2/1h30m", []Limit{Per(3, 500*time.Millisecond), Per(2, 90*time.Minute)}},
		{"100/d", []Limit{Per(100, 24*time.Hour)}},
		{"7/2d", []Limit{Per(7, 48*time.Hour)}},
		{"1/m", []Limit{PerMinute(1)}},
		// read as time.ParseDuration reads them (issue 26: ".5s" was 1.5s)
		{"10/.5s", []Limit{Per(10, 500*time.Millisecond)}},
		{"100/.5h", []Limit{Per(100, 30*time.Minute)}},
		{"4/1.5s", []Limit{Per(4, 1500*time.Millisecond)}},
		{"10/+2s", []Limit{Per(10, 2*time.Second)}},
	} {
		got, err := ParseLimits(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseLimits(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

func TestParseLimitsErrors(t *testing.T) {
	for _, c := range []struct{ in, msg string }{
		{"", `ratewindow: invalid limit: item 1 of "": "" is not <count>/<window>, such as 10/s or 5/15m`},
		{"10", `ratewindow: invalid limit: item 1 of "10": "10" is not <count>/<window>, such as 10/s or 5/15m`},
		{"10/s,", `ratewindow: invalid limit: item 2 of "10/s,": "" is not <count>/<window>, such as 10/s or 5/15m`},
		{"x/s", `ratewindow: invalid limit: item 1 of "x/s": count "x" in "x/s" is not a whole number above 0`},
		{"0/s", `ratewindow: invalid limit: item 1 of "0/s": count "0" in "0/s" is not a whole number above 0`},
		{"-1/s", `ratewindow: invalid limit: item 1 of "-1/s": count "-1" in "-1/s" is not a whole number above 0`},
		{"10/x", `ratewindow: invalid limit: item 1 of "10/x": window "x" in "10/x": want a unit (ms, s, m, h, d) or a duration such as 15m`},
		{"10/", `ratewindow: invalid limit: item 1 of "10/": window "" in "10/": empty; want a unit (ms, s, m, h, d) or a duration such as 15m`},
		{"10/-5s", `ratewindow: invalid limit: item 1 of "10/-5s": window "-5s" in "10/-5s": must be above 0, such as 15m`},
		{"10/0s", `ratewindow: invalid limit: item 1 of "10/0s": window "0s" in "10/0s": must be above 0, such as 15m`},
		{"10/0", `ratewindow: invalid limit: item 1 of "10/0": window "0" in "10/0": must be above 0, such as 15m`},
		{"10/0h0m", `ratewindow: invalid limit: item 1 of "10/0h0m": window "0h0m" in "10/0h0m": must be above 0, such as 15m`},
		{"10/0d", `ratewindow: invalid limit: item 1 of "10/0d": window "0d" in "10/0d": must be above 0, such as 1d`},
		{"10/-1d", `ratewindow: invalid limit: item 1 of "10/-1d": window "-1d" in "10/-1d": must be above 0, such as 1d`},
		{"10/500us", `ratewindow: invalid limit: item 1 of "10/500us": window 500µs must be from 1ms to MaxWindow (8784h0m0s)`},
		{"10/.5d", `ratewindow: invalid limit: item 1 of "10/.5d": window ".5d" in "10/.5d": want a whole number of days, such as 2d, or hours, such as 36h`},
		{"10/.s", `ratewindow: invalid limit: item 1 of "10/.s": window ".s" in "10/.s": want a unit (ms, s, m, h, d) or a duration such as 15m`},
		{"99999999999999999999/s", `ratewindow: invalid limit: item 1 of "99999999999999999999/s": count "99999999999999999999" in "99999999999999999999/s" overflows a 64-bit integer (a sliding log holds at most MaxLogCount, ` + strconv.Itoa(MaxLogCount) + `)`},
		{"10/s 20/m", `ratewindow: invalid limit: item 1 of "10/s 20/m": "10/s 20/m" holds more than one limit: separate them with commas, as in "10/s, 1000/h"`},
		{"10/s, 5/m 1/h", `ratewindow: invalid limit: item 2 of "10/s, 5/m 1/h": "5/m 1/h" holds more than one limit: separate them with commas, as in "10/s, 1000/h"`},
		{"10/s, 20/s", `ratewindow: invalid limit: limits #0 and #1 would share storage (two sliding-log limits with the window 1s) (in "10/s, 20/s")`},
	} {
		got, err := ParseLimits(c.in)
		if got != nil || !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("ParseLimits(%q) = %v, %v; want an ErrInvalidLimit", c.in, got, err)
			continue
		}
		if err.Error() != c.msg {
			t.Errorf("ParseLimits(%q):\n got %s\nwant %s", c.in, err, c.msg)
		}
	}
}
