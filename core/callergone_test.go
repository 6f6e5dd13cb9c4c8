package core

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// lateContext is a context whose deadline passed while its timer has not
// ended it yet.
type lateContext struct{ context.Context }

func (lateContext) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestCallerGone: a read cut at the caller's deadline a moment before the
// context's timer ends it is the caller's deadline, not a failure of Redis
// (no health check, the node stays up), and the caller is told
// context.DeadlineExceeded.
func TestCallerGone(t *testing.T) {
	r := &fakeRemote{ping: errors.New("no health check expected")}
	g := &guard{next: r, remote: r, budget: 100 * time.Millisecond}
	o, err := g.call(lateContext{context.Background()}, &store.Request{Key: "k"}, callTries, func() error {
		return fmt.Errorf("read: %w", os.ErrDeadlineExceeded)
	})
	if o != abandoned || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("outcome %d, error %v; want abandoned, the caller's deadline", o, err)
	}
	if g.one.down.Load() != nil {
		t.Fatal("the node went down")
	}
}

// TestEndedContextDecidesNothing: a caller whose context has ended gets
// ctx's error and no decision from every backend, and nothing is recorded:
// the memory Limiter decided, recorded, and its Wait said proceed, so a
// request whose client had left reached the handler.
func TestEndedContextDecidesNothing(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := b.new(t)
			for _, alg := range algorithms {
				lim := Per(5, time.Minute).With(alg)
				key := "k" + alg.String()
				if r, err := e.lim.AllowN(ended, key, 2, lim); !errors.Is(err, context.Canceled) || r.Allowed {
					t.Errorf("%v: AllowN: %+v, %v; want context.Canceled and no decision", alg, r, err)
				}
				if err := e.lim.WaitN(ended, key, 2, lim); !errors.Is(err, context.Canceled) {
					t.Errorf("%v: WaitN: %v; want context.Canceled", alg, err)
				}
				r, err := e.lim.Peek(context.Background(), key, lim)
				e.expect(alg.String()+": after", r, err, want{true, 5, 0, 0})
			}
		})
	}
}

// TestEndedContextBreakerOpen: with the breaker open, a caller whose
// context ended still gets ctx's error, not the failure mode's answer
// (FailOpen admitted it, and a Wait said proceed).
func TestEndedContextBreakerOpen(t *testing.T) {
	p := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithDenyCache(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := PerMinute(5)
	p.Kill(t)
	l.Allow(ctx, "k", lim) // refused: the node is down at once
	if r, _ := l.Allow(ctx, "k", lim); !errors.Is(r.BackendErr, ErrCircuitOpen) {
		t.Fatalf("the breaker did not open: %v", r.BackendErr)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if r, err := l.Allow(ended, "k", lim); !errors.Is(err, context.Canceled) || r.Allowed {
		t.Errorf("Allow: %+v, %v; want context.Canceled and no decision", r, err)
	}
	if err := l.Wait(ended, "k", lim.With(SlidingBuckets)); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait (polling): %v; want context.Canceled", err)
	}
}
