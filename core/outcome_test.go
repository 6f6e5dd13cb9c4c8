package core

import (
	"errors"
	"testing"
)

// TestEventOutcome: the outcome label of each kind of Event, which the
// prometheus and otel observers share.
func TestEventOutcome(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		ev   Event
		want string
	}{
		{Event{Op: OpAllow, Result: Result{Allowed: true}}, "allowed"},
		{Event{Op: OpAllow}, "denied"},
		{Event{Op: OpWait, Result: Result{Allowed: true}}, "allowed"},
		{Event{Op: OpWait, Err: ErrWaitExceedsDeadline}, "denied"}, // a Wait's error is its answer
		{Event{Op: OpAllow, Err: boom}, "error"},                   // no decision of Redis's
		{Event{Op: OpAllow, Failed: true, Result: Result{Allowed: true}}, "error"},
		{Event{Op: OpAllow, Shed: true, Err: ErrShed}, "shed"},
		{Event{Op: OpPeek, Result: Result{Allowed: true}}, ""},
		{Event{Op: OpRefused}, ""},
	} {
		if got := tc.ev.Outcome(); got != tc.want {
			t.Errorf("%+v: Outcome %q, want %q", tc.ev, got, tc.want)
		}
	}
}
