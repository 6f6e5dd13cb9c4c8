package core

import (
	"runtime"
	"sync/atomic"
)

// breaker stops calls to a failing Redis: after breakerFailures failures in
// a row it opens for breakerPause; then one call probes, and its success
// closes the breaker, its failure opens it for another pause.
//
// Failures in a row are failures in sequence: a call sent before the last
// counted failure ended saw the same moment of Redis and is not counted, so
// concurrent calls timing out together are one failure.
type breaker struct {
	failures  atomic.Int32
	lastEnd   atomic.Int64 // ns on the store's clock: when the last counted failure ended
	openUntil atomic.Int64 // ns on the store's clock; 0: closed
	probing   atomic.Bool
	silence   atomic.Int64  // when Redis fell silent (guard.silentSince)
	refused   atomic.Uint32 // calls refused while open (see instantYield)
}

// instantYield: every instantYield-th answer made without I/O (a cached
// denial, an open breaker's refusal) yields the processor: a goroutine
// deciding in a loop on them held it for a scheduler slice (10ms) while the
// others, their timers and Redis's replies waited. Flooding a denied hot key
// with 64 or 256 goroutines, and 200 more on keys of their own, beside two
// busy loops: the slowest decision took 0.6-1.0s of a 100ms timeout, and
// 102-116ms yielding every 128th answer (every 64th as well, but a flood's
// p99 on one key was 1ms, not 1-4µs; every 256th 130ms, 1,024th 480ms).
const instantYield = 128

const (
	breakerFailures = 3
	breakerPause    = int64(250e6) // ns on the store's clock
)

// allow reports whether a call may go at now (ns), and whether it is the
// probe, which must end in success, failure or abandon.
func (b *breaker) allow(now int64) (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	if now < until {
		if b.refused.Add(1)%instantYield == 0 {
			runtime.Gosched()
		}
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
// it overlapped the last counted failure; the probe's failure opens the
// breaker again whenever it was sent (its start, backdated to its budget's,
// may precede the failure that opened it: it ended no probe, and every
// later call was refused for good).
func (b *breaker) failure(start, now int64, probe bool) {
	last := b.lastEnd.Load()
	switch {
	case probe:
		b.lastEnd.CompareAndSwap(last, max(last, now))
	case start < last || !b.lastEnd.CompareAndSwap(last, now):
		return // the same moment of Redis as a failure already counted
	}
	if b.failures.Add(1) >= breakerFailures || probe {
		b.openUntil.Store(now + breakerPause)
		b.probing.Store(false)
	}
}

// abandon ends a probe that told nothing: the next call probes instead.
func (b *breaker) abandon() { b.probing.Store(false) }
