package core

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// Each key expires exactly when its state has no unit left in the window,
// however its units were added: the scripts set a counter's TTL when its
// window starts (later units are an INCRBY, which keeps it) and a
// bucket's key's TTL when a bucket starts. Decisions at 0, 0.1 s, 2 s and
// 2.1 s of a 10 s window; miniredis's clock moves with the Limiter's.
func TestKeyExpiry(t *testing.T) {
	const window = 10 * time.Second
	steps := []time.Duration{0, 100 * time.Millisecond, 2 * time.Second, 2100 * time.Millisecond}
	for _, c := range []struct {
		alg Algorithm
		// expires returns when the key expires after a unit at now
		expires func(now time.Time) time.Time
	}{
		{SlidingLog, func(now time.Time) time.Time { return now.Add(window) }},
		{SlidingBuckets, func(now time.Time) time.Time {
			prec := micros(Limit{Count: 100, Window: window, Algorithm: SlidingBuckets}.precision())
			b := now.UnixMicro() / prec
			return time.UnixMicro((b+1)*prec + micros(window))
		}},
		{SlidingCounter, func(now time.Time) time.Time { return now.Truncate(window).Add(2 * window) }},
	} {
		t.Run(c.alg.String(), func(t *testing.T) {
			m := redistest.Mini(t)
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { rdb.Close() })
			e := newEnv(t, rdb, m)
			lim := Limit{Count: 100, Window: window, Algorithm: c.alg}
			key := storageKey(keyTag(e.prefix, "k"), lim)
			start := e.clock.Now()
			for i, at := range steps {
				e.advance(at - e.clock.Now().Sub(start))
				r, err := e.lim.Allow(context.Background(), "k", lim)
				if err != nil || !r.Allowed || r.BackendErr != nil || r.Remaining != int64(99-i) {
					t.Fatalf("decision %d: %+v %v", i, r, err)
				}
				now := e.clock.Now()
				// in whole milliseconds, rounded up, as Redis takes them
				want := (c.expires(now).Sub(now) + time.Millisecond - 1).Truncate(time.Millisecond)
				if got := m.TTL(key); got != want {
					t.Fatalf("decision %d at %v: TTL %v, want %v", i, at, got, want)
				}
			}
		})
	}
}
