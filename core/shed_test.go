package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/redisstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// silentStore is a Redis store whose calls all get no reply: Allow waits
// until the call's deadline and fails as a call that got no reply in time
// does; its health check answers as its fakeRemote says.
type silentStore struct{ *fakeRemote }

func (s silentStore) Allow(ctx context.Context, r store.Request) (store.Decision, error) {
	select {
	case <-time.After(time.Until(r.Deadline)):
	case <-ctx.Done():
		return store.Decision{}, ctx.Err()
	}
	return store.Decision{}, &store.Error{Err: context.DeadlineExceeded}
}

// overloadedStore is a silentStore whose health check's PING is answered:
// Redis is up, and this process does not see the replies in time (a
// process short of CPU), or they are lost.
type overloadedStore struct{ silentStore }

// TestOverloadIsShed: a decision whose calls run out of time while the
// health check finds Redis answering goes again, callTries times in all,
// then is shed, whatever the failure mode: denied, with a BackendErr that
// matches ErrShed and the Retry-After of FailClosed, reported as
// Event.Shed (not Failed), never admitted by FailOpen or FailLocal; the
// node stays up.
func TestOverloadIsShed(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, mode := range []FailureMode{FailOpen, FailClosed, FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			rs := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "shed:")
			fake := overloadedStore{silentStore{&fakeRemote{Remote: rs}}} // its PING answered
			var events []Event
			l, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), WithTimeout(timeout), WithFailureMode(mode), WithLocalShare(1),
				WithObserver(func(e Event) { events = append(events, e) }))
			if err != nil {
				t.Fatal(err)
			}
			l.guard.next, l.guard.remote = fake, fake
			stalls := stall.Start(t)
			start := time.Now()
			r, err := l.Allow(context.Background(), "k", PerMinute(10))
			took := time.Since(start)
			if err != nil || r.Allowed || !errors.Is(r.BackendErr, ErrShed) || r.RetryAfter != time.Second {
				t.Fatalf("%+v %v, want a shed denial", r, err)
			}
			if len(events) != 1 || !events[0].Shed || events[0].Failed || !errors.Is(events[0].Err, ErrShed) {
				t.Fatalf("events %+v, want one Shed event", events)
			}
			if l.guard.one.down.Load() != nil {
				t.Fatal("the node went down")
			}
			beyond(t, stalls, took, callTries*timeout+50*time.Millisecond, "the shed decision")
		})
	}
}

// Reserve is Allow's overload for Wait's reservations.
func (s overloadedStore) Reserve(ctx context.Context, r store.Request, _ int64) (store.Reservation, error) {
	select {
	case <-time.After(time.Until(r.Deadline)):
	case <-ctx.Done():
		return store.Reservation{}, ctx.Err()
	}
	return store.Reservation{}, &store.Error{Err: context.DeadlineExceeded}
}

// TestOverloadedWaitWaits: a Wait whose reservation (or poll) is shed for
// overload is neither let through by FailOpen or FailLocal nor failed by
// FailClosed: it asks again a second later, so that a deadline sooner than that ends it with
// ErrWaitExceedsDeadline, and a cancel with ctx's error.
func TestOverloadedWaitWaits(t *testing.T) {
	for _, c := range []struct {
		mode FailureMode
		alg  Algorithm // a sliding log reserves; the others poll
	}{{FailOpen, SlidingLog}, {FailClosed, SlidingLog}, {FailLocal, SlidingLog},
		{FailOpen, SlidingBuckets}, {FailClosed, SlidingBuckets}, {FailClosed, SlidingCounter}} {
		mode, lim := c.mode, PerMinute(10).With(c.alg)
		t.Run(mode.String()+"/"+c.alg.String(), func(t *testing.T) {
			rs := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "shed-wait:")
			fake := overloadedStore{silentStore{&fakeRemote{Remote: rs}}} // its PING answered
			var events []Event
			l, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), WithWaitTimeout(50*time.Millisecond), WithFailureMode(mode), WithLocalShare(1),
				WithObserver(func(e Event) { events = append(events, e) }))
			if err != nil {
				t.Fatal(err)
			}
			l.guard.next, l.guard.remote = fake, fake
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if err := l.Wait(ctx, "k", lim); !errors.Is(err, ErrWaitExceedsDeadline) {
				t.Fatalf("Wait with its reservation shed: %v, want ErrWaitExceedsDeadline", err)
			}
			// reported as shed, not as a failure the failure mode answered,
			// with the caller's error and the shedding
			if len(events) != 1 {
				t.Fatalf("%d events, want 1", len(events))
			}
			if e := events[0]; e.Op != OpWait || !e.Shed || e.Failed || !errors.Is(e.Err, ErrWaitExceedsDeadline) || !errors.Is(e.Err, ErrShed) {
				t.Fatalf("the Wait's event: %+v, want Shed, not Failed, Err matching ErrWaitExceedsDeadline and ErrShed", e)
			}
			ctx, cancel = context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			if err := l.Wait(ctx, "k", lim); !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait with its reservation shed, then cancelled: %v, want context.Canceled", err)
			}
		})
	}
}

// TestPausedRedisOneTimeout: a decision takes its timeout and the health
// check's silence (twice the timeout) at most, from when it is asked,
// while Redis is paused, and once the health check found it silent the
// failure mode answers at once: 128 goroutines (half on a hot
// key whose cached denial has expired, half on keys of their own) decide
// for a second, on a Client with go-redis's default pool, one with 64
// connections, and a Ring, with and without the deny cache. Each
// goroutine waits 1ms between decisions, as a server's handlers wait for
// their network: goroutines that spin on instant answers (the open
// breaker) keep one another from the CPU for the scheduler's time slices,
// which no bound of the Limiter's can shorten.
func TestPausedRedisOneTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	p1, p2 := redistest.Start(t), redistest.Start(t)
	clients := []struct {
		name  string
		rdb   func() redis.UniversalClient
		addrs []string
	}{
		{"client", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: p1.Addr}) }, []string{p1.Addr}},
		{"client/pool 64", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: p1.Addr, PoolSize: 64}) }, []string{p1.Addr}},
		{"ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": p1.Addr, "b": p2.Addr}})
		}, []string{p1.Addr, p2.Addr}},
	}
	for _, c := range clients {
		for _, cache := range []int{DefaultDenyCacheSize, 0} {
			t.Run(fmt.Sprintf("%s/deny cache %d", c.name, cache), func(t *testing.T) {
				rdb := c.rdb()
				t.Cleanup(func() { go rdb.Close() })
				l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(timeout), WithDenyCache(cache))
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				lim := Per(1, 300*time.Millisecond)
				const goroutines = 128
				for i := range goroutines { // every key has been decided once
					if _, err := l.Allow(ctx, fmt.Sprint("own-", i), lim); err != nil {
						t.Fatal(err)
					}
				}
				for range 2 { // the hot key: allowed, then denied (cached)
					if _, err := l.Allow(ctx, "hot", lim); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(350 * time.Millisecond) // the cached denial expires
				for _, addr := range c.addrs {
					pause := redis.NewClient(&redis.Options{Addr: addr})
					if err := pause.Do(ctx, "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
						t.Fatal(err)
					}
					pause.Close()
				}
				stalls := stall.Start(t)
				end := time.Now().Add(time.Second)
				var wg sync.WaitGroup
				for i := range goroutines {
					key := "hot"
					if i%2 == 1 {
						key = fmt.Sprint("own-", i)
					}
					wg.Go(func() {
						for time.Now().Before(end) {
							start := time.Now()
							r, err := l.Allow(ctx, key, lim)
							if err != nil {
								t.Errorf("%s: %+v %v", key, r, err)
								return
							}
							beyond(t, stalls, time.Since(start), 3*timeout+250*time.Millisecond, key)
							time.Sleep(time.Millisecond)
						}
					})
				}
				wg.Wait()
				time.Sleep(600 * time.Millisecond) // the pause ends before the next case
			})
		}
	}
}
