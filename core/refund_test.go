package core

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRefund checks Limiter.Refund on every backend and algorithm with a
// frozen clock: the newest units go back, never below empty, Remaining and
// RetryAfter show it at once, every limit gives back, and a refund of the
// units of one decision (CountIf's) takes exactly those.
func TestRefund(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		run  func(t *testing.T, e *env, alg Algorithm)
	}{
		{"the newest units go back; RetryAfter follows", func(t *testing.T, e *env, alg Algorithm) {
			lim := Per(5, time.Minute).With(alg)
			allowN(t, e, 2, lim)
			e.advance(10 * time.Second)
			allowN(t, e, 3, lim)
			// before: full; 4 units fit once 4 have left
			before := map[Algorithm]time.Duration{SlidingLog: 60 * time.Second, SlidingBuckets: 61 * time.Second, SlidingCounter: 98 * time.Second}
			r, err := e.lim.AllowN(ctx, "k", 4, lim)
			e.expect("full", r, err, want{false, 0, before[alg], r.ResetAfter})
			if err := e.lim.Refund(ctx, "k", 3, lim); err != nil {
				t.Fatal(err)
			}
			// after: the 2 units of t0 are left, and leave first
			after := map[Algorithm]time.Duration{SlidingLog: 50 * time.Second, SlidingBuckets: 51 * time.Second, SlidingCounter: 80 * time.Second}
			r, err = e.lim.AllowN(ctx, "k", 4, lim)
			e.expect("refunded", r, err, want{false, 3, after[alg], r.ResetAfter})
			r, err = e.lim.Peek(ctx, "k", lim)
			e.expect("peek", r, err, want{true, 3, 0, r.ResetAfter})
		}},
		{"never below empty", func(t *testing.T, e *env, alg Algorithm) {
			lim := Per(5, time.Minute).With(alg)
			allowN(t, e, 2, lim)
			if err := e.lim.Refund(ctx, "k", 100, lim); err != nil {
				t.Fatal(err)
			}
			r, err := e.lim.Peek(ctx, "k", lim)
			e.expect("after refunding 100 of 2", r, err, want{true, 5, 0, 0})
			allowN(t, e, 5, lim) // the whole Count, no more
			r, err = e.lim.Allow(ctx, "k", lim)
			if err != nil || r.Allowed {
				t.Fatalf("a sixth unit: %+v %v", r, err)
			}
			// a key never seen: nothing to give back, nothing stored
			if err := e.lim.Refund(ctx, "unseen", 1, lim); err != nil {
				t.Fatal(err)
			}
			for _, k := range e.storedKeys() {
				if containsKey(k, "unseen") {
					t.Fatalf("a refund of an unseen key stored %q", k)
				}
			}
		}},
		{"units that left the window are not given back", func(t *testing.T, e *env, alg Algorithm) {
			lim := Per(3, time.Minute).With(alg)
			allowN(t, e, 3, lim)
			e.advance(3 * time.Minute)
			if err := e.lim.Refund(ctx, "k", 3, lim); err != nil {
				t.Fatal(err)
			}
			allowN(t, e, 3, lim)
			if r, err := e.lim.Allow(ctx, "k", lim); err != nil || r.Allowed {
				t.Fatalf("a fourth unit: %+v %v", r, err)
			}
		}},
		{"every limit gives back", func(t *testing.T, e *env, alg Algorithm) {
			limits := []Limit{Per(3, time.Minute).With(alg), Per(10, time.Hour).With(alg)}
			allowN(t, e, 3, limits...)
			if err := e.lim.Refund(ctx, "k", 2, limits...); err != nil {
				t.Fatal(err)
			}
			r, err := e.lim.Peek(ctx, "k", limits[0])
			e.expect("minute", r, err, want{true, 2, 0, r.ResetAfter})
			r, err = e.lim.Peek(ctx, "k", limits[1])
			e.expect("hour", r, err, want{true, 9, 0, r.ResetAfter})
		}},
		{"a decision's own units (CountIf)", func(t *testing.T, e *env, alg Algorithm) {
			lim := Per(2, time.Minute).With(alg)
			_, at, err := e.lim.decide(ctx, OpAllow, "", "k", 1, []Limit{lim}, nil)
			if err != nil || at == 0 {
				t.Fatalf("decide: at %d, %v", at, err)
			}
			e.advance(10 * time.Second)
			allowN(t, e, 1, lim)
			if err := e.lim.refundAt(ctx, "k", 1, []Limit{lim}, at, false); err != nil {
				t.Fatal(err)
			}
			allowN(t, e, 1, lim)
			// the log and buckets hold the two units of t10 only: full
			// until t10 leaves (the unit of t0 would have left at 60s)
			retry := map[Algorithm]time.Duration{SlidingLog: 60 * time.Second, SlidingBuckets: 61 * time.Second, SlidingCounter: 80 * time.Second}[alg]
			r, err := e.lim.Allow(ctx, "k", lim)
			e.expect("full again", r, err, want{false, 0, retry, r.ResetAfter})
			// a time with no units of its own gives nothing back
			if err := e.lim.refundAt(ctx, "k", 1, []Limit{lim}, at-1, false); err != nil {
				t.Fatal(err)
			}
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("still full", r, err, want{false, 0, retry, r.ResetAfter})
		}},
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, alg := range algorithms {
				for _, c := range cases {
					t.Run(alg.String()+"/"+c.name, func(t *testing.T) {
						e := b.new(t)
						c.run(t, e, alg)
						e.checkTTLs(c.name)
					})
				}
			}
		})
	}
}

// TestRefundInvalid: bad input is rejected before any call, and nothing
// is given back.
func TestRefundInvalid(t *testing.T) {
	ctx := context.Background()
	e := backends()[0].new(t)
	lim := PerMinute(3)
	allowN(t, e, 2, lim)
	for _, c := range []struct {
		name   string
		key    string
		n      int64
		limits []Limit
		want   error
	}{
		{"empty key", "", 1, []Limit{lim}, ErrInvalidKey},
		{"zero units", "k", 0, []Limit{lim}, ErrInvalidCost},
		{"negative units", "k", -1, []Limit{lim}, ErrInvalidCost},
		{"no limits", "k", 1, nil, ErrNoLimits},
		{"invalid limit", "k", 1, []Limit{lim, {Count: 0, Window: time.Second}}, ErrInvalidLimit},
	} {
		if err := e.lim.Refund(ctx, c.key, c.n, c.limits...); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	r, err := e.lim.Peek(ctx, "k", lim)
	e.expect("nothing given back", r, err, want{true, 1, 0, time.Minute})
}

func allowN(t *testing.T, e *env, n int64, limits ...Limit) {
	t.Helper()
	r, err := e.lim.AllowN(context.Background(), "k", n, limits...)
	if err != nil || !r.Allowed || r.BackendErr != nil {
		t.Fatalf("AllowN(%d): %+v %v", n, r, err)
	}
}

func containsKey(stored, key string) bool {
	for i := 0; i+len(key) <= len(stored); i++ {
		if stored[i:i+len(key)] == key {
			return true
		}
	}
	return false
}
