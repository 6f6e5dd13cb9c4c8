package core

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/redisstore"
)

// lateContext is a context whose deadline passed while its timer has not
// ended it yet.
type lateContext struct{ context.Context }

func (lateContext) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestCallerGone: a read cut at the caller's deadline a moment before the
// context's timer ends it is the caller's deadline, not a failure of Redis
// (the breaker does not count it), and the caller is told
// context.DeadlineExceeded.
func TestCallerGone(t *testing.T) {
	r := &fakeRemote{Remote: redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "gone:")}
	g := &guard{next: r, remote: r, budget: 100 * time.Millisecond}
	a, err := g.begin("k", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := g.end(lateContext{context.Background()}, a, fmt.Errorf("read: %w", os.ErrDeadlineExceeded))
	if k != abandoned || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("kind %d, error %v; want abandoned, the caller's deadline", k, err)
	}
	if n := g.br.failures.Load(); n != 0 {
		t.Fatalf("the breaker counted %d failures", n)
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
