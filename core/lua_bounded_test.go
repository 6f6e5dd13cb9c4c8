package core_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// slowCalls returns the calls that Redis's SLOWLOG holds (those of
// slowlog-log-slower-than µs or more), described for a failure.
func slowCalls(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	logs, err := rdb.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range logs {
		args := l.Args
		if len(args) > 4 {
			args = args[:4]
		}
		out = append(out, fmt.Sprintf("%v %v", l.Duration, args))
	}
	return out
}

// redisCPU returns a function that reads the CPU time the main thread of
// rdb's server has used (/proc/<pid>/schedstat: ns on a CPU), or nil where
// it cannot be read. Unlike a call's wall time (SLOWLOG), it does not grow
// while the server waits for a CPU on a busy machine.
func redisCPU(t *testing.T, rdb *redis.Client) func() time.Duration {
	t.Helper()
	info, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	read := func() (time.Duration, bool) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		return time.Duration(ns), err == nil
	}
	if _, ok := read(); !ok || pid == 0 {
		return nil
	}
	return func() time.Duration { d, _ := read(); return d }
}

// longLog adds by hand units units to the sliding log under key, in its
// sorted layout (see algorithms.lua), one member a unit but the second,
// of two units (so that no shortcut for one unit a member applies): the
// members from from on, step µs apart.
func longLog(t *testing.T, rdb *redis.Client, key string, units int64, from, step int64) {
	t.Helper()
	ctx := context.Background()
	held, _ := rdb.ZScore(ctx, key, "#").Result()
	zs := []redis.Z{{Score: held - float64(units), Member: "#"}}
	at := from
	for left := units; left > 0; at += step {
		u := int64(1)
		if len(zs) == 2 {
			u = 2
		}
		zs = append(zs, redis.Z{Score: float64(at), Member: fmt.Sprintf("%d:%d", u, at)})
		left -= u
	}
	for i := 0; i < len(zs); i += 10000 {
		if err := rdb.ZAdd(ctx, key, zs[i:min(i+10000, len(zs))]...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Expire(ctx, key, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestLongLogBoundedCalls makes the costliest calls a sliding log of
// MaxLogCount can take and wants none to hold Redis for 10 ms or more:
// AllowN(MaxLogCount) on an empty log; a decision that finds half of a
// full log's units left the window; a denial of AllowN(MaxLogCount/2) on a
// full log, whose retry is the unit in its middle; a decision after two
// thirds of a log's units (two a member) left at once; a CountIf refund
// (at the time of the decision) of its oldest unit; a refund of half of a
// full log, of every unit, and of every unit but one; a reset; the
// half-gone decision and a refund across MaxLimits logs of MaxLogCount
// units together. Every call's answer is checked. Each call's cost is the
// CPU time Redis's main thread spent while it ran (where /proc can be
// read; else Redis's SLOWLOG, its wall time); the log shows both.
func TestLongLogBoundedCalls(t *testing.T) {
	p := redistest.Start(t, "--slowlog-log-slower-than", "10000", "--slowlog-max-len", "1024")
	rdb := p.Client(t)
	ctx := context.Background()
	const c = core.MaxLogCount
	w := time.Hour
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	now := t0
	l, err := core.New(rdb, core.WithTimeout(time.Minute), core.WithDenyCache(0), core.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	lim := core.Per(c, w)
	key := func(k string) string {
		keys, err := rdb.Keys(ctx, "*{"+k+"}*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("keys of %s: %v, %v", k, keys, err)
		}
		return keys[0]
	}
	cpu := redisCPU(t, rdb)
	var slowest time.Duration
	var slowestCall string
	measure := func(what string, call func() error) {
		t.Helper()
		var before time.Duration
		if cpu != nil {
			before = cpu()
		}
		if err := call(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if cpu != nil {
			d := cpu() - before
			t.Logf("%s: %v of Redis CPU", what, d)
			if d > slowest {
				slowest, slowestCall = d, what
			}
		}
	}
	want := func(r core.Result, err error, allowed bool, remaining int64, retry time.Duration) error {
		if err != nil || r.Allowed != allowed || r.Remaining != remaining || r.RetryAfter != retry || r.BackendErr != nil {
			return fmt.Errorf("allowed %v remaining %d retry %v (%v, %v), want %v %d %v", r.Allowed, r.Remaining, r.RetryAfter, err, r.BackendErr, allowed, remaining, retry)
		}
		return nil
	}
	if err := rdb.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	measure("AllowN(MaxLogCount) on an empty log", func() error {
		r, err := l.AllowN(ctx, "empty", c, lim)
		return want(r, err, true, 0, 0)
	})
	if n, err := rdb.ZScore(ctx, key("empty"), "#").Result(); n != -c || err != nil {
		t.Fatalf("the sorted log holds %v units (%v), want %d", -n, err, int64(c))
	}

	// half of the units a window ago, half half a window later
	us := t0.UnixMicro()
	longLog(t, rdb, "rw:{half}:v2:r1h", c/2, us, 1)
	longLog(t, rdb, "rw:{half}:v2:r1h", c/2, us+int64(w/time.Microsecond)/2, 1)
	if key("half") != "rw:{half}:v2:r1h" {
		t.Fatalf("the test's key is not the Limiter's")
	}
	now = t0.Add(w).Add(time.Duration(c) * time.Microsecond)
	measure("a decision with half of a full log gone", func() error {
		r, err := l.Allow(ctx, "half", lim)
		return want(r, err, true, c/2-1, 0)
	})

	// two thirds of the units, two a member, left a window ago; the first
	// decision after drops them and counts what stays
	now = t0
	zs := []redis.Z{{Score: -c, Member: "#"}}
	for i := int64(0); i < c/3; i++ {
		zs = append(zs, redis.Z{Score: float64(us + i), Member: fmt.Sprintf("2:%d", us+i)})
	}
	for i := int64(0); i < c-c/3*2; i++ {
		at := us + int64(w/time.Microsecond)/2 + i
		zs = append(zs, redis.Z{Score: float64(at), Member: fmt.Sprintf("1:%d", at)})
	}
	if err := rdb.ZAdd(ctx, "rw:{thirds}:v2:r1h", zs...).Err(); err != nil {
		t.Fatal(err)
	}
	now = t0.Add(w).Add(time.Duration(c) * time.Microsecond)
	measure("a decision with two thirds of a full log, two units a member, gone", func() error {
		r, err := l.Allow(ctx, "thirds", lim)
		return want(r, err, true, c/3*2-1, 0)
	})
	now = t0
	longLog(t, rdb, "rw:{halves}:v2:r1h", c, us-c-1000, 1)
	measure("a refund of half of a full log", func() error { return l.Refund(ctx, "halves", c/2, lim) })
	if r, err := l.Peek(ctx, "halves", lim); want(r, err, true, c/2, 0) != nil {
		t.Fatal(want(r, err, true, c/2, 0))
	}
	now = t0.Add(w).Add(time.Duration(c) * time.Microsecond)

	// the same across MaxLimits logs of MaxLogCount units together (a
	// call's work grows with the units of all its logs)
	var logs []core.Limit
	for i := range core.MaxLimits {
		wi := w + time.Duration(i)*time.Second
		logs = append(logs, core.Per(c/core.MaxLimits, wi))
		name := fmt.Sprintf("rw:{logs}:v2:r%ds", int64(wi/time.Second))
		if i == 0 {
			name = "rw:{logs}:v2:r1h"
		}
		longLog(t, rdb, name, c/core.MaxLimits/2, us, 1)
		longLog(t, rdb, name, c/core.MaxLimits/2, us+int64(wi/time.Microsecond)/2, 1)
	}
	now = t0.Add(w).Add(core.MaxLimits * time.Second).Add(time.Duration(c) * time.Microsecond)
	measure("a decision with half of MaxLimits full logs gone", func() error {
		r, err := l.Allow(ctx, "logs", logs...)
		return want(r, err, true, c/core.MaxLimits/2-1, 0)
	})
	measure("a refund of every unit of MaxLimits logs but one", func() error { return l.Refund(ctx, "logs", c/core.MaxLimits/2, logs...) })
	if r, err := l.Peek(ctx, "logs", logs...); want(r, err, true, c/core.MaxLimits-1, 0) != nil {
		t.Fatal(want(r, err, true, c/core.MaxLimits-1, 0))
	}

	now = t0
	oldest := us - c - 1000
	longLog(t, rdb, "rw:{full}:v2:r1h", c, oldest, 1)
	// the units are 1 µs apart, the second member holding two: the
	// c/2-th oldest unit is at oldest + c/2 - 2
	measure("a denial of AllowN(MaxLogCount/2) on a full log", func() error {
		r, err := l.AllowN(ctx, "full", c/2, lim)
		return want(r, err, false, 0, w+time.Duration(oldest+c/2-2-us)*time.Microsecond)
	})
	algorithms, err := os.ReadFile("internal/redisstore/lua/algorithms.lua")
	if err != nil {
		t.Fatal(err)
	}
	refund, err := os.ReadFile("internal/redisstore/lua/refund.lua")
	if err != nil {
		t.Fatal(err)
	}
	measure("a CountIf refund of the oldest unit of a full log", func() error {
		// refund.lua: n, now, at, then the limit: algorithm, count, window, precision
		got, err := rdb.Eval(ctx, string(algorithms)+string(refund), []string{"rw:{full}:v2:r1h"},
			1, us, oldest, 0, c, int64(w/time.Microsecond), int64(w/time.Microsecond)/60).Int64Slice()
		if err != nil || len(got) != 1 || got[0] != 1 {
			return fmt.Errorf("refunded %v, %v, want 1", got, err)
		}
		return nil
	})
	measure("a refund of every unit of a full log", func() error { return l.Refund(ctx, "full", c, lim) })
	if n, err := rdb.Exists(ctx, "rw:{full}:v2:r1h").Result(); n != 0 || err != nil {
		t.Fatalf("the refunded log is still there (%d, %v)", n, err)
	}
	longLog(t, rdb, "rw:{full}:v2:r1h", c, oldest, 1)
	measure("a refund of every unit of a full log but one", func() error { return l.Refund(ctx, "full", c-1, lim) })
	if r, err := l.Peek(ctx, "full", lim); want(r, err, true, c-1, 0) != nil {
		t.Fatal(want(r, err, true, c-1, 0))
	}
	longLog(t, rdb, "rw:{full}:v2:r1h", c-1, oldest+1, 1)
	measure("Reset of a full log", func() error { return l.Reset(ctx, "full", lim) })
	if r, err := l.Peek(ctx, "full", lim); want(r, err, true, c, 0) != nil {
		t.Fatal(want(r, err, true, c, 0))
	}
	slow := slowCalls(t, rdb)
	if cpu == nil {
		if len(slow) > 0 {
			t.Fatalf("%d calls of 10 ms or more: %v", len(slow), slow)
		}
		return
	}
	t.Logf("the most CPU a call took in Redis: %v (%s); SLOWLOG (wall time, 10 ms or more): %v", slowest, slowestCall, slow)
	if slowest >= 10*time.Millisecond {
		t.Fatalf("%s held Redis for %v of CPU, want under 10ms", slowestCall, slowest)
	}
}

// twins are a Limiter on a real Redis and a memory Limiter on one clock
// the test moves, without deny cache, for tests that make the same
// decisions in both and want the same answers.
type twins struct {
	rdb    *redis.Client
	rl, ml *core.Limiter
	mu     sync.Mutex
	now    time.Time
}

func newTwins(t *testing.T) *twins {
	w := &twins{rdb: redistest.Start(t).Client(t), now: time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)}
	clock := func() time.Time {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.now
	}
	opts := []core.Option{core.WithClock(clock), core.WithDenyCache(0), core.WithTimeout(time.Minute)}
	var err error
	if w.rl, err = core.New(w.rdb, opts...); err != nil {
		t.Fatal(err)
	}
	w.ml = core.NewMemory(opts...)
	return w
}

// advance moves the clock by d (back, when negative).
func (w *twins) advance(d time.Duration) {
	w.mu.Lock()
	w.now = w.now.Add(d)
	w.mu.Unlock()
}

// The operations of twins.same.
const (
	opAllow  = iota // AllowN of n
	opPeek          // Peek
	opRefund        // Refund of n, then Peek
)

// same makes operation op on key under lims in both Limiters and fails
// unless both succeed, Redis's without the failure mode, with the same
// Result.
func (w *twins) same(t *testing.T, step, op int, key string, n int64, lims []core.Limit) {
	t.Helper()
	ctx := context.Background()
	var what string
	var mr, rr core.Result
	var merr, rerr error
	switch op {
	case opAllow:
		what = fmt.Sprintf("allow %d", n)
		mr, merr = w.ml.AllowN(ctx, key, n, lims...)
		rr, rerr = w.rl.AllowN(ctx, key, n, lims...)
	case opPeek:
		what = "peek"
		mr, merr = w.ml.Peek(ctx, key, lims...)
		rr, rerr = w.rl.Peek(ctx, key, lims...)
	default:
		what = fmt.Sprintf("refund %d", n)
		merr = w.ml.Refund(ctx, key, n, lims...)
		rerr = w.rl.Refund(ctx, key, n, lims...)
		if merr == nil && rerr == nil {
			mr, merr = w.ml.Peek(ctx, key, lims...)
			rr, rerr = w.rl.Peek(ctx, key, lims...)
		}
	}
	if merr != nil || rerr != nil {
		t.Fatalf("step %d %s %s %v: memory %v, redis %v", step, what, key, lims, merr, rerr)
	}
	if rr.BackendErr != nil { // answered by the failure mode
		t.Fatalf("step %d %s %v: %v", step, what, lims, rr.BackendErr)
	}
	if mr.Allowed != rr.Allowed || mr.Remaining != rr.Remaining || mr.RetryAfter != rr.RetryAfter ||
		mr.ResetAfter != rr.ResetAfter || mr.Limit != rr.Limit {
		t.Fatalf("step %d %s %s %v:\nmemory %+v\nredis  %+v", step, what, key, lims, mr, rr)
	}
}

// TestFreshKeysMatchMemory makes the same decisions with the scripts and
// the memory backend at the same times, and wants the same answers, on
// many keys used once and a few used again (so that the scripts write
// both keys read as missing, with SET NX, and keys that hold units), under
// each algorithm, one or two limits, Peeks, refunds, and AllowN of up to 600
// units (more than a fresh log's compact value holds).
func TestFreshKeysMatchMemory(t *testing.T) {
	w := newTwins(t)
	rng := rand.New(rand.NewPCG(28, 1))
	algs := []core.Algorithm{core.SlidingLog, core.SlidingCounter, core.SlidingBuckets}
	fresh := 0
	for step := range 3000 {
		alg := algs[rng.IntN(len(algs))]
		// windows longer than the test's clock moves in all (under an
		// hour): Redis expires keys by its own clock, which hardly moves
		lims := []core.Limit{core.Per(int64(5+rng.IntN(2000)), time.Duration(60+rng.IntN(120))*time.Minute).With(alg)}
		if rng.IntN(8) == 0 {
			lims = append(lims, core.Per(int64(3+rng.IntN(50)), 4*time.Hour).With(algs[rng.IntN(len(algs))]))
		}
		key := fmt.Sprintf("hot%d", rng.IntN(5))
		if rng.IntN(3) > 0 {
			fresh++
			key = fmt.Sprintf("fresh%d", fresh)
		}
		n := int64(1 + rng.IntN(3))
		if rng.IntN(20) == 0 {
			n = int64(400 + rng.IntN(200))
		}
		switch op := rng.IntN(10); {
		case op < 7:
			w.same(t, step, opAllow, key, n, lims)
		case op < 8:
			w.same(t, step, opPeek, key, n, lims)
		default:
			w.same(t, step, opRefund, key, n, lims)
		}
		w.advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
	}
}

// TestFreshLogOfManyUnits records more units at once on an empty log than
// its compact value holds (504 of one byte) and wants every one counted
// by the next decisions.
func TestFreshLogOfManyUnits(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	l, err := core.New(rdb, core.WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lim := core.Per(core.MaxLogCount, time.Hour)
	for i, n := range []int64{505, 1000, 600} {
		key := fmt.Sprintf("k%d", i)
		if r, err := l.AllowN(ctx, key, n, lim); err != nil || !r.Allowed || r.Remaining != lim.Count-n || r.BackendErr != nil {
			t.Fatalf("allow %d: %+v, %v", n, r, err)
		}
		r, err := l.Peek(ctx, key, lim)
		if err != nil || r.Remaining != lim.Count-n || r.BackendErr != nil {
			t.Fatalf("peek after %d: remaining %d, %v, want %d", n, r.Remaining, err, lim.Count-n)
		}
		if r, err := l.AllowN(ctx, key, 3, lim); err != nil || r.Remaining != lim.Count-n-3 || r.BackendErr != nil {
			t.Fatalf("allow 3 after %d: remaining %d, %v, want %d", n, r.Remaining, err, lim.Count-n-3)
		}
	}
}

// TestSortedLogMatchesMemory drives sliding logs long enough to be sorted
// sets through the scripts and the memory backend at the same times and
// wants the same answers: AllowN of up to 400 units, Peeks, refunds of up
// to 3,000 units (one step in twenty), one or two limits, units leaving
// the window as the clock moves, pauses longer than a window (after which
// the log is compact again), and a clock that steps back a little (so that
// units go before later ones).
func TestSortedLogMatchesMemory(t *testing.T) {
	w := newTwins(t)
	rng := rand.New(rand.NewPCG(28, 2))
	// about 22,000 units a window asked: sorted, and its oldest units
	// leaving all the time; the two logs count MaxLogCount units together
	long, longer := core.Per(core.MaxLogCount*3/4, 20*time.Second), core.Per(core.MaxLogCount/4, time.Minute)
	sorted := 0 // the steps after which the long log was a sorted set
	for step := range 1500 {
		lims := []core.Limit{long}
		if rng.IntN(3) == 0 {
			lims = append(lims, longer)
		}
		n := int64(1 + rng.IntN(400))
		switch op := rng.IntN(20); {
		case op < 17:
			w.same(t, step, opAllow, "tenant", n, lims)
		case op < 19:
			w.same(t, step, opPeek, "tenant", n, lims)
		default:
			w.same(t, step, opRefund, "tenant", int64(1+rng.IntN(3000)), lims)
		}
		if w.rdb.Type(context.Background(), "rw:{tenant}:v2:r20s").Val() == "zset" {
			sorted++
		}
		switch r := rng.IntN(1000); {
		case r < 990:
			w.advance(time.Duration(rng.IntN(300_000)) * time.Microsecond)
		case r < 993:
			w.advance(time.Minute + time.Duration(rng.IntN(100_000))*time.Microsecond)
		default:
			w.advance(-time.Duration(rng.IntN(5000)) * time.Microsecond)
		}
	}
	if sorted < 500 {
		t.Fatalf("the long log was sorted after %d steps of 1500: the test misses its point", sorted)
	}
}

// TestCounterClockBackMatchesMemory: a sliding counter read (a Peek, a
// denial) in a later window, then decided after the clock stepped back into
// the window of its last write, answers as the script does: its counts
// still stand (the memory backend forgot them when a read moved its window).
func TestCounterClockBackMatchesMemory(t *testing.T) {
	w := newTwins(t)
	lims := []core.Limit{core.PerSecond(4).With(core.SlidingCounter)}
	w.same(t, 0, opAllow, "c", 4, lims)
	w.advance(time.Second + 500*time.Microsecond)
	w.same(t, 1, opPeek, "c", 1, lims)
	w.advance(-time.Millisecond)
	w.same(t, 2, opAllow, "c", 1, lims)
	w.same(t, 3, opAllow, "c", 4, lims)
}

// TestBucketsClockBackMatchesMemory: sliding buckets whose clock steps
// back across a bucket's start keep the units of the bucket now ahead of
// it, as the memory backend does: the limit never over-admits (the script
// read such a field as long gone, deleted it, and admitted Count again).
func TestBucketsClockBackMatchesMemory(t *testing.T) {
	w := newTwins(t)
	lims := []core.Limit{{Count: 2, Window: time.Second, Algorithm: core.SlidingBuckets, Precision: 10 * time.Millisecond}}
	w.advance(10*time.Millisecond + 500*time.Microsecond)
	w.same(t, 0, opAllow, "b", 2, lims)
	step := 1
	for _, d := range []time.Duration{-time.Millisecond, 2 * time.Millisecond} {
		w.advance(d)
		for range 3 {
			w.same(t, step, opAllow, "b", 1, lims)
			step++
		}
	}
	w.same(t, step, opPeek, "b", 1, lims)
}

// TestBucketsSummedClockBackMatchesMemory: sliding buckets that keep their
// sum (more than BUCKETS_SUMMED buckets) keep a bucket ahead of a clock that
// stepped back as their newest: an add behind it named the current bucket
// the newest, and once that left, the whole key went with the bucket ahead.
func TestBucketsSummedClockBackMatchesMemory(t *testing.T) {
	w := newTwins(t)
	lims := []core.Limit{{Count: 100, Window: time.Second, Algorithm: core.SlidingBuckets, Precision: 10 * time.Millisecond}}
	w.advance(5 * time.Millisecond)
	step := 0
	for range 10 { // 10 buckets of 1 unit: the hash keeps its sum
		w.same(t, step, opAllow, "b", 1, lims)
		step++
		w.advance(10 * time.Millisecond)
	}
	w.same(t, step, opAllow, "b", 50, lims) // bucket 10
	w.advance(-10 * time.Millisecond)       // back into bucket 9
	w.same(t, step+1, opAllow, "b", 1, lims)
	w.advance(time.Second + 10*time.Millisecond) // bucket 9 has left, bucket 10 not yet
	w.same(t, step+2, opPeek, "b", 1, lims)
}
