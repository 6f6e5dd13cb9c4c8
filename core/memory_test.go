package core

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
)

// Expired state is dropped: after a flood of distinct keys and one window,
// touching other keys sweeps the old ones away.
func TestMemoryDropsExpiredKeys(t *testing.T) {
	clock := newFakeClock()
	l := NewMemory(WithClock(clock.Now), WithDenyCache(0))
	ms := l.guard.next.(*memstore.Store)
	ctx := context.Background()
	for _, a := range algorithms {
		lim := PerSecond(5).With(a)
		for i := 0; i < 20000; i++ {
			l.Allow(ctx, fmt.Sprint("flood-", a, i), lim)
		}
	}
	if n := heldKeys(ms); n != 60000 {
		t.Fatalf("keys after the flood: %d", n)
	}
	clock.mu.Lock()
	clock.t = clock.t.Add(3 * time.Second)
	clock.mu.Unlock()
	// steady traffic on a few keys sweeps the expired ones
	for i := 0; i < 200000; i++ {
		l.Allow(ctx, fmt.Sprint("live-", i%100), PerSecond(MaxLogCount))
	}
	if n := heldKeys(ms); n > 100+1000 {
		t.Fatalf("keys after the window: %d, want about 100", n)
	}
}

func TestLimitValidateAndString(t *testing.T) {
	cases := []struct {
		limit  Limit
		valid  bool
		str    string
		policy string
	}{
		{PerSecond(10), true, "10 per 1s (sliding-log)", "10-per-1s"},
		{PerMinute(100).With(SlidingBuckets), true, "100 per 1m0s (sliding-buckets)", "100-per-1m"},
		{PerHour(5).With(SlidingCounter), true, "5 per 1h0m0s (sliding-counter)", "5-per-1h"},
		{Per(3, 1500*time.Millisecond), true, "3 per 1.5s (sliding-log)", "3-per-1500ms"},
		{Limit{Name: "burst", Count: 1, Window: time.Second}, true, "1 per 1s (sliding-log)", "burst"},
		{Per(0, time.Second), false, "0 per 1s (sliding-log)", "0-per-1s"},
		{Per(1, time.Microsecond), false, "1 per 1µs (sliding-log)", "1-per-1us"},
		{Limit{Name: strings.Repeat("n", MaxLimitName), Count: 1, Window: time.Second}, true, "1 per 1s (sliding-log)", strings.Repeat("n", MaxLimitName)},
		{Limit{Name: strings.Repeat("n", MaxLimitName+1), Count: 1, Window: time.Second}, false, "1 per 1s (sliding-log)", strings.Repeat("n", MaxLimitName+1)},
	}
	for _, c := range cases {
		if err := c.limit.Validate(); (err == nil) != c.valid {
			t.Errorf("%v: Validate = %v", c.limit, err)
		}
		if s := c.limit.String(); s != c.str {
			t.Errorf("String = %q, want %q", s, c.str)
		}
		if s := c.limit.PolicyName(); s != c.policy {
			t.Errorf("PolicyName = %q, want %q", s, c.policy)
		}
	}
}

// A huge counter limit does not overflow: Count × Window in µs is far
// beyond int64.
func TestMemoryCounterHugeLimit(t *testing.T) {
	l := NewMemory()
	lim := Limit{Count: 1 << 40, Window: time.Hour, Algorithm: SlidingCounter}
	r, err := l.AllowN(context.Background(), "huge", 1<<30, lim)
	if err != nil || !r.Allowed || r.Remaining != 1<<40-1<<30 {
		t.Fatalf("%+v %v", r, err)
	}
}
