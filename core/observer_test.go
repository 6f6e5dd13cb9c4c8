package core

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestObserverEvents: one event per call, with the outcome, the binding
// limit, cache hits, and failures with the failure mode that answered.
func TestObserverEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.New(t)
	l, rec := faultLimiter(t, srv.Client(t), FailOpen, 1, WithTimeout(patient))
	perSec, perMin := PerSecond(2), PerMinute(3)

	silent := redis.NewClient(&redis.Options{Addr: redistest.Silent(t)})
	t.Cleanup(func() { go silent.Close() })
	failing := func(mode FailureMode) (*Limiter, *obsRecorder) {
		return faultLimiter(t, silent, mode, 0.5, WithTimeout(20*time.Millisecond))
	}
	open, openRec := failing(FailOpen)
	closed, closedRec := failing(FailClosed)
	local, localRec := failing(FailLocal)

	cases := []struct {
		name string
		rec  *obsRecorder
		call func() error
		want Event // Latency and Err are checked apart
		err  bool
	}{
		{"allowed", rec, func() error { _, err := l.Allow(ctx, "k", perSec, perMin); return err },
			Event{Op: OpAllow, Key: "k", Result: Result{Allowed: true, Limit: perSec, Remaining: 1, ResetAfter: time.Second}}, false},
		{"allowed again", rec, func() error { _, err := l.Allow(ctx, "k", perSec, perMin); return err },
			Event{Op: OpAllow, Key: "k", Result: Result{Allowed: true, Limit: perSec, Remaining: 0, ResetAfter: time.Second}}, false},
		{"peek", rec, func() error { _, err := l.Peek(ctx, "k", perMin); return err },
			Event{Op: OpPeek, Key: "k", Result: Result{Allowed: true, Limit: perMin, Remaining: 1, ResetAfter: time.Minute}}, false},
		{"wait", rec, func() error { return l.Wait(ctx, "w", perMin) },
			Event{Op: OpWait, Key: "w", Result: Result{Allowed: true, Limit: perMin}}, false},
		{"wait too long", rec, func() error {
			l.AllowN(ctx, "w2", 3, perMin)
			rec.take()
			c, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return l.Wait(c, "w2", perMin)
		}, Event{Op: OpWait, Key: "w2", Result: Result{Allowed: false, Limit: perMin}}, true},
		{"fail-open", openRec, func() error { r, err := open.Allow(ctx, "k", perMin); return decisionErr(r, err) },
			Event{Op: OpAllow, Key: "k", Failed: true, Fallback: FailOpen, Result: Result{Allowed: true, Limit: perMin, Remaining: 2}}, true},
		{"fail-closed", closedRec, func() error { r, err := closed.Allow(ctx, "k", perMin); return decisionErr(r, err) },
			Event{Op: OpAllow, Key: "k", Failed: true, Fallback: FailClosed, Result: Result{Limit: perMin, RetryAfter: time.Second, ResetAfter: time.Second, violated: 1}}, true},
		{"fail-local", localRec, func() error { r, err := local.Allow(ctx, "k", perMin); return decisionErr(r, err) },
			Event{Op: OpAllow, Key: "k", Failed: true, Fallback: FailLocal, Result: Result{Allowed: true, Limit: Limit{Count: 1, Window: time.Minute}, Remaining: 0, ResetAfter: time.Minute}}, true},
		{"wait, fail-open proceeds", openRec, func() error { return open.Wait(ctx, "w", perMin) },
			Event{Op: OpWait, Key: "w", Failed: true, Fallback: FailOpen, Result: Result{Allowed: true, Limit: perMin}}, true},
		{"wait, fail-closed stops", closedRec, func() error { return closed.Wait(ctx, "w", perMin) },
			Event{Op: OpWait, Key: "w", Failed: true, Fallback: FailClosed, Result: Result{Limit: perMin}}, true},
	}
	for _, c := range cases {
		err := c.call()
		ev := c.rec.take()
		if len(ev) != 1 {
			t.Fatalf("%s: %d events", c.name, len(ev))
		}
		got := ev[0]
		if got.Latency <= 0 || (got.Err != nil) != c.err || (c.want.Op != OpWait && got.Err != err) {
			t.Fatalf("%s: latency %v, error %v (returned %v)", c.name, got.Latency, got.Err, err)
		}
		if got.Failed && got.Result.BackendErr == nil {
			t.Fatalf("%s: a failure-mode answer without Result.BackendErr", c.name)
		}
		if c.want.Op == OpWait && got.Failed && c.want.Fallback == FailOpen && err != nil {
			t.Fatalf("%s: Wait returned %v, want nil (fail-open)", c.name, err)
		}
		got.Latency, got.Err, got.Result.BackendErr = 0, nil, nil
		if got.Op == OpWait {
			got.Result.RetryAfter = 0
		}
		// on Redis's clock, time passes between two calls
		if d := c.want.Result.ResetAfter - got.Result.ResetAfter; d > 0 && d < time.Second {
			got.Result.ResetAfter = c.want.Result.ResetAfter
		}
		if got != c.want {
			t.Fatalf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}

	// denied, then the same from the cache with its time counted down
	l.Allow(ctx, "d", perMin)
	l.AllowN(ctx, "d", 2, perMin)
	rec.take()
	r1, _ := l.Allow(ctx, "d", perSec, perMin)
	r2, _ := l.Allow(ctx, "d", perSec, perMin)
	ev := rec.take()
	if len(ev) != 2 || ev[0].CacheHit || !ev[1].CacheHit || ev[0].Result != r1 || ev[1].Result != r2 {
		t.Fatalf("denied then cached: %+v", ev)
	}
	if r1.Allowed || r1.Limit != perMin || r2.Limit != perMin || r2.RetryAfter > r1.RetryAfter || r2.RetryAfter <= 0 {
		t.Fatalf("binding limit or retry: %+v then %+v", r1, r2)
	}
	for _, e := range ev {
		if e.Failed || e.Err != nil || e.Latency <= 0 {
			t.Fatalf("event %+v", e)
		}
	}

	// errors of the call itself are not decisions: no event
	l.Allow(ctx, "", perSec)
	l.AllowN(ctx, "k", 0, perSec)
	if ev := rec.take(); len(ev) != 0 {
		t.Fatalf("bad input made events: %+v", ev)
	}
}

// TestObserverNoAllocs: an observer adds no allocation to a decision, and
// neither does its absence.
func TestObserverNoAllocs(t *testing.T) {
	ctx := context.Background()
	lim := PerMinute(1 << 30).With(SlidingCounter)
	var n int
	for _, c := range []struct {
		name string
		l    *Limiter
	}{
		{"none", NewMemory()},
		{"observer", NewMemory(WithObserver(func(e Event) { n++ }))},
	} {
		c.l.Allow(ctx, "k", lim)
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := c.l.Allow(ctx, "k", lim); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", c.name, allocs)
		}
	}
	if n == 0 {
		t.Fatal("the observer was not called")
	}
}

// BenchmarkObserver is one in-memory decision without an observer and
// with one: the hook costs two clock reads and no allocation.
func BenchmarkObserver(b *testing.B) {
	ctx := context.Background()
	lim := PerMinute(1 << 30).With(SlidingCounter)
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"none", nil},
		{"noop", []Option{WithObserver(func(Event) {})}},
	} {
		b.Run(c.name, func(b *testing.B) {
			l := NewMemory(c.opts...)
			b.ReportAllocs()
			for b.Loop() {
				l.Allow(ctx, "k", lim)
			}
		})
	}
}

// decisionErr is Allow's error when it made no decision, else the failure
// its failure mode answered. A Redis failure returned as Allow's error
// breaks the contract.
func decisionErr(r Result, err error) error {
	if err != nil && isBackendError(err) {
		return fmt.Errorf("Allow returned the backend error %q instead of a decision", err)
	}
	if err != nil {
		return err
	}
	return r.BackendErr
}

func TestOpString(t *testing.T) {
	for _, tc := range []struct {
		op   Op
		want string
	}{
		{OpAllow, "allow"},
		{OpPeek, "peek"},
		{OpWait, "wait"},
		{OpRefused, "refused"},
		{Op(4), "Op(4)"},
		{Op(255), "Op(255)"},
	} {
		if got := tc.op.String(); got != tc.want {
			t.Errorf("Op(%d).String() = %q, want %q", uint8(tc.op), got, tc.want)
		}
	}
}
