package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestLogValueMatchesMemory drives the sliding log of the scripts and that
// of the memory store through the same random calls, at the same times,
// and wants the same answers and the same units stored: decisions of 1 to
// 8 units under two limits (one long enough for the ring layout, one
// compact), Peeks, reservations (which go into the future, so that later
// decisions insert before them), their releases, refunds of the newest
// units and of a decision's units, plan changes (another Count over the
// same stored log), pauses longer than a window, and the clock going
// back a little. Every stored log keeps a TTL.
func TestLogValueMatchesMemory(t *testing.T) {
	againstMemory(t, 8, [2]string{"compact values", "rings"}, checkLogAgainstMemory)
}

// allowBoth makes the same decision in the memory store (mq) and the
// scripts (rq), the test's step, and fails unless both answer alike.
func allowBoth(t *testing.T, ms *memoryStore, rs *redisStore, mq, rq *query, step int, what string) {
	t.Helper()
	ctx := context.Background()
	if err := ms.allow(ctx, mq); err != nil {
		t.Fatal(err)
	}
	if err := rs.allow(ctx, rq); err != nil {
		t.Fatalf("step %d %s: %v", step, what, err)
	}
	if !sameAnswer(mq, rq) {
		t.Fatalf("step %d %s at %d: memory %s, redis %s", step, what, mq.now, answer(mq), answer(rq))
	}
}

// sameAnswer reports whether two decisions answered alike: allowed,
// blocked, banned, every limit's state and the time they were made at.
func sameAnswer(a, b *query) bool {
	return a.allowed == b.allowed && a.blocked == b.blocked && a.banned == b.banned &&
		slices.Equal(a.states, b.states) && a.at == b.at
}

// answer describes a decision's answer (see sameAnswer) for a test's
// failure.
func answer(q *query) string {
	return fmt.Sprintf("%v %+v blocked %v banned %v at %d", q.allowed, q.states, q.blocked, q.banned, q.at)
}

// refundBoth makes the same refund in the memory store (mq) and the
// scripts (rq).
func refundBoth(t *testing.T, ms *memoryStore, rs *redisStore, mq, rq *query, step int, what string) {
	t.Helper()
	ctx := context.Background()
	if err := ms.refund(ctx, mq); err != nil {
		t.Fatal(err)
	}
	if err := rs.refund(ctx, rq); err != nil {
		t.Fatalf("step %d %s: %v", step, what, err)
	}
}

// againstMemory runs check for each seed, the seeds in parallel (each
// check under its own prefix): 2 seeds on miniredis, and seeds on real
// Redis. check counts the stored values it compares in seen, of two kinds
// (named by kinds), and each server must show both kinds at least 100
// times.
func againstMemory(t *testing.T, seeds uint64, kinds [2]string, check func(t *testing.T, rdb redis.Scripter, seed uint64, seen *[2]atomic.Int64)) {
	for _, server := range diffServers(seeds) {
		t.Run(server.name, func(t *testing.T) {
			rdb := server.new(t)
			var seen [2]atomic.Int64
			t.Run("seeds", func(t *testing.T) { // returns when every seed has
				for seed := range server.seeds {
					t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
						t.Parallel()
						check(t, rdb, seed, &seen)
					})
				}
			})
			a, b := seen[0].Load(), seen[1].Load()
			t.Logf("%d %s and %d %s seen", a, kinds[0], b, kinds[1])
			if a < 100 || b < 100 {
				t.Fatalf("seen %d %s and %d %s, want both", a, kinds[0], b, kinds[1])
			}
		})
	}
}

// diffServer is a server a differential test runs its seeds on.
type diffServer struct {
	name  string
	seeds uint64
	new   func(t *testing.T) redis.Scripter
}

// diffServers returns the servers of the differential tests: miniredis,
// with 2 seeds, and real Redis, with seeds.
func diffServers(seeds uint64) []diffServer {
	return []diffServer{
		{"miniredis", 2, func(t *testing.T) redis.Scripter {
			c := redis.NewClient(&redis.Options{Addr: redistest.Mini(t).Addr()})
			t.Cleanup(func() { c.Close() })
			return c
		}},
		{"redis", seeds, func(t *testing.T) redis.Scripter { return redistest.New(t).Client(t) }},
	}
}

func checkLogAgainstMemory(t *testing.T, rdb redis.Scripter, seed uint64, layouts *[2]atomic.Int64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	rs := newRedisStore(rdb, uniquePrefix(t), 0)
	ms := newMemoryStore(func() int64 { panic("the test passes every time") })
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixMicro()
	// windows long enough that real Redis never expires a key (by its own
	// clock) before the test's clock has moved past its units: the test's
	// clock moves far faster
	long, short := 100*time.Second, 2*time.Second
	longCounts := []int64{400, 900, 250} // hundreds of units: the ring layout
	limits := func() []Limit {
		return []Limit{Per(longCounts[rng.IntN(len(longCounts))], long), Per(int64(10+rng.IntN(30)), short)}
	}
	type held struct { // a reservation made, to release later
		n      int64
		limits []Limit
		r      reservation
	}
	var reserved []held
	var decided []int64 // times of admitted decisions
	for step := range 2000 {
		lims := limits()
		n := int64(1 + rng.IntN(8))
		if rng.IntN(10) == 0 {
			lims = lims[:1] // the long log alone
		}
		mq := &query{key: "k", n: n, limits: lims, now: now}
		rq := &query{key: "k", n: n, limits: lims, now: now}
		what := ""
		switch op := rng.IntN(100); {
		case op < 60:
			mq.commit = rng.IntN(10) > 0
			rq.commit = mq.commit
			what = fmt.Sprintf("allow %d commit %v", n, mq.commit)
			allowBoth(t, ms, rs, mq, rq, step, what)
			if mq.allowed && mq.commit {
				decided = append(decided, now)
			}
		case op < 75:
			longest := int64(-1)
			if rng.IntN(2) == 0 {
				longest = rng.Int64N(int64(2 * long / time.Microsecond))
			}
			what = fmt.Sprintf("reserve %d within %d", n, longest)
			mr, err := ms.reserve(ctx, mq, longest)
			if err != nil {
				t.Fatal(err)
			}
			rr, err := rs.reserve(ctx, rq, longest)
			if err != nil {
				t.Fatalf("step %d %s: %v", step, what, err)
			}
			if mr.ok != rr.ok || mr.wait != rr.wait || (mr.ok && mr.at != rr.at) {
				t.Fatalf("step %d %s at %d: memory %+v, redis %+v", step, what, now, mr, rr)
			}
			if mr.ok {
				reserved = append(reserved, held{n, lims, mr})
			}
		case op < 82 && len(reserved) > 0:
			i := rng.IntN(len(reserved))
			res := reserved[i]
			reserved = slices.Delete(reserved, i, i+1)
			what = fmt.Sprintf("release %d at %d", res.n, res.r.at)
			mq.n, mq.limits, rq.n, rq.limits = res.n, res.limits, res.n, res.limits
			if err := ms.release(ctx, mq, res.r); err != nil {
				t.Fatal(err)
			}
			if err := rs.release(ctx, rq, res.r); err != nil {
				t.Fatalf("step %d %s: %v", step, what, err)
			}
		case op < 90:
			if rng.IntN(2) == 0 && len(decided) > 0 {
				mq.at = decided[rng.IntN(len(decided))]
				rq.at = mq.at
			}
			what = fmt.Sprintf("refund %d at %d", n, mq.at)
			refundBoth(t, ms, rs, mq, rq, step, what)
		default:
			what = "nothing"
		}
		compareLogs(t, fmt.Sprintf("step %d (%s)", step, what), rdb, rs, ms, now, layouts, long, short)
		switch r := rng.IntN(1000); {
		case r < 700:
			now += rng.Int64N(100_000) // µs
		case r < 995:
			now += rng.Int64N(int64(short / time.Microsecond))
		case r < 997:
			now += int64(long/time.Microsecond) + rng.Int64N(100_000)
		default:
			now -= rng.Int64N(5000) // a clock that steps back
		}
	}
}

// compareLogs fails unless both stores hold the same units that count at
// now, in both logs, and Redis's logs have a TTL. It counts the layouts of
// the values in layouts.
func compareLogs(t *testing.T, step string, rdb redis.Scripter, rs *redisStore, ms *memoryStore, now int64, layouts *[2]atomic.Int64, windows ...time.Duration) {
	t.Helper()
	ctx := context.Background()
	c := rdb.(redis.Cmdable)
	for _, w := range windows {
		key := storageKey(keyTag(rs.prefix, "k"), Per(1, w))
		stored, err := storedLog(ctx, c, key)
		if err != nil {
			t.Fatalf("%s: %s: %v", step, key, err)
		}
		oldest := now - micros(w)
		var got, want []int64
		for _, u := range stored {
			if u > oldest {
				got = append(got, u)
			}
		}
		if !slices.IsSorted(stored) {
			t.Fatalf("%s: %s holds units out of order: %v", step, key, stored)
		}
		sh := ms.shard("k")
		sh.mu.Lock()
		if mk := sh.keys["k"]; mk != nil {
			if st := mk.find(Per(1, w)); st != nil {
				for _, u := range st.log {
					if u > oldest {
						want = append(want, u)
					}
				}
			}
		}
		sh.mu.Unlock()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: %s holds %d units that count, memory %d:\n%v\n%v", step, key, len(got), len(want), got, want)
		}
		if len(stored) > 0 {
			if b, _ := c.GetRange(ctx, key, 0, 0).Bytes(); len(b) == 1 && b[0] >= 16 {
				layouts[1].Add(1)
			} else {
				layouts[0].Add(1)
			}
			if ttl := c.PTTL(ctx, key).Val(); ttl == -1 { // -2: gone; 0: about to go
				t.Fatalf("%s: %s has no TTL: %v", step, key, ttl)
			}
		}
	}
}
