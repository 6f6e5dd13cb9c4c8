package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// fakeClock is a controlled clock, starting at a whole hour.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// env is one backend under test, with a controlled clock.
type env struct {
	clock  *fakeClock
	prefix string
	rdb    redis.UniversalClient // nil for memory
	mini   *miniredis.Miniredis  // set for miniredis
	lim    *Limiter
	t      *testing.T
}

// advance moves the clock (and miniredis's TTL clock) forward.
func (e *env) advance(d time.Duration) {
	e.clock.mu.Lock()
	e.clock.t = e.clock.t.Add(d)
	e.clock.mu.Unlock()
	if e.mini != nil {
		e.mini.FastForward(d)
	}
}

// storedKeys lists the backend's keys of this test: Redis keys, or memory
// keys with live state.
func (e *env) storedKeys() []string {
	e.t.Helper()
	ctx := context.Background()
	if e.rdb == nil {
		return e.lim.guard.next.(*memstore.Store).Keys(e.clock.Now().UnixMicro())
	}
	var (
		mu   sync.Mutex
		keys []string
	)
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, e.prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			keys = append(keys, it.Val())
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	switch c := e.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	}
	if err != nil {
		e.t.Fatalf("scan: %v", err)
	}
	return keys
}

// checkTTLs fails unless every stored key of the test has a TTL.
func (e *env) checkTTLs(when string) {
	e.t.Helper()
	if e.rdb == nil {
		return
	}
	for _, k := range e.storedKeys() {
		ttl, err := e.rdb.PTTL(context.Background(), k).Result()
		if err != nil {
			e.t.Fatalf("PTTL %s: %v", k, err)
		}
		if ttl <= 0 {
			e.t.Fatalf("%s: key %q has no TTL (%v)", when, k, ttl)
		}
	}
}

type backend struct {
	name string
	new  func(t *testing.T) *env
}

var testPrefixes sync.Map

// uniquePrefix isolates tests that share one Redis.
func uniquePrefix(testing.TB) string {
	p := fmt.Sprintf("t%d:", time.Now().UnixNano())
	for {
		if _, dup := testPrefixes.LoadOrStore(p, true); !dup {
			return p
		}
		p += "x"
	}
}

func newEnv(t *testing.T, rdb redis.UniversalClient, mini *miniredis.Miniredis) *env {
	e := &env{clock: newFakeClock(), prefix: uniquePrefix(t), rdb: rdb, mini: mini, t: t}
	opts := []Option{WithClock(e.clock.Now), WithPrefix(e.prefix), WithDenyCache(0), WithTimeout(5 * time.Second)}
	if rdb == nil {
		e.lim = NewMemory(opts...)
		return e
	}
	if mini != nil {
		mini.SetTime(e.clock.Now())
	}
	lim, err := New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	e.lim = lim
	return e
}

func backends() []backend {
	return []backend{
		{"memory", func(t *testing.T) *env { return newEnv(t, nil, nil) }},
		{"miniredis", func(t *testing.T) *env {
			m := redistest.Mini(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			return newEnv(t, c, m)
		}},
		{"redis", func(t *testing.T) *env {
			s := redistest.New(t)
			return newEnv(t, s.Client(t), s.Mini)
		}},
		{"cluster", func(t *testing.T) *env {
			return newEnv(t, redistest.NewCluster(t).Client(t), nil)
		}},
	}
}

var algorithms = []Algorithm{SlidingLog, SlidingBuckets, SlidingCounter}

// want is an expected result.
type want struct {
	allowed    bool
	remaining  int64
	retryAfter time.Duration
	resetAfter time.Duration
}

func (e *env) expect(step string, r Result, err error, w want) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: unexpected error %v", step, err)
	}
	if r.BackendErr != nil {
		e.t.Fatalf("%s: the failure mode answered: %v", step, r.BackendErr)
	}
	got := want{r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter}
	if got != w {
		e.t.Fatalf("%s: got %+v, want %+v", step, got, w)
	}
	e.checkTTLs(step)
}

func TestConformance(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"windows a nanosecond apart are limits apart", func(t *testing.T, e *env) {
			// as the Redis keys name them: one state each, in one call
			// or across calls (the memory backend kept windows by their
			// µs, and counted such a call twice)
			for _, a := range algorithms {
				x, y, z := Per(3, time.Second+1).With(a), Per(3, time.Second+2).With(a), Per(3, time.Second).With(a)
				key := "ns-" + a.String()
				for i := int64(1); i <= 4; i++ {
					r, err := e.lim.Allow(ctx, key, x, y)
					if err != nil || r.Allowed != (i <= 3) || r.Remaining != max(3-i, 0) {
						t.Fatalf("%s request %d: %+v %v, want allowed %v, %d remaining", a, i, r, err, i <= 3, max(3-i, 0))
					}
				}
				if r, err := e.lim.Allow(ctx, key, z); err != nil || !r.Allowed || r.Remaining != 2 {
					t.Fatalf("%s, a window of its own: %+v %v, want allowed, 2 remaining", a, r, err)
				}
			}
		}},
		{"exact counts", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				lim := PerMinute(5).With(a)
				for i := int64(1); i <= 5; i++ {
					r, err := e.lim.Allow(ctx, "count", lim)
					if err != nil || !r.Allowed || r.Remaining != 5-i {
						t.Fatalf("%s request %d: %+v %v", a, i, r, err)
					}
				}
				for i := 0; i < 3; i++ {
					r, err := e.lim.Allow(ctx, "count", lim)
					if err != nil || r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
						t.Fatalf("%s request over the limit: %+v %v", a, r, err)
					}
				}
				e.checkTTLs(a.String())
			}
		}},
		{"log retry and reset are exact", func(t *testing.T, e *env) {
			lim := Per(3, 10*time.Second)
			r, err := e.lim.Allow(ctx, "k", lim)
			e.expect("first", r, err, want{true, 2, 0, 10 * time.Second})
			e.advance(time.Second)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("second", r, err, want{true, 1, 0, 10 * time.Second})
			e.advance(time.Second + 500*time.Microsecond)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("third", r, err, want{true, 0, 0, 10 * time.Second})
			e.advance(time.Second)
			r, err = e.lim.Allow(ctx, "k", lim)
			// the oldest (t0) leaves at t0+10s; now is t0+3.0005s
			e.expect("denied", r, err, want{false, 0, 6*time.Second + 999500*time.Microsecond, 9 * time.Second})
			e.advance(r.RetryAfter - time.Microsecond)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("1µs early", r, err, want{false, 0, time.Microsecond, 2*time.Second + 500*time.Microsecond + time.Microsecond})
			e.advance(time.Microsecond)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("on time", r, err, want{true, 0, 0, 10 * time.Second})
		}},
		{"buckets retry and reset at bucket granularity", func(t *testing.T, e *env) {
			lim := Limit{Count: 3, Window: time.Minute, Algorithm: SlidingBuckets} // 1s buckets
			e.advance(500 * time.Millisecond)
			for i := int64(0); i < 3; i++ {
				r, err := e.lim.Allow(ctx, "k", lim)
				// a unit counts until its bucket's end plus the window
				e.expect(fmt.Sprint("request ", i), r, err, want{true, 2 - i, 0, time.Minute + 500*time.Millisecond})
				e.advance(time.Second)
			}
			// now t0+3.5s: the first bucket (t0..t0+1s) leaves at t0+61s
			r, err := e.lim.Allow(ctx, "k", lim)
			e.expect("denied", r, err, want{false, 0, 57*time.Second + 500*time.Millisecond, 59*time.Second + 500*time.Millisecond})
			e.advance(r.RetryAfter - time.Millisecond)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("1ms early", r, err, want{false, 0, time.Millisecond, 2*time.Second + time.Millisecond})
			e.advance(time.Millisecond)
			r, err = e.lim.Allow(ctx, "k", lim)
			// at a bucket's start, its end is a whole bucket away
			e.expect("on time", r, err, want{true, 0, 0, time.Minute + time.Second})
		}},
		{"counter weighs the previous window", func(t *testing.T, e *env) {
			lim := Limit{Count: 10, Window: 10 * time.Second, Algorithm: SlidingCounter}
			e.advance(time.Second)
			for i := int64(0); i < 10; i++ {
				r, err := e.lim.Allow(ctx, "k", lim)
				e.expect(fmt.Sprint("request ", i), r, err, want{true, 9 - i, 0, 19 * time.Second})
			}
			// next window: previous 10 weighted by 0.9 at 1s in: 9 + 1 fits
			r, err := e.lim.Allow(ctx, "k", lim)
			e.expect("denied", r, err, want{false, 0, 10 * time.Second, 19 * time.Second})
			e.advance(10*time.Second - time.Millisecond)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("1ms early", r, err, want{false, 0, time.Millisecond, 9*time.Second + time.Millisecond})
			e.advance(time.Millisecond)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("on time", r, err, want{true, 0, 0, 19 * time.Second})
			e.advance(4 * time.Second) // 5s in: 10*0.5 + 1 = 6 counted
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("half way", r, err, want{true, 3, 0, 15 * time.Second})
		}},
		{"multi-limit all or nothing", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				sec, min := Per(2, time.Second).With(a), Per(3, time.Minute).With(a)
				key := "multi-" + a.String()
				for i := 0; i < 2; i++ {
					if r, err := e.lim.Allow(ctx, key, sec, min); err != nil || !r.Allowed {
						t.Fatalf("%s request %d: %+v %v", a, i, r, err)
					}
				}
				r, err := e.lim.Allow(ctx, key, sec, min)
				if err != nil || r.Allowed || r.Limit != sec {
					t.Fatalf("%s: want denial by the per-second limit, got %+v %v", a, r, err)
				}
				// the denial added nothing to the per-minute limit
				if p, err := e.lim.Peek(ctx, key, min); err != nil || p.Remaining != 1 {
					t.Fatalf("%s: per-minute remaining after a denial: %+v %v", a, p, err)
				}
				e.advance(2 * time.Second)
				if r, err := e.lim.Allow(ctx, key, sec, min); err != nil || !r.Allowed || r.Limit != min || r.Remaining != 0 {
					t.Fatalf("%s third: %+v %v", a, r, err)
				}
				r, err = e.lim.Allow(ctx, key, sec, min)
				if err != nil || r.Allowed || r.Limit != min {
					t.Fatalf("%s: want denial by the per-minute limit, got %+v %v", a, r, err)
				}
				// the denial added nothing to the per-second limit either
				if p, err := e.lim.Peek(ctx, key, sec); err != nil || p.Remaining != 1 {
					t.Fatalf("%s: per-second remaining after a denial: %+v %v", a, p, err)
				}
				e.checkTTLs(a.String())
			}
		}},
		{"AllowN", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				lim := PerMinute(10).With(a)
				steps := []struct {
					n       int64
					allowed bool
					rem     int64
					never   bool
				}{{7, true, 3, false}, {4, false, 3, false}, {3, true, 0, false}, {11, false, 0, true}, {1, false, 0, false}}
				for i, s := range steps {
					r, err := e.lim.AllowN(ctx, "n", s.n, lim)
					if err != nil || r.Allowed != s.allowed || r.Remaining != s.rem || r.Never() != s.never {
						t.Fatalf("%s step %d (n=%d): %+v %v", a, i, s.n, r, err)
					}
				}
				if err := e.lim.Reset(ctx, "n", lim); err != nil {
					t.Fatal(err)
				}
				if r, err := e.lim.AllowN(ctx, "n", 11, lim); err != nil || r.Allowed || r.RetryAfter >= 0 || r.Remaining != 10 {
					t.Fatalf("%s: cost above Count on an empty key: %+v %v", a, r, err)
				}
			}
		}},
		{"Peek consumes nothing", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				lim := PerMinute(2).With(a)
				key := "peek-" + a.String()
				for i := 0; i < 3; i++ {
					r, err := e.lim.Peek(ctx, key, lim)
					if err != nil || !r.Allowed || r.Remaining != 2 {
						t.Fatalf("%s peek %d: %+v %v", a, i, r, err)
					}
				}
				if keys := e.storedKeys(); len(keys) != int(a) {
					t.Fatalf("%s: Peek stored %v", a, keys)
				}
				e.lim.AllowN(ctx, key, 2, lim)
				if r, err := e.lim.Peek(ctx, key, lim); err != nil || r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
					t.Fatalf("%s peek when full: %+v %v", a, r, err)
				}
			}
		}},
		{"Reset", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				lim := PerMinute(3).With(a)
				e.lim.AllowN(ctx, "reset", 3, lim)
				if err := e.lim.Reset(ctx, "reset", lim); err != nil {
					t.Fatal(err)
				}
				if keys := e.storedKeys(); len(keys) != 0 {
					t.Fatalf("%s: keys left after Reset: %v", a, keys)
				}
				if r, err := e.lim.Allow(ctx, "reset", lim); err != nil || !r.Allowed || r.Remaining != 2 {
					t.Fatalf("%s after Reset: %+v %v", a, r, err)
				}
				e.lim.Reset(ctx, "reset", lim)
			}
		}},
		{"keys vanish after the window", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				lim := Per(5, time.Second).With(a)
				e.lim.AllowN(ctx, "idle-"+a.String(), 2, lim)
			}
			if keys := e.storedKeys(); len(keys) != len(algorithms) && e.rdb != nil {
				t.Fatalf("keys: %v", keys)
			}
			if e.rdb != nil && e.mini == nil {
				// real Redis expires by its own clock
				time.Sleep(2100 * time.Millisecond)
			}
			e.advance(2*time.Second + time.Millisecond) // the counter keeps two windows
			if keys := e.storedKeys(); len(keys) != 0 {
				t.Fatalf("keys left after the window: %v", keys)
			}
		}},
		{"a burst in one instant is counted unit by unit", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				lim := PerHour(20).With(a)
				admitted := 0
				for i := 0; i < 50; i++ {
					r, err := e.lim.Allow(ctx, "burst", lim)
					if err != nil {
						t.Fatal(err)
					}
					if r.Allowed {
						admitted++
					}
				}
				if admitted != 20 {
					t.Fatalf("%s: admitted %d in one instant, want 20", a, admitted)
				}
			}
			if e.rdb != nil {
				n, err := storedLogLen(ctx, e.rdb, storageKey(keyTag(e.prefix, "burst"), PerHour(20)))
				if err != nil || n != 20 {
					t.Fatalf("log members: %d %v", n, err)
				}
			}
		}},
		{"keys with braces and huge keys", func(t *testing.T, e *env) {
			huge := strings.Repeat("x", 100<<10)
			for _, key := range []string{"{a}b", "a}{b", "}", "{", "#hash-like", huge, huge + "y"} {
				lim := PerMinute(2)
				for i := 0; i < 2; i++ {
					if r, err := e.lim.Allow(ctx, key, lim, Per(5, time.Hour).With(SlidingCounter), Per(3, time.Hour).With(SlidingBuckets)); err != nil || !r.Allowed {
						t.Fatalf("key %.10q request %d: %+v %v", key, i, r, err)
					}
				}
				if r, err := e.lim.Allow(ctx, key, lim); err != nil || r.Allowed {
					t.Fatalf("key %.10q: third request %+v %v", key, r, err)
				}
			}
			keys := e.storedKeys()
			if e.rdb != nil && len(keys) != 7*3 {
				t.Fatalf("want 21 distinct stored keys, got %d", len(keys))
			}
			for _, k := range keys {
				if e.rdb != nil && len(k) > len(e.prefix)+64 {
					t.Fatalf("stored key too long: %d bytes", len(k))
				}
			}
			e.checkTTLs("braces")
		}},
		{"huge limits do not overflow", func(t *testing.T, e *env) {
			for _, a := range algorithms {
				count := int64(1 << 40)
				if a == SlidingLog {
					count = MaxLogCount
				}
				lim := Limit{Count: count, Window: time.Hour, Algorithm: a}
				r, err := e.lim.AllowN(ctx, "huge", 1000, lim)
				if err != nil || !r.Allowed || r.Remaining != count-1000 {
					t.Fatalf("%s: %+v %v", a, r, err)
				}
			}
		}},
		{"bad input is an error and writes nothing", func(t *testing.T, e *env) {
			ok := PerSecond(1)
			cases := []struct {
				name   string
				key    string
				n      int64
				limits []Limit
				want   error
			}{
				{"empty key", "", 1, []Limit{ok}, ErrInvalidKey},
				{"zero cost", "k", 0, []Limit{ok}, ErrInvalidCost},
				{"negative cost", "k", -1, []Limit{ok}, ErrInvalidCost},
				{"no limits", "k", 1, nil, ErrNoLimits},
				{"zero count", "k", 1, []Limit{PerSecond(0)}, ErrInvalidLimit},
				{"negative count", "k", 1, []Limit{PerSecond(-5)}, ErrInvalidLimit},
				{"zero window", "k", 1, []Limit{Per(1, 0)}, ErrInvalidLimit},
				{"window under 1ms", "k", 1, []Limit{Per(1, 999*time.Microsecond)}, ErrInvalidLimit},
				{"unknown algorithm", "k", 1, []Limit{PerSecond(1).With(7)}, ErrInvalidLimit},
				{"precision above window", "k", 1, []Limit{{Count: 1, Window: time.Second, Algorithm: SlidingBuckets, Precision: 2 * time.Second}}, ErrInvalidLimit},
				{"precision under 1ms", "k", 1, []Limit{{Count: 1, Window: time.Second, Algorithm: SlidingBuckets, Precision: time.Microsecond}}, ErrInvalidLimit},
				{"log count too large", "k", 1, []Limit{PerSecond(MaxLogCount + 1)}, ErrInvalidLimit},
				{"two limits sharing storage", "k", 1, []Limit{PerSecond(1), PerSecond(2)}, ErrInvalidLimit},
				{"a bad limit after a good one", "k", 1, []Limit{ok, PerMinute(0)}, ErrInvalidLimit},
			}
			for _, c := range cases {
				calls := map[string]func() error{
					"AllowN": func() error { _, err := e.lim.AllowN(ctx, c.key, c.n, c.limits...); return err },
					"WaitN":  func() error { return e.lim.WaitN(ctx, c.key, c.n, c.limits...) },
				}
				if c.n == 1 {
					calls["Allow"] = func() error { _, err := e.lim.Allow(ctx, c.key, c.limits...); return err }
					calls["Peek"] = func() error { _, err := e.lim.Peek(ctx, c.key, c.limits...); return err }
					calls["Reset"] = func() error { return e.lim.Reset(ctx, c.key, c.limits...) }
					calls["Wait"] = func() error { return e.lim.Wait(ctx, c.key, c.limits...) }
				}
				for name, call := range calls {
					if err := call(); !errors.Is(err, c.want) {
						t.Errorf("%s %s: got %v, want %v", c.name, name, err, c.want)
					}
				}
			}
			if keys := e.storedKeys(); len(keys) != 0 {
				t.Fatalf("bad input wrote %v", keys)
			}
		}},
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					e := b.new(t)
					c.run(t, e)
				})
			}
		})
	}
}
