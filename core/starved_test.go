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

// TestStarvedSince: the CPU meter's evidence counts from a budget before a
// call was sent (a wait is counted when its goroutine runs at last), with
// the longest wait it saw.
func TestStarvedSince(t *testing.T) {
	const budget = 10 * time.Second // (so many runnable goroutines never fill it)
	for _, c := range []struct {
		name        string
		long, since int64
		starved     bool
		stall       time.Duration
	}{
		{"no wait seen", 0, 100, false, 0},
		{"a wait seen before", 99, 100, false, 0},
		{"a wait seen at the start", 100, 100, true, 50 * time.Millisecond},
		{"a wait seen since", 150, 100, true, 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &cpuMeter{long: c.long, stall: 50 * time.Millisecond} // no counts kept: the first look notes none
			starved, stall := m.starvedSince(c.since, 200, 20*time.Millisecond, budget)
			if starved != c.starved || stall != c.stall {
				t.Fatalf("starvedSince = %v, %v; want %v, %v", starved, stall, c.starved, c.stall)
			}
		})
	}
}

// TestAliveBefore: a timed-out call of a starved process may have waited
// for the process when Redis answered within a budget and the longest wait
// before it was sent, or when goroutines waited a whole budget to run;
// else a Redis that never answered is no evidence.
func TestAliveBefore(t *testing.T) {
	const (
		budget = 100 * time.Millisecond
		stall  = 50 * time.Millisecond
		sent   = int64(time.Second)
	)
	for _, c := range []struct {
		name  string
		reply int64 // the store's clock of the last reply; 0: never
		alive bool
	}{
		{"never answered", 0, false},
		{"answered within the budget", sent - int64(budget) + 1, true},
		{"answered within the budget and the stall", sent - int64(budget+stall), true},
		{"answered before", sent - int64(budget+stall) - 1, false},
	} {
		t.Run(c.name+", waits of a budget", func(t *testing.T) {
			r := &fakeRemote{Remote: redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "alive:")}
			r.reply.Store(c.reply)
			g := &guard{next: r, remote: r, budget: budget}
			if !g.aliveBefore(attempt{sent: sent, br: &g.br}, budget) {
				t.Fatal("aliveBefore = false: a goroutine waited a whole budget to run")
			}
		})
		t.Run(c.name, func(t *testing.T) {
			r := &fakeRemote{Remote: redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "alive:")}
			r.reply.Store(c.reply)
			g := &guard{next: r, remote: r, budget: budget}
			if got := g.aliveBefore(attempt{sent: sent, br: &g.br}, stall); got != c.alive {
				t.Fatalf("aliveBefore = %v, want %v", got, c.alive)
			}
		})
	}
}

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
