package core

import "sync/atomic"

// breaker stops calls to a failing Redis: after breakerFailures failures in
// a row it opens for breakerPause, answering every decision with the
// failure mode at once; then a single call probes Redis, and a success
// closes it again.
type breaker struct {
	failures  atomic.Int32
	openUntil atomic.Int64 // ns on the Limiter's clock; 0: closed
	probing   atomic.Bool
}

const (
	breakerFailures = 3
	breakerPause    = int64(250e6) // ns
)

// allow reports whether a call may go to Redis at now (ns).
func (b *breaker) allow(now int64) bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	if now < until {
		return false
	}
	return b.probing.CompareAndSwap(false, true) // one probe at a time
}

func (b *breaker) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
		b.probing.Store(false)
	}
}

func (b *breaker) failure(now int64) {
	if b.failures.Add(1) >= breakerFailures {
		b.openUntil.Store(now + breakerPause)
		b.probing.Store(false)
	}
}
