package core

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

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

// boundsReads reports whether rdb bounds its network reads by the context's
// deadline (go-redis with ContextTimeoutEnabled). Without it, go-redis
// waits for a silent server until its own ReadTimeout (3s by default, and
// 5s measured for a fresh connection's handshake), whatever the context.
func boundsReads(rdb redis.Scripter) bool {
	switch c := rdb.(type) {
	case *redis.Client: // also NewFailoverClient
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// detach runs f on its own goroutine and returns its outcome, or an error
// wrapping ctx's cause as soon as ctx is done, whichever comes first. An
// abandoned f ends by its client's own timeouts; its outcome is dropped.
// It is how a decision keeps its deadline with a client that does not
// bound its reads by the context.
func detach[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	type outcome struct {
		v   T
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		v, err := f(ctx)
		done <- outcome{v, err}
	}()
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("ratewindow: no reply from redis: %w", context.Cause(ctx))
	}
}
