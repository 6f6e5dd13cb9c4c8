package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// With the default options, a burst of simultaneous Waits from three
// replicas is throttled, not waved through: every caller's reservation is
// recorded in the log. (Bounded by the 100ms decision timeout, most of such
// a burst timed out and failed open.) On a loaded machine a reservation's
// reply may come after its call's bound (WithWaitTimeout): the Wait asks
// again, and the first, recorded, holds a slot until it leaves the window,
// so a caller may find no slot before its deadline; the log is full then,
// never over.
func TestWaitBurstWithDefaultOptions(t *testing.T) {
	srv := redistest.New(t)
	prefix := uniquePrefix(t)
	// a window far longer than the burst: no unit leaves (and is trimmed)
	// before the count below, however slow the machine
	lim := PerMinute(3000)
	var wg sync.WaitGroup
	errs := make(chan error, 3*1000)
	var failures sync.Map // failure-mode answers: Redis errors, by text
	observe := func(ev Event) {
		if ev.Failed {
			failures.Store(ev.Err.Error(), true)
		}
	}
	for i := 0; i < 3; i++ {
		l, err := New(srv.Client(t), WithPrefix(prefix), WithObserver(observe))
		if err != nil {
			t.Fatal(err)
		}
		for g := 0; g < 1000; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := l.Wait(ctx, "burst", lim); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	late := int64(0) // Waits whose slot lay past their deadline
	for err := range errs {
		if !errors.Is(err, ErrWaitExceedsDeadline) {
			t.Fatalf("Wait: %v", err)
		}
		late++
	}
	failures.Range(func(k, _ any) bool { t.Errorf("answered by the failure mode: %v", k); return true })
	n, err := storedLogLen(context.Background(), srv.Client(t), storageKey(keyTag(prefix, "burst"), lim))
	// the log full: a Wait that found no slot lost it to a reservation
	// recorded whose reply came too late, never to nothing
	if err != nil || n != 3000 {
		t.Fatalf("reservations recorded: %d %v, want 3000: the rest went through unthrottled, or a slot was lost", n, err)
	}
	if late > 0 {
		t.Logf("%d Waits found no slot before their deadline, their slots held by reservations whose replies came too late", late)
	}
}
