package core

import "sync/atomic"

// breaker stops calls to a failing Redis: after breakerFailures failures in
// a row (timeouts and connection failures without any reply of Redis since
// the call was sent; never an error that Redis answered) it opens for
// breakerPause, answering every decision with the failure mode at once;
// then a single call probes Redis, and a success closes it again while a
// failure opens it for another pause.
//
// Failures in a row are failures in sequence: a call that was sent before
// the last counted failure ended is not counted, as it saw the same moment
// of Redis. Many concurrent calls timing out together are one failure, so
// a burst of calls at a slow moment (a cold start on a loaded machine) does
// not open the breaker; a Redis that stays silent opens it after
// breakerFailures timeouts, one after the other.
type breaker struct {
	failures  atomic.Int32
	lastEnd   atomic.Int64 // ns on the store's clock: when the last counted failure ended
	openUntil atomic.Int64 // ns on the store's clock; 0: closed
	probing   atomic.Bool
	// lastReply is when (the store's clock) the node last answered a
	// call, for a Cluster master's breaker (see guard.answeredAfter)
	lastReply atomic.Int64
}

const (
	breakerFailures = 3
	breakerPause    = int64(250e6) // ns on the store's clock
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

// failure counts a call sent at start (ns) that failed at now (ns), unless
// it overlapped the last counted failure.
func (b *breaker) failure(start, now int64) {
	last := b.lastEnd.Load()
	if start < last || !b.lastEnd.CompareAndSwap(last, now) {
		return // the same moment of Redis as a failure already counted
	}
	if b.failures.Add(1) >= breakerFailures {
		b.openUntil.Store(now + breakerPause)
		b.probing.Store(false)
	}
}

// abandon ends a probe that told nothing about Redis (its caller gave up
// first): the next call probes instead.
func (b *breaker) abandon() { b.probing.Store(false) }

// replied notes a reply of the node at now, unless a later one is noted
// already (a goroutine preempted between reading the clock and noting it).
func (b *breaker) replied(now int64) {
	for last := b.lastReply.Load(); last < now && !b.lastReply.CompareAndSwap(last, now); last = b.lastReply.Load() {
	}
}
