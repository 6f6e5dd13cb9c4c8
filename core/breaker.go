package core

import "sync/atomic"

// breaker stops calls to a failing Redis: after breakerFailures failures in
// a row it opens for breakerPause, answering every decision with the
// failure mode at once; then a single call probes Redis, and a success
// closes it again while a failure opens it for another pause.
type breaker struct {
	failures  atomic.Int32
	openUntil atomic.Int64 // ns on the process clock; 0: closed
	probing   atomic.Bool
}

const (
	breakerFailures = 3
	breakerPause    = int64(250e6) // ns
)

// allow reports whether a call may go to Redis at now (ns), and whether
// that call is the probe of an open breaker. The probe must end in success,
// failure or abandon.
func (b *breaker) allow(now int64) (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	if now < until {
		return false, false
	}
	ok = b.probing.CompareAndSwap(false, true) // one probe at a time
	return ok, ok
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

// abandon ends a probe that told nothing about Redis (its caller gave up
// first): the next call probes instead.
func (b *breaker) abandon() { b.probing.Store(false) }
