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
// denial, an open breaker's refusal) yields the processor (runtime.Gosched).
// A goroutine deciding in a loop on such answers would otherwise hold it
// for a scheduler slice (10ms) while the goroutines behind it, their timers
// and Redis's replies wait: in a flood of 64 or 256 goroutines on a denied
// hot key and 200 on keys of their own, beside two busy loops, the slowest
// decision took 0.6-1.0s of a 100ms timeout; 102-116ms with a yield every
// 128th answer. Every 64th did as well, but the 1% of answers that yield
// then made the p99 of a flood on one key 1ms (1-4µs at 128); every 256th
// let the slowest reach 130ms, every 1,024th 480ms.
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
