package core

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestBlock checks Limiter.Block on every backend with a frozen clock: a
// blocked key is denied under any limits with RetryAfter = the time left,
// nothing is recorded, a later Block never shortens an earlier one, Wait
// is placed after it, Reset lifts it, and every stored key has a TTL.
func TestBlock(t *testing.T) {
	ctx := context.Background()
	ms := time.Millisecond
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"denied under any limits, nothing recorded", func(t *testing.T, e *env) {
			lim := PerMinute(5)
			if r, err := e.lim.Allow(ctx, "k", lim); err != nil || !r.Allowed {
				t.Fatalf("before: %+v %v", r, err)
			}
			if err := e.lim.Block(ctx, "k", 10*time.Second); err != nil {
				t.Fatal(err)
			}
			for _, l := range []Limit{lim, PerHour(1000).With(SlidingBuckets), PerSecond(3).With(SlidingCounter)} {
				r, err := e.lim.Allow(ctx, "k", l)
				e.expect("allow "+l.String(), r, err, want{false, 0, 10 * time.Second, max(10*time.Second, r.ResetAfter)})
			}
			r, err := e.lim.Peek(ctx, "k", lim)
			e.expect("peek", r, err, want{false, 0, 10 * time.Second, time.Minute})
			e.advance(4 * time.Second)
			r, err = e.lim.AllowN(ctx, "k", 2, lim)
			e.expect("6s left", r, err, want{false, 0, 6 * time.Second, 56 * time.Second})
			// a cost that never fits still says never
			r, err = e.lim.AllowN(ctx, "k", 6, lim)
			if err != nil || !r.Never() {
				t.Fatalf("cost above Count while blocked: %+v %v", r, err)
			}
			e.advance(6 * time.Second)
			// only the unit from before the block is counted
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("after the block", r, err, want{true, 3, 0, time.Minute})
		}},
		{"a later block never shortens an earlier one", func(t *testing.T, e *env) {
			lim := PerMinute(5)
			if err := e.lim.Block(ctx, "k", 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := e.lim.Block(ctx, "k", time.Second); err != nil {
				t.Fatal(err)
			}
			r, err := e.lim.Allow(ctx, "k", lim)
			e.expect("shorter block", r, err, want{false, 0, 30 * time.Second, 30 * time.Second})
			e.advance(10 * time.Second)
			if err := e.lim.Block(ctx, "k", time.Minute); err != nil {
				t.Fatal(err)
			}
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("longer block", r, err, want{false, 0, time.Minute, time.Minute})
		}},
		{"Reset lifts it", func(t *testing.T, e *env) {
			lim := PerMinute(5)
			if err := e.lim.Block(ctx, "k", time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := e.lim.Reset(ctx, "k", lim); err != nil {
				t.Fatal(err)
			}
			r, err := e.lim.Allow(ctx, "k", lim)
			e.expect("after Reset", r, err, want{true, 4, 0, time.Minute})
		}},
		{"Wait is placed after it, or fails at once past the deadline", func(t *testing.T, e *env) {
			w := e.recordWaits()
			log, buckets := Per(5, time.Second), Per(5, time.Second).With(SlidingBuckets)
			// past the deadline: ErrWaitExceedsDeadline at once, nothing
			// recorded (a block far beyond a deadline far beyond any round
			// trip, so that a loaded machine cannot turn it into the
			// context's own error)
			if err := e.lim.Block(ctx, "d", 20*time.Second); err != nil {
				t.Fatal(err)
			}
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := e.lim.Wait(dctx, "d", log); !errors.Is(err, ErrWaitExceedsDeadline) {
				t.Fatalf("Wait past the deadline: %v", err)
			}
			if n := e.logLen("d", log); n != 0 {
				t.Fatalf("log holds %d units after a Wait past the deadline, want 0", n)
			}
			// without a deadline: placed after the block
			if err := e.lim.Block(ctx, "k", 30*ms); err != nil {
				t.Fatal(err)
			}
			if err := e.lim.Wait(ctx, "k", log); err != nil {
				t.Fatal(err)
			}
			if got := w.get("k"); len(got) != 1 || got[0] != 30*ms {
				t.Fatalf("waits %v, want [30ms]", got)
			}
			// a polling algorithm is told to retry after the block: past
			// the deadline, it gives up at once
			if err := e.lim.Block(ctx, "p", 10*time.Second); err != nil {
				t.Fatal(err)
			}
			dctx2, cancel2 := context.WithTimeout(ctx, time.Second)
			defer cancel2()
			if err := e.lim.Wait(dctx2, "p", buckets); !errors.Is(err, ErrWaitExceedsDeadline) {
				t.Fatalf("polling Wait: %v", err)
			}
		}},
		{"another replica honours it", func(t *testing.T, e *env) {
			if e.rdb == nil {
				t.Skip("one process: no replica") // the memory backend is per process
			}
			other, err := New(e.rdb, WithClock(e.clock.Now), WithPrefix(e.prefix), WithTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := e.lim.Block(ctx, "k", 10*time.Second); err != nil {
				t.Fatal(err)
			}
			r, err := other.Allow(ctx, "k", PerMinute(100))
			e.expect("the other replica", r, err, want{false, 0, 10 * time.Second, 10 * time.Second})
		}},
		{"bad input", func(t *testing.T, e *env) {
			for _, c := range []struct {
				key  string
				d    time.Duration
				want error
			}{
				{"", time.Second, ErrInvalidKey},
				{"k", 0, ErrInvalidDuration},
				{"k", -time.Second, ErrInvalidDuration},
				{"k", MaxBlock + time.Microsecond, ErrInvalidDuration},
			} {
				if err := e.lim.Block(ctx, c.key, c.d); !errors.Is(err, c.want) {
					t.Errorf("Block(%q, %s): %v, want %v", c.key, c.d, err, c.want)
				}
			}
			if keys := e.storedKeys(); len(keys) != 0 {
				t.Fatalf("bad input stored %v", keys)
			}
			if err := e.lim.Block(ctx, "k", MaxBlock); err != nil {
				t.Fatalf("MaxBlock: %v", err)
			}
			r, err := e.lim.Allow(ctx, "k", PerSecond(1))
			e.expect("MaxBlock", r, err, want{false, 0, MaxBlock, MaxBlock})
		}},
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					c.run(t, b.new(t))
				})
			}
		})
	}
}

// TestBlockDenyCache: a denial by a block is cached like any other, until
// the block ends.
func TestBlockDenyCache(t *testing.T) {
	e := backends()[2].new(t) // real Redis
	clock := e.clock
	var hits int
	l, err := New(e.rdb, WithClock(clock.Now), WithPrefix(e.prefix), WithObserver(func(ev Event) {
		if ev.CacheHit {
			hits++
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Block(ctx, "k", time.Minute); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if r, err := l.Allow(ctx, "k", PerSecond(10)); err != nil || r.Allowed || r.RetryAfter > time.Minute {
			t.Fatalf("blocked: %+v %v", r, err)
		}
	}
	if hits != 2 {
		t.Fatalf("%d deny-cache hits, want 2", hits)
	}
	e.advance(time.Minute)
	if r, err := l.Allow(ctx, "k", PerSecond(10)); err != nil || !r.Allowed || r.BackendErr != nil {
		t.Fatalf("after the block: %+v %v", r, err)
	}
	// a denial cached before a Block hides it not: Block forgets it
	lim := Per(1, time.Hour)
	for range 2 {
		if _, err := l.Allow(ctx, "quota", lim); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Block(ctx, "quota", 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx, "quota", lim); err != nil || r.Allowed || !r.blocked || r.RetryAfter != 2*time.Hour {
		t.Fatalf("after Block(2h) of a denied key: %+v %v, want blocked, RetryAfter 2h", r, err)
	}
}
