package core

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// TestFlood: three Limiters (three replicas, each with its own client and
// the default options, each having served a decision before) with 64
// goroutines each hammer one key limited to
// 100 a second, on real Redis, starving the process of CPU. The limiter
// must keep limiting: no decision is answered by the failure mode while
// Redis is healthy (the circuit breaker never opens), and no more are
// admitted than the limit allows over the run. It asserts no time.
// RATEWINDOW_FLOOD_SECONDS sets the length (default 2).
func TestFlood(t *testing.T) {
	seconds := 2
	if s, err := strconv.Atoi(os.Getenv("RATEWINDOW_FLOOD_SECONDS")); err == nil && s > 0 {
		seconds = s
	}
	srv := redistest.New(t)
	for _, alg := range []Algorithm{SlidingLog, SlidingBuckets} {
		t.Run(alg.String(), func(t *testing.T) {
			prefix := uniquePrefix(t)
			var failed, opened, admitted, decisions atomic.Int64
			t0 := time.Now()
			var limiters []*Limiter
			for range 3 {
				l, err := New(srv.Client(t), WithPrefix(prefix), WithObserver(func(ev Event) {
					decisions.Add(1)
					if ev.Failed {
						if failed.Add(1) < 4 {
							t.Logf("answered by the failure mode at %v: %v after %v", time.Since(t0), ev.Err, ev.Latency)
						}
						if errors.Is(ev.Err, ErrCircuitOpen) {
							opened.Add(1)
						}
					}
				}))
				if err != nil {
					t.Fatal(err)
				}
				// each replica has served before the flood: its client is
				// connected and the server has its scripts
				for i := 0; ; i++ {
					r, err := l.Allow(context.Background(), "warm", PerSecond(1))
					if err != nil || (r.BackendErr != nil && i == 20) {
						t.Fatalf("warming up: %v %v", err, r.BackendErr)
					}
					if r.BackendErr == nil {
						break
					}
				}
				limiters = append(limiters, l)
			}
			failed.Store(0) // a slow warm-up is no part of the flood
			opened.Store(0)
			decisions.Store(0)
			lim := PerSecond(100).With(alg)
			ctx := context.Background()
			start := time.Now()
			end := start.Add(time.Duration(seconds) * time.Second)
			var wg sync.WaitGroup
			for _, l := range limiters {
				for range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(end) {
							r, err := l.Allow(ctx, "hot", lim)
							if err != nil {
								t.Error(err)
								return
							}
							if r.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			elapsed := time.Since(start)
			// a sliding window of 1s over the run holds at most 100: the run
			// fits in ceil(elapsed) + 1 windows
			most := 100 * (int64(elapsed/time.Second) + 2)
			t.Logf("%d decisions, %d admitted in %v, %d answered by the failure mode", decisions.Load(), admitted.Load(), elapsed.Round(time.Millisecond), failed.Load())
			if opened.Load() != 0 {
				t.Errorf("the circuit breaker opened while Redis was healthy: %d decisions answered by the failure mode", opened.Load())
			}
			if failed.Load() != 0 {
				t.Errorf("%d decisions answered by the failure mode while Redis was healthy", failed.Load())
			}
			if admitted.Load() > most {
				t.Errorf("%d admitted in %v, above %d", admitted.Load(), elapsed, most)
			}
		})
	}
}

// TestDenyCacheProbe: when a cached denial expires, one request of the key
// asks Redis again and the others wait for its answer: 50 concurrent
// requests of a key still denied make one round trip, not 50, and all are
// denied.
func TestDenyCacheProbe(t *testing.T) {
	e := backends()[2].new(t) // real Redis
	var trips, hits atomic.Int64
	l, err := New(e.rdb, WithClock(e.clock.Now), WithPrefix(e.prefix), WithTimeout(5*time.Second), WithObserver(func(ev Event) {
		if ev.CacheHit {
			hits.Add(1)
		} else {
			trips.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := PerHour(1)
	for range 2 { // the second is denied, and cached for an hour
		if _, err := l.Allow(ctx, "k", lim); err != nil {
			t.Fatal(err)
		}
	}
	// the cached denial expires (the clock Redis is given does not move:
	// the key is still denied there)
	sh := l.cache.shard("k")
	sh.mu.Lock()
	sh.m["k"][0].until = 0
	sh.mu.Unlock()
	trips.Store(0)
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for range 50 {
		wg.Go(func() {
			r, err := l.Allow(ctx, "k", lim)
			if err != nil {
				t.Error(err)
			}
			if r.Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if trips.Load() != 1 || allowed.Load() != 0 {
		t.Fatalf("%d round trips and %d admitted for 50 requests of a denied key, want 1 and 0", trips.Load(), allowed.Load())
	}
}

// BenchmarkFlatOutFlood is 36's flood without any fault: a Limiter made as
// the flood starts, g goroutines deciding flat out on one denied hot key
// (answered by the deny cache) and 200 more on keys of their own (answered
// by Redis), WithTimeout(100ms), for 2s. It reports the slowest decision,
// the decisions the failure mode answered and the scheduler's lateness (a
// 1ms timer's, see internal/stall); run it beside two busy loops:
//
//	go test -run '^$' -bench FlatOutFlood -benchtime 1x ./core/
func BenchmarkFlatOutFlood(b *testing.B) {
	srv := redistest.New(b)
	for _, g := range []int{64, 256} {
		b.Run("g="+strconv.Itoa(g)+"+200", func(b *testing.B) {
			var slowest, failed, decisions atomic.Int64
			var stalls time.Duration
			for range b.N {
				l, err := New(srv.Client(b), WithTimeout(100*time.Millisecond), WithPrefix(uniquePrefix(b)))
				if err != nil {
					b.Fatal(err)
				}
				meter := stall.Start(b)
				stop := time.Now().Add(2 * time.Second)
				var wg sync.WaitGroup
				for i := range g + 200 {
					key, lim := "hot", PerSecond(100)
					if i >= g {
						key, lim = "own"+strconv.Itoa(i), PerSecond(MaxLogCount)
					}
					wg.Go(func() {
						for time.Now().Before(stop) {
							start := time.Now()
							r, err := l.Allow(context.Background(), key, lim)
							took := int64(time.Since(start))
							if err != nil {
								b.Error(err)
								return
							}
							decisions.Add(1)
							if r.BackendErr != nil && !errors.Is(r.BackendErr, ErrShed) {
								failed.Add(1)
							}
							for old := slowest.Load(); took > old && !slowest.CompareAndSwap(old, took); old = slowest.Load() {
							}
						}
					})
				}
				wg.Wait()
				stalls = max(stalls, meter.Finish())
			}
			b.ReportMetric(float64(slowest.Load())/1e6, "slowest-ms")
			b.ReportMetric(float64(failed.Load()), "by-failure-mode")
			b.ReportMetric(float64(decisions.Load())/float64(b.N), "decisions")
			b.ReportMetric(float64(stalls)/1e6, "stall-ms")
		})
	}
}
