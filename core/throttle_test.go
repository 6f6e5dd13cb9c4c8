package core_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

func ExampleThrottle() {
	l := core.NewMemory()
	quota := []core.Limit{core.PerHour(2)} // the pricing API's quota
	for i := 1; i <= 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		quote, err := core.Throttle(ctx, l, "pricing-api", quota, func(ctx context.Context) (string, error) {
			return fmt.Sprint("quote ", i), nil // the call to the API
		})
		cancel()
		if errors.Is(err, core.ErrWaitExceedsDeadline) {
			fmt.Println("call", i, "would start after its deadline: not made")
			continue
		}
		fmt.Println(quote)
	}
	// Output:
	// quote 1
	// quote 2
	// call 3 would start after its deadline: not made
}

func TestThrottle(t *testing.T) {
	srv := redistest.New(t)
	l, err := core.New(srv.Client(t), core.WithPrefix(fmt.Sprintf("throttle%d:", time.Now().UnixNano())), core.WithFailureMode(core.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	limits := []core.Limit{core.Per(3, 200*time.Millisecond)}
	recorded := append(limits, core.Per(6, time.Minute)) // a Throttle records its units: 6 spend it
	errAPI := errors.New("the API failed")

	t.Run("calls fn after the wait and returns its result", func(t *testing.T) {
		var (
			calls atomic.Int64
			wg    sync.WaitGroup
			mu    sync.Mutex
			got   = map[int]bool{}
		)
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := core.Throttle(ctx, l, "ok", recorded, func(ctx context.Context) (int, error) {
					calls.Add(1)
					return i, nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[v] = true
				mu.Unlock()
			}()
		}
		wg.Wait()
		if calls.Load() != 6 || len(got) != 6 {
			t.Fatalf("fn called %d times, %d distinct results; want 6 and 6", calls.Load(), len(got))
		}
		// 6 units recorded: the minute's limit is spent (a loaded machine
		// may start the last three later than 200ms out)
		if r, err := l.Peek(ctx, "ok", recorded...); err != nil || r.Allowed || r.Limit != recorded[1] {
			t.Fatalf("peek after 6 calls: %+v %v", r, err)
		}
	})
	t.Run("returns fn's error", func(t *testing.T) {
		v, err := core.Throttle(ctx, l, "fails", limits, func(ctx context.Context) (string, error) {
			return "partial", errAPI
		})
		if v != "partial" || !errors.Is(err, errAPI) {
			t.Fatalf("got %q, %v", v, err)
		}
	})
	cases := []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		l      *core.Limiter
		key    string
		limits []core.Limit
		want   error
	}{
		{"past the deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) },
			l, "full", []core.Limit{core.PerHour(1)}, core.ErrWaitExceedsDeadline},
		{"cancelled", func() (context.Context, context.CancelFunc) {
			c, cancel := context.WithCancel(ctx)
			cancel()
			return c, cancel
		}, l, "cancelled", limits, context.Canceled},
		{"invalid limit", func() (context.Context, context.CancelFunc) { return ctx, func() {} },
			l, "invalid", []core.Limit{core.PerHour(1), core.Per(0, time.Second)}, core.ErrInvalidLimit},
		{"empty key", func() (context.Context, context.CancelFunc) { return ctx, func() {} },
			l, "", limits, core.ErrInvalidKey},
		{"no limits", func() (context.Context, context.CancelFunc) { return ctx, func() {} },
			l, "k", nil, core.ErrNoLimits},
	}
	// fill the hour's one unit of "full" first
	if _, err := core.Throttle(ctx, l, "full", []core.Limit{core.PerHour(1)}, func(context.Context) (int, error) { return 0, nil }); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cctx, cancel := c.ctx()
			defer cancel()
			called := false
			v, err := core.Throttle(cctx, c.l, c.key, c.limits, func(context.Context) (int, error) {
				called = true
				return 42, nil
			})
			if !errors.Is(err, c.want) || v != 0 || called {
				t.Fatalf("got %d, %v, called %v; want 0, %v, not called", v, err, called, c.want)
			}
		})
	}
	t.Run("nil Limiter or function", func(t *testing.T) {
		if _, err := core.Throttle[int](ctx, nil, "k", limits, func(context.Context) (int, error) { return 1, nil }); err == nil {
			t.Fatal("nil Limiter: no error")
		}
		if _, err := core.Throttle[int](ctx, l, "k", limits, nil); err == nil {
			t.Fatal("nil function: no error")
		}
	})
}
