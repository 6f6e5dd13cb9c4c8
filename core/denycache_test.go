package core

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// evalCalls returns the number of EVALSHA, EVAL and FCALL calls the server has
// run (INFO commandstats).
func evalCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval" && name != "cmdstat_fcall") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats %q: %v", line, err)
		}
		total += n
	}
	return total
}

// TestDenyCacheRoundTrips: after a key is denied, 1,000 more requests
// within RetryAfter are answered from memory (INFO commandstats counts the
// script calls on a dedicated server); after RetryAfter the key is
// admitted again. With the cache off, every request is a script call.
func TestDenyCacheRoundTrips(t *testing.T) {
	t.Parallel()
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			p := redistest.Start(t)
			rdb := p.Client(t)
			l, rec := faultLimiter(t, rdb, FailOpen, 1, WithTimeout(patient))
			ctx := context.Background()
			lim := Per(2, 400*time.Millisecond).With(a)
			for i := range 2 {
				if r, err := l.Allow(ctx, "k", lim); err != nil || !r.Allowed {
					t.Fatalf("request %d: %+v %v", i, r, err)
				}
			}
			denied, err := l.Allow(ctx, "k", lim)
			deniedAt := time.Now()
			if err != nil || denied.Allowed || denied.RetryAfter <= 0 {
				t.Fatalf("third request: %+v %v", denied, err)
			}
			rec.take()
			before := evalCalls(t, rdb)
			// up to 1,000 repeats, those made well within RetryAfter (a
			// loaded machine makes fewer)
			within := deniedAt.Add(denied.RetryAfter - 100*time.Millisecond)
			repeats := 0
			for ; repeats < 1000 && time.Now().Before(within); repeats++ {
				r, err := l.Allow(ctx, "k", lim)
				if err != nil || r.Allowed || r.RetryAfter <= 0 || r.RetryAfter > denied.RetryAfter {
					t.Fatalf("repeat %d: %+v %v", repeats, r, err)
				}
			}
			calls := evalCalls(t, rdb) - before
			hits := tallyEvents(rec.take()).cacheHits
			if calls != int64(repeats-hits) || calls > 5 || repeats < 10 {
				t.Fatalf("%d repeats within RetryAfter: %d script calls, %d cache hits", repeats, calls, hits)
			}
			t.Logf("%s: %d repeats of a denied key: %d script calls, %d cache hits", a, repeats, calls, hits)

			time.Sleep(time.Until(deniedAt.Add(denied.RetryAfter)))
			if r, err := l.Allow(ctx, "k", lim); err != nil || !r.Allowed {
				t.Fatalf("after RetryAfter: %+v %v", r, err)
			}

			// the cache off: every request goes to Redis
			off, _ := faultLimiter(t, rdb, FailOpen, 1, WithDenyCache(0), WithTimeout(patient))
			off.AllowN(ctx, "k", 2, lim)
			within = time.Now().Add(lim.Window - 100*time.Millisecond)
			before = evalCalls(t, rdb)
			repeats = 0
			for ; repeats < 10 && time.Now().Before(within); repeats++ {
				if r, err := off.Allow(ctx, "k", lim); err != nil || r.Allowed {
					t.Fatalf("cache off: %+v %v", r, err)
				}
			}
			if calls := evalCalls(t, rdb) - before; calls != int64(repeats) || repeats == 0 {
				t.Fatalf("cache off: %d script calls for %d requests", calls, repeats)
			}
		})
	}
}

// TestDenyCacheNeverChangesDecision: the cache answers only the cost and
// limits it saw denied; a smaller cost, other limits, Peek and a request
// after Reset all go to Redis.
func TestDenyCacheNeverChangesDecision(t *testing.T) {
	t.Parallel()
	srv := redistest.New(t)
	l, rec := faultLimiter(t, srv.Client(t), FailOpen, 1, WithTimeout(patient))
	ctx := context.Background()
	min5 := PerMinute(5)
	steps := []struct {
		name      string
		call      func() (Result, error)
		allowed   bool
		remaining int64
		cacheHit  bool
	}{
		{"3 of 5", func() (Result, error) { return l.AllowN(ctx, "k", 3, min5) }, true, 2, false},
		{"3 more: denied", func() (Result, error) { return l.AllowN(ctx, "k", 3, min5) }, false, 2, false},
		{"3 again: cached", func() (Result, error) { return l.AllowN(ctx, "k", 3, min5) }, false, 2, true},
		{"2 fit: redis", func() (Result, error) { return l.AllowN(ctx, "k", 2, min5) }, true, 0, false},
		// the denial as it was made: Remaining is then 2, now 0
		{"3 again: still cached", func() (Result, error) { return l.AllowN(ctx, "k", 3, min5) }, false, 2, true},
		{"1: redis, denied", func() (Result, error) { return l.AllowN(ctx, "k", 1, min5) }, false, 0, false},
		{"1 again: cached", func() (Result, error) { return l.AllowN(ctx, "k", 1, min5) }, false, 0, true},
		{"other limits: redis", func() (Result, error) { return l.Allow(ctx, "k", PerMinute(6)) }, true, 0, false},
		{"peek: redis", func() (Result, error) { return l.Peek(ctx, "k", min5) }, false, 0, false},
		{"other key: redis", func() (Result, error) { return l.Allow(ctx, "k2", min5) }, true, 4, false},
		{"reset", func() (Result, error) { return Result{Allowed: true, Remaining: 5}, l.Reset(ctx, "k", min5) }, true, 5, false},
		{"after reset: redis", func() (Result, error) { return l.Allow(ctx, "k", min5) }, true, 4, false},
	}
	for _, s := range steps {
		r, err := s.call()
		if err != nil || r.Allowed != s.allowed || r.Remaining != s.remaining {
			t.Fatalf("%s: %+v %v, want allowed %v remaining %d", s.name, r, err, s.allowed, s.remaining)
		}
		ev := rec.take()
		if s.name == "reset" {
			continue
		}
		if len(ev) != 1 || ev[0].CacheHit != s.cacheHit || ev[0].Result != r {
			t.Fatalf("%s: events %+v, want one with cache hit %v", s.name, ev, s.cacheHit)
		}
	}
}

// TestDenyCacheFloodThroughLimiter: distinct denied keys through a real
// Redis never grow the cache past its size.
func TestDenyCacheFloodThroughLimiter(t *testing.T) {
	t.Parallel()
	srv := redistest.New(t)
	const size = 100
	l, rec := faultLimiter(t, srv.Client(t), FailOpen, 1, WithDenyCache(size), WithTimeout(patient))
	ctx := context.Background()
	lim := PerMinute(1)
	for i := range 1000 {
		key := "flood-" + strconv.Itoa(i)
		l.Allow(ctx, key, lim)
		if r, err := l.Allow(ctx, key, lim); err != nil || r.Allowed {
			t.Fatalf("%s: %+v %v", key, r, err)
		}
		if n := l.cache.len(); n > size {
			t.Fatalf("after %d denied keys the cache holds %d > %d", i+1, n, size)
		}
	}
	if n := l.cache.len(); n != size {
		t.Fatalf("cache holds %d, want it full at %d", n, size)
	}
	// the latest denial is cached
	if r, _ := l.Allow(ctx, "flood-999", lim); r.Allowed {
		t.Fatal("flood-999 allowed")
	}
	if ev := rec.take(); !ev[len(ev)-1].CacheHit {
		t.Fatal("the latest denial is not cached")
	}
}

// TestDenyCacheBounded: 200,000 distinct denied keys into a small cache:
// the entry count never exceeds the size and the heap stays flat (an
// unbounded cache would grow by some 50MB). Not parallel: the heap is the
// process's.
func TestDenyCacheBounded(t *testing.T) {
	denial := Result{Limit: PerMinute(1), RetryAfter: time.Minute, ResetAfter: time.Minute}
	limits := []Limit{PerMinute(1), PerHour(10).With(SlidingCounter)}
	for _, size := range []int{1, 5, 100} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			c := newDenyCache(size)
			var heap10k uint64
			for i := range 200_000 {
				c.put("ip:"+strconv.Itoa(i), 1, limits, int64(i), denial)
				if i%997 == 0 {
					if n := c.len(); n > size {
						t.Fatalf("after %d keys: %d entries > %d", i+1, n, size)
					}
				}
				if i == 10_000 {
					heap10k = heapAfterGC()
				}
			}
			if n := c.len(); n != size {
				t.Fatalf("%d entries, want a full cache of %d", n, size)
			}
			held := 0
			for i := range c.shards {
				for _, ds := range c.shards[i].m {
					held += len(ds)
				}
			}
			if held != size {
				t.Fatalf("maps hold %d denials, count says %d", held, size)
			}
			if grown := int64(heapAfterGC()) - int64(heap10k); grown > 4<<20 {
				t.Fatalf("heap grew %d bytes between 10k and 200k keys", grown)
			}
			runtime.KeepAlive(c)
		})
	}
}

// TestDenyCacheEntries: the unit behaviour of one shard.
func TestDenyCacheEntries(t *testing.T) {
	lim := []Limit{PerMinute(1)}
	r := Result{Limit: lim[0], RetryAfter: 10 * time.Second, ResetAfter: 50 * time.Second}
	c := newDenyCache(4) // 4 shards of 1

	c.put("a", 1, lim, 0, r)
	got, ok, _, _ := c.get("a", 1, lim, int64(400*time.Millisecond))
	if want := (Result{Limit: lim[0], RetryAfter: 9600 * time.Millisecond, ResetAfter: 49600 * time.Millisecond}); !ok || got != want {
		t.Fatalf("counted down: %+v %v, want %+v", got, ok, want)
	}
	// the last denial, asked of the backend again after denyRecheck (1s of
	// its 10s), still counts down to its own end
	if got, ok := c.last("a", 1, lim, int64(4*time.Second)); !ok || got.RetryAfter != 6*time.Second || got.ResetAfter != 46*time.Second {
		t.Fatalf("last: %+v %v", got, ok)
	}
	for _, miss := range []struct {
		n      int64
		limits []Limit
	}{{2, lim}, {1, []Limit{PerMinute(2)}}, {1, []Limit{lim[0], PerHour(5)}}} {
		if _, ok, p, _ := c.get("a", miss.n, miss.limits, 0); ok || p != nil {
			t.Fatalf("hit for n=%d limits %v", miss.n, miss.limits)
		}
	}
	// due again (denyRecheck, sooner than RetryAfter): the first caller
	// probes, the next ones wait for it
	_, ok, p, wait := c.get("a", 1, lim, int64(denyRecheck))
	if ok || p == nil || wait {
		t.Fatalf("at denyRecheck: hit %v, probe %v, wait %v; want the probe", ok, p, wait)
	}
	if _, ok, p2, wait := c.get("a", 1, lim, int64(11*time.Second)); ok || p2 != p || !wait {
		t.Fatalf("while probing: hit %v, probe %v, wait %v; want to wait for the probe", ok, p2, wait)
	}
	// denied again: renewed, the waiters take the new denial
	c.put("a", 1, lim, int64(denyRecheck), r)
	c.settle("a", 1, lim, p, int64(denyRecheck), true, r)
	select {
	case <-p.done:
	default:
		t.Fatal("settle did not wake the waiters")
	}
	if got, ok, p2, _ := c.get("a", 1, lim, int64(1500*time.Millisecond)); !ok || p2 != nil || got.RetryAfter != 9500*time.Millisecond {
		t.Fatalf("after a probe denied again: %+v, hit %v, probe %v; want the renewed denial", got, ok, p2)
	}
	// not answered by Redis (a timeout, shed, the failure mode): the
	// denial stays, the last one, and the next caller probes
	_, _, p, _ = c.get("a", 1, lim, int64(2*denyRecheck))
	c.settle("a", 1, lim, p, int64(2*denyRecheck), false, Result{})
	if _, ok, p2, wait := c.get("a", 1, lim, int64(2*denyRecheck)); ok || p2 == nil || p2 == p || wait {
		t.Fatalf("after a probe Redis did not answer: hit %v, probe %v, wait %v; want a new probe", ok, p2, wait)
	} else {
		p = p2
	}
	if _, ok := c.last("a", 1, lim, int64(2*denyRecheck)); !ok {
		t.Fatal("the last denial went with a probe Redis did not answer")
	}
	// admitted (nothing put) with room for its waiters: the denial goes,
	// and the waiters, woken, ask for themselves, together; none waits for
	// another probe
	c.settle("a", 1, lim, p, int64(2*denyRecheck), true, Result{Allowed: true, Remaining: 5})
	select {
	case <-p.done:
	default:
		t.Fatal("settle did not wake the waiters")
	}
	for range 2 {
		if _, ok, p3, wait := c.get("a", 1, lim, int64(2*denyRecheck)); ok || p3 != nil || wait {
			t.Fatalf("after an admitted probe: hit %v, probe %v, wait %v; want none: the key asks freely", ok, p3, wait)
		}
	}
	if c.len() != 0 {
		t.Fatalf("an admitted probe left %d denials", c.len())
	}
	c.forget("a", 0)
	c.put("a", 1, lim, 0, Result{Allowed: true})
	c.put("a", 1, lim, 0, Result{RetryAfter: -1})
	if c.len() != 0 {
		t.Fatal("cached an allowed or a never-fits result")
	}

	// one key: at most denialsPerKey costs, the oldest goes
	c = newDenyCache(1000)
	for n := int64(1); n <= denialsPerKey+2; n++ {
		c.put("k", n, lim, 0, r)
	}
	if c.len() != denialsPerKey {
		t.Fatalf("one key holds %d denials", c.len())
	}
	for n := int64(1); n <= denialsPerKey+2; n++ {
		if _, ok, _, _ := c.get("k", n, lim, 1); ok != (n > 2) {
			t.Fatalf("cost %d: hit %v", n, ok)
		}
	}
	// an update does not add an entry
	c.put("k", 5, lim, 0, r)
	c.forget("k", 0)
	if c.len() != 0 {
		t.Fatalf("forget left %d", c.len())
	}
	// a denial decided before a forget (a Reset racing the decision) may
	// be stale: not kept; one decided since is
	c.forget("k", 100)
	c.put("k", 1, lim, 99, r)
	if c.len() != 0 {
		t.Fatal("kept a denial decided before the key was forgotten")
	}
	c.put("k", 1, lim, 100, r)
	if c.len() != 1 {
		t.Fatal("dropped a denial decided as the key was forgotten")
	}
	c.forget("k", 0)

	// a full shard evicts an expired key rather than a live one
	c = newDenyCache(3 * denyShards) // shards of 3
	var same []string
	for i := 0; len(same) < 4; i++ {
		if k := "x" + strconv.Itoa(i); c.shard(k) == c.shard("x0") {
			same = append(same, k)
		}
	}
	c.put(same[0], 1, lim, 0, r)
	c.put(same[1], 1, lim, 0, Result{RetryAfter: time.Nanosecond})
	c.put(same[2], 1, lim, 0, r)
	c.put(same[3], 1, lim, 10, r)
	for i, want := range []bool{true, false, true, true} {
		if _, ok, _, _ := c.get(same[i], 1, lim, 10); ok != want {
			t.Fatalf("key %d cached %v, want %v", i, ok, want)
		}
	}
}

// TestDenyCacheSeesOtherReplicas: a denial cached on replica A outlives a
// change made on replica B (Refund, Reset) by at most denyRecheck: A's
// next decision after it asks Redis again, whatever the denial's
// RetryAfter (a minute here). Before, A answered its cached denial for the
// whole minute while its own Peek said allowed.
func TestDenyCacheSeesOtherReplicas(t *testing.T) {
	srv := redistest.New(t)
	for _, change := range []string{"refund", "reset"} {
		t.Run(change, func(t *testing.T) {
			clock := newFakeClock()
			prefix := uniquePrefix(t)
			replica := func() *Limiter {
				l, err := New(srv.Client(t), WithClock(clock.Now), WithPrefix(prefix), WithTimeout(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			a, b := replica(), replica()
			ctx := context.Background()
			lim := PerMinute(3)
			for i := range 4 {
				r, err := a.Allow(ctx, "k", lim)
				if err != nil || r.Allowed != (i < 3) {
					t.Fatalf("request %d on A: %+v %v", i, r, err)
				}
			}
			var err error
			if change == "refund" {
				err = b.Refund(ctx, "k", 1, lim)
			} else {
				err = b.Reset(ctx, "k", lim)
			}
			if err != nil {
				t.Fatal(err)
			}
			// within the second, A's cache answers: still denied, no round trip
			advance := func(d time.Duration) {
				clock.mu.Lock()
				clock.t = clock.t.Add(d)
				clock.mu.Unlock()
			}
			advance(denyRecheck - time.Millisecond)
			if r, err := a.Allow(ctx, "k", lim); err != nil || r.Allowed || r.RetryAfter != time.Minute-denyRecheck+time.Millisecond {
				t.Fatalf("A within the second: %+v %v, want the cached denial", r, err)
			}
			// then A asks Redis again: B's change holds
			advance(time.Millisecond)
			if r, err := a.Allow(ctx, "k", lim); err != nil || !r.Allowed {
				t.Fatalf("A after the second: %+v %v, want allowed after B's %s", r, err, change)
			}
		})
	}
}

// len returns the number of denials held.
func (c *denyCache) len() int {
	total := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		total += sh.n
		sh.mu.Unlock()
	}
	return total
}

// TestInstantAnswersYield: a goroutine answered without I/O in a loop (by
// the deny cache) yields its processor every
// instantYield answers, so that the goroutines behind it run (without the
// yield it keeps it until preempted, some 10ms: hundreds of thousands of
// answers). Not parallel: it runs on one processor.
func TestInstantAnswersYield(t *testing.T) {
	c := newDenyCache(10)
	limits := []Limit{PerMinute(1)}
	now := time.Now().UnixNano()
	c.put("hot", 1, limits, now, Result{Limit: limits[0], RetryAfter: time.Minute, ResetAfter: time.Minute})
	for _, tc := range []struct {
		name   string
		answer func() bool // reports whether it answered without I/O
	}{
		{"deny cache", func() bool { _, ok, _, _ := c.get("hot", 1, limits, now); return ok }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			var answered, stop atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				for stop.Load() == 0 {
					if !tc.answer() {
						t.Error("not answered without I/O")
						return
					}
					answered.Add(1)
				}
			}()
			for answered.Load() == 0 {
				runtime.Gosched()
			}
			before := answered.Load()
			runtime.Gosched() // the loop runs until it yields
			n := answered.Load() - before
			stop.Store(1)
			<-done
			if n > 4*instantYield { // a yield may go to another goroutine than this one
				t.Fatalf("the loop answered %d times before this goroutine ran again, want at most %d", n, 4*instantYield)
			}
		})
	}
}

// TestExpiredDenialAnswersEveryStalledDecision: on a stalled Redis an
// expired cached denial answers each decision that runs out of time
// (WithTimeout's doc: "a cached denial of the key, even expired, answers"),
// not only the first: a probe Redis did not answer leaves the denial.
func TestExpiredDenialAnswersEveryStalledDecision(t *testing.T) {
	p := redistest.Start(t)
	l, err := New(p.Client(t), WithPrefix(uniquePrefix(t)), WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := PerMinute(1)
	if _, err := l.Allow(ctx, "k", lim); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx, "k", lim); err != nil || r.Allowed {
		t.Fatal("want a denial", r, err)
	}
	admin := p.Client(t)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "4000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "CLIENT", "UNPAUSE") })
	time.Sleep(1100 * time.Millisecond) // the denial is due again (denyRecheck)
	for i := range 3 {
		r, err := l.Allow(ctx, "k", lim)
		t.Logf("#%d: allowed %v, backendErr %v, err %v", i, r.Allowed, r.BackendErr, err)
		if err != nil || r.Allowed || r.BackendErr != nil {
			t.Errorf("#%d: not answered by the cached denial: allowed %v, %v", i, r.Allowed, r.BackendErr)
		}
	}
}

// clockHook moves a fake clock by step during every script call while armed.
type clockHook struct {
	clock *fakeClock
	step  time.Duration
	armed atomic.Bool
}

func (h *clockHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *clockHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.armed.Load() {
			h.clock.mu.Lock()
			h.clock.t = h.clock.t.Add(h.step)
			h.clock.mu.Unlock()
		}
		return err
	}
}
func (h *clockHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestDenyCacheSkipsEndedDenial: a denial whose RetryAfter ended while it
// was decided (near a high limit: µs) is not cached: kept, it was due at
// once, and every later decision of the key waited for a probe of it and
// then asked again. One whose RetryAfter outlasts its decision is cached.
func TestDenyCacheSkipsEndedDenial(t *testing.T) {
	srv := redistest.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	h := &clockHook{clock: newFakeClock(), step: 2 * time.Minute}
	rdb.AddHook(h)
	l, err := New(rdb, WithClock(h.clock.Now), WithPrefix(uniquePrefix(t)), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := PerMinute(1)
	if r, err := l.Allow(ctx, "k", lim); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	h.armed.Store(true) // the denial's minute passes while it is decided
	if r, err := l.Allow(ctx, "k", lim); err != nil || r.Allowed || r.BackendErr != nil {
		t.Fatal(r, err)
	}
	if n := l.cache.len(); n != 0 {
		t.Fatalf("cached %d denials that ended while decided", n)
	}
	h.armed.Store(false)
	if r, err := l.Allow(ctx, "j", lim); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	if r, err := l.Allow(ctx, "j", lim); err != nil || r.Allowed {
		t.Fatal(r, err)
	}
	if n := l.cache.len(); n != 1 {
		t.Fatalf("cached %d denials, want the one that outlasts its decision", n)
	}
}

// TestCancelledWaitForgetsDenials: a Wait cancelled while it sleeps gives
// its reservation back, and this Limiter's cached denials of the key go
// with it (WithDenyCache's doc): the next Allow asks Redis.
func TestCancelledWaitForgetsDenials(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var hit atomic.Bool
	l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(patient), WithObserver(func(ev Event) { hit.Store(ev.CacheHit) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, lim := context.Background(), Per(1, time.Minute)
	for i, want := range []bool{true, false, false} {
		if r, err := l.Allow(ctx, "k", lim); err != nil || r.Allowed != want {
			t.Fatalf("allow %d: %+v %v", i, r, err)
		}
	}
	if !hit.Load() {
		t.Fatal("the third Allow was not answered by the cache")
	}
	base := evalCalls(t, rdb)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Wait(wctx, "k", lim) }()
	eventually(t, "the reservation", func() bool { return evalCalls(t, rdb) > base }) // it sleeps a minute
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("wait: %v", err)
	}
	eventually(t, "the give-back", func() bool { return evalCalls(t, rdb) > base+1 }) // here, or behind a late reply
	time.Sleep(50 * time.Millisecond)
	if r, err := l.Allow(ctx, "k", lim); err != nil || r.Allowed || hit.Load() {
		t.Fatalf("after the cancelled Wait: %+v %v, cache hit %v; want a denial asked of Redis", r, err, hit.Load())
	}
}

// TestDenyCacheHerd: a probe admitted with room for fewer than its
// waiters lets that many go, and one more, while the others wait for the
// next probe: a flood's connections do not all go to Redis at once.
func TestDenyCacheHerd(t *testing.T) {
	c := newDenyCache(10)
	lim := []Limit{PerSecond(20)}
	c.put("a", 1, lim, 0, Result{Limit: lim[0], RetryAfter: time.Second, ResetAfter: time.Second})
	at := int64(time.Second) // expired
	_, _, p, wait := c.get("a", 1, lim, at)
	if p == nil || wait {
		t.Fatal("no probe")
	}
	for range 100 { // a flood's waiters
		if _, _, p2, wait := c.get("a", 1, lim, at); p2 != p || !wait {
			t.Fatal("a waiter did not wait for the probe")
		}
	}
	c.settle("a", 1, lim, p, at, true, Result{Allowed: true, Limit: lim[0], Remaining: 1})
	free := 0
	var next *probe
	for range 100 {
		_, ok, p2, wait := c.get("a", 1, lim, at)
		switch {
		case ok:
			t.Fatal("a hit: the denial expired")
		case p2 == nil && !wait:
			if next != nil {
				t.Fatal("a request went freely after the next probe began")
			}
			free++
		case next == nil && !wait:
			next = p2 // the next probe
		case p2 != next || !wait:
			t.Fatal("a request neither went, probed, nor waited for the probe")
		}
	}
	if free != 2 || next == nil {
		t.Fatalf("%d requests went freely, next probe %v; want 2 (Remaining 1, and one more), then one probe", free, next != nil)
	}
}
