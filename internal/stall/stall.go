// Package stall measures how late a test process's timers fire: the
// scheduling noise in every time a test records itself. A timing check that
// fails while the meter saw a long stall is inconclusive rather than a
// failure: the machine, not the code under test, moved the times.
package stall

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Meter runs a 1ms timer in a loop and keeps the worst lateness it saw.
type Meter struct {
	worst atomic.Int64 // ns
	once  sync.Once
	stop  chan struct{}
	done  chan struct{}
}

// Start starts a Meter, stopped at t.Cleanup at the latest.
func Start(t testing.TB) *Meter {
	m := &Meter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTimer(time.Millisecond)
		defer tick.Stop()
		for {
			start := time.Now()
			tick.Reset(time.Millisecond)
			select {
			case <-m.stop:
				return
			case <-tick.C:
			}
			if late := int64(time.Since(start) - time.Millisecond); late > m.worst.Load() {
				m.worst.Store(late)
			}
		}
	}()
	t.Cleanup(func() { m.Finish() })
	return m
}

// Worst returns the worst stall seen so far; the meter goes on.
func (m *Meter) Worst() time.Duration { return time.Duration(m.worst.Load()) }

// Finish stops the meter (once) and returns the worst stall it saw.
func (m *Meter) Finish() time.Duration {
	m.once.Do(func() { close(m.stop) })
	<-m.done
	return time.Duration(m.worst.Load())
}
