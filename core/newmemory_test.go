package core

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestNewMemoryOptions: NewMemory applies WithClock and WithObserver, and
// ignores the options that configure Redis, invalid values included, as
// documented; New refuses each invalid value.
func TestNewMemoryOptions(t *testing.T) {
	t.Parallel()
	invalid := [][]Option{
		{WithTimeout(-1)},
		{WithWaitTimeout(-1)},
		{WithDenyCache(-5)},
		{WithFailureMode(FailLocal), WithLocalShare(2)},
		{WithFailureMode(FailureMode(7))},
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	t.Cleanup(func() { rdb.Close() })
	var opts []Option
	for _, o := range invalid {
		if _, err := New(rdb, o...); err == nil {
			t.Errorf("New(%d options): nil error, want the invalid value refused", len(o))
		}
		opts = append(opts, o...)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var events []Event
	opts = append(opts, WithPrefix(""), WithClock(func() time.Time { return now }),
		WithObserver(func(e Event) { events = append(events, e) }))
	l := NewMemory(opts...)
	if l.cache != nil || l.guard.mode != FailOpen {
		t.Fatalf("NewMemory: deny cache %v, mode %s; want none and fail-open", l.cache, l.guard.mode)
	}
	ctx := context.Background()
	lim := PerMinute(2)
	for i, want := range []Result{
		{Allowed: true, Limit: lim, Remaining: 1, ResetAfter: time.Minute},
		{Allowed: true, Limit: lim, Remaining: 0, ResetAfter: time.Minute},
		{Allowed: false, Limit: lim, Remaining: 0, RetryAfter: time.Minute, ResetAfter: time.Minute},
	} {
		r, err := l.Allow(ctx, "k", lim)
		if err != nil || r.Allowed != want.Allowed || r.Remaining != want.Remaining || r.RetryAfter != want.RetryAfter || r.ResetAfter != want.ResetAfter || r.BackendErr != nil {
			t.Fatalf("decision %d: %+v %v, want %+v (the clock stands still)", i, r, err, want)
		}
	}
	if len(events) != 3 {
		t.Fatalf("the observer heard %d events, want 3", len(events))
	}
	if err := l.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
}
