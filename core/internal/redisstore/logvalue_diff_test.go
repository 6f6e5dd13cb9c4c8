package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/core/internal/storetest"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestLogValueMatchesMemory drives the sliding log of the scripts and that
// of the memory store through the same random calls, at the same times,
// and wants the same answers and the same units stored: decisions of 1 to
// 8 units under two limits (one long enough for the sorted set, one
// compact), Peeks, reservations (which go into the future, so that later
// decisions insert before them), their releases, refunds of the newest
// units and of a decision's units, plan changes (another Count over the
// same stored log), pauses longer than a window, and the clock going
// back a little. Every stored log keeps a TTL.
func TestLogValueMatchesMemory(t *testing.T) {
	againstMemory(t, 8, [2]string{"compact values", "sorted sets"}, checkLogAgainstMemory)
}

// allowBoth makes the decision r, the test's step, in the memory store and
// in the scripts, fails unless both answer alike, and returns the answer.
func allowBoth(t *testing.T, ms *memstore.Store, rs *Store, r store.Request, step int, what string) store.Decision {
	t.Helper()
	ctx := context.Background()
	md, err := ms.Allow(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := rs.Allow(ctx, r)
	if err != nil {
		t.Fatalf("step %d %s: %v", step, what, err)
	}
	if !storetest.Same(md, rd, len(r.Limits)) {
		t.Fatalf("step %d %s at %d: memory %s, redis %s", step, what, r.Now, answer(md, len(r.Limits)), answer(rd, len(r.Limits)))
	}
	return md
}

// answer describes a decision on n limits for a test's failure.
func answer(d store.Decision, _ int) string {
	return fmt.Sprintf("%v %+v blocked %v banned %v at %d", d.Allowed, d.States, d.Blocked, d.Banned, d.At)
}

// refundBoth makes the same refund r in the memory store and the scripts.
func refundBoth(t *testing.T, ms *memstore.Store, rs *Store, r store.Request, step int, what string) {
	t.Helper()
	ctx := context.Background()
	if err := ms.Refund(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := rs.Refund(ctx, r); err != nil {
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

// forSeeds runs check for each seed of each server (see diffServers), the
// seeds of a server in parallel (each check under its own prefix).
func forSeeds(t *testing.T, seeds uint64, check func(t *testing.T, rdb redis.Scripter, seed uint64)) {
	for _, server := range diffServers(seeds) {
		t.Run(server.name, func(t *testing.T) {
			rdb := server.new(t)
			for seed := range server.seeds {
				t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
					t.Parallel()
					check(t, rdb, seed)
				})
			}
		})
	}
}

// requireTTLs fails unless every key under each prefix has a TTL (PTTL >
// 0; a key gone since it was listed is no failure).
func requireTTLs(t *testing.T, rdb redis.Scripter, prefixes ...string) {
	t.Helper()
	ctx := context.Background()
	c := rdb.(redis.UniversalClient)
	for _, p := range prefixes {
		keys, err := c.Keys(ctx, p+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if ttl := c.PTTL(ctx, k).Val(); ttl == -1 { // -2: gone since KEYS
				t.Fatalf("%s has no TTL", k)
			}
		}
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
	rs := New(rdb, uniquePrefix(t))
	ms := memstore.New(func() int64 { panic("the test passes every time") })
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixMicro()
	// windows long enough that real Redis never expires a key (by its own
	// clock) before the test's clock has moved past its units: the test's
	// clock moves far faster
	long, short := 100*time.Second, 2*time.Second
	longCounts := []int64{400, 900, 250} // hundreds of units: sorted sets
	limits := func() []store.Limit {
		return []store.Limit{per(longCounts[rng.IntN(len(longCounts))], long), per(int64(10+rng.IntN(30)), short)}
	}
	type held struct { // a reservation made, to release later
		n      int64
		limits []store.Limit
		r      store.Reservation
	}
	var reserved []held
	var decided []int64 // times of admitted decisions
	var wrote written
	for step := range 2000 {
		lims := limits()
		n := int64(1 + rng.IntN(8))
		if rng.IntN(10) == 0 {
			lims = lims[:1] // the long log alone
		}
		r := store.Request{Key: "k", N: n, Limits: lims, Now: now}
		what := ""
		op, began, before := rng.IntN(100), time.Now(), wrote
		if op >= 60 && op < 90 { // a reservation, release or refund may write: the TTLs it sets run from here
			wrote = written{now, began}
		}
		switch {
		case op < 60:
			r.Commit = rng.IntN(10) > 0
			what = fmt.Sprintf("allow %d commit %v", n, r.Commit)
			if d := allowBoth(t, ms, rs, r, step, what); d.Allowed && r.Commit {
				decided = append(decided, now)
				wrote = written{now, began}
			}
		case op < 75:
			longest := int64(-1)
			if rng.IntN(2) == 0 {
				longest = rng.Int64N(int64(2 * long / time.Microsecond))
			}
			what = fmt.Sprintf("reserve %d within %d", n, longest)
			mr, err := ms.Reserve(ctx, r, longest)
			if err != nil {
				t.Fatal(err)
			}
			rr, err := rs.Reserve(ctx, r, longest)
			if err != nil {
				t.Fatalf("step %d %s: %v", step, what, err)
			}
			if mr.OK != rr.OK || mr.Wait != rr.Wait || (mr.OK && mr.At != rr.At) {
				t.Fatalf("step %d %s at %d: memory %+v, redis %+v", step, what, now, mr, rr)
			}
			if mr.OK {
				reserved = append(reserved, held{n, lims, mr})
			}
		case op < 82 && len(reserved) > 0:
			i := rng.IntN(len(reserved))
			res := reserved[i]
			reserved = slices.Delete(reserved, i, i+1)
			what = fmt.Sprintf("release %d at %d", res.n, res.r.At)
			r.N, r.Limits = res.n, res.limits
			if err := ms.Release(ctx, r, res.r); err != nil {
				t.Fatal(err)
			}
			if err := rs.Release(ctx, r, res.r); err != nil {
				t.Fatalf("step %d %s: %v", step, what, err)
			}
		case op < 90:
			if rng.IntN(2) == 0 && len(decided) > 0 {
				r.At = decided[rng.IntN(len(decided))]
			}
			what = fmt.Sprintf("refund %d at %d", n, r.At)
			refundBoth(t, ms, rs, r, step, what)
		default:
			what = "nothing"
		}
		// a log Redis let expire (the machine stalled) holds fewer units
		// than memory's until they leave the window: move past them, so
		// that the next decisions count the same
		if past := compareLogs(t, fmt.Sprintf("step %d (%s)", step, what), rdb, rs, ms, now, [2]written{before, wrote}, layouts, long, short); past > now {
			now = past
		}
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

// written is when a step last wrote, on the test's clock (µs) and on the
// real one: the TTLs it set run out in real time.
type written struct {
	now  int64
	real time.Time
}

// compareLogs fails unless both stores hold the same units that count at
// now, in both logs, and Redis's logs have a TTL. Redis's TTLs run on its
// own clock, not the test's: a log whose units all left the window within
// the real time since the last write (and a ms of PX's rounding) may be
// gone already. wrote holds the last write before the step and the last
// one now: a key that expired before the step may hold only the units
// the step wrote to it again. It counts the layouts of the values in
// layouts, and returns a time when every unit Redis let expire has left
// its window (and 10ms more, for a clock that steps back), or 0.
func compareLogs(t *testing.T, step string, rdb redis.Scripter, rs *Store, ms *memstore.Store, now int64, wrote [2]written, layouts *[2]atomic.Int64, windows ...time.Duration) (past int64) {
	t.Helper()
	ctx := context.Background()
	c := rdb.(redis.Cmdable)
	for _, w := range windows {
		key := storageKey(keyTag(rs.prefix, "k"), per(1, w))
		stored, layout, err := readLog(ctx, c, key)
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
		for _, u := range memLog(t, ms, "k", w, now) {
			if u > oldest {
				want = append(want, u)
			}
		}
		// gone by Redis's clock: the TTL set at a write (the newest unit's
		// end) has run out in real time, however slow the machine
		gone := func(units []int64, at written) bool {
			return len(units) > 0 && units[len(units)-1]+micros(w)-at.now <= micros(time.Since(at.real)+time.Millisecond)
		}
		expired := len(stored) == 0 && gone(want, wrote[1])
		// or gone before the step, which then wrote its own units alone
		if k := len(want) - len(got); !expired && len(got) > 0 && k > 0 && slices.Equal(got, want[k:]) {
			expired = gone(want[:k], wrote[0])
		}
		if !slices.Equal(got, want) && !expired {
			t.Fatalf("%s: %s holds %d units that count, memory %d:\n%v\n%v", step, key, len(got), len(want), got, want)
		}
		if k := len(want) - len(got); expired && k > 0 {
			past = max(past, want[k-1]+micros(w)+10_000)
			t.Logf("%s: %s expired in real time before its units left the window (%d of %d gone)", step, key, k, len(want))
		}
		if len(stored) > 0 {
			layouts[layout].Add(1)
			if ttl := c.PTTL(ctx, key).Val(); ttl == -1 { // -2: gone; 0: about to go
				t.Fatalf("%s: %s has no TTL: %v", step, key, ttl)
			}
		}
	}
	return past
}

// readLog returns the times in µs of the units a sliding log holds, oldest
// first, and its layout (see algorithms.lua): 0 compact, 1 sorted; none
// for a missing key. A sorted log's member '#' must hold minus the units
// of the others.
func readLog(ctx context.Context, c redis.Cmdable, key string) ([]int64, int, error) {
	switch typ := c.Type(ctx, key).Val(); typ {
	case "none":
		return nil, 0, nil
	case "string":
		v, err := c.Get(ctx, key).Bytes()
		if errors.Is(err, redis.Nil) { // expired since TYPE
			return nil, 0, nil
		}
		if err != nil {
			return nil, 0, err
		}
		times, err := decodeLog(v)
		return times, 0, err
	case "zset":
		zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			return nil, 1, err
		}
		if len(zs) < 2 || zs[0].Member != "#" {
			return nil, 1, fmt.Errorf("sorted log of %d members without '#' first", len(zs))
		}
		var times []int64
		for _, z := range zs[1:] {
			var at, units int64
			if _, err := fmt.Sscanf(z.Member.(string), "%d:%d", &units, &at); err != nil || at != int64(z.Score) || units < 1 {
				return nil, 1, fmt.Errorf("sorted log member %q scored %v", z.Member, z.Score)
			}
			for range units {
				times = append(times, at)
			}
		}
		if int64(-zs[0].Score) != int64(len(times)) {
			return nil, 1, fmt.Errorf("sorted log of %d units says %v", len(times), -zs[0].Score)
		}
		return times, 1, nil
	default:
		return nil, 0, fmt.Errorf("a log of type %s", typ)
	}
}

// memLog returns the times in µs of the units that ms holds in key's
// sliding log of window w, oldest first, read through the seam: Peeks a
// day before now (the test's clock never goes back that far), at which
// every unit held counts and none is dropped. A Peek of one unit under a
// Count c, with used units held, is retried when the (used-c+1)th newest
// unit leaves the window: its Retry tells that unit's time; under a Count
// larger than any log, its Remaining tells used.
func memLog(t *testing.T, ms *memstore.Store, key string, w time.Duration, now int64) []int64 {
	t.Helper()
	ctx := context.Background()
	at := now - int64(24*time.Hour/time.Microsecond)
	const huge = 1 << 40
	d, err := ms.Allow(ctx, store.Request{Key: key, N: 1, Limits: []store.Limit{per(huge, w)}, Now: at})
	if err != nil {
		t.Fatal(err)
	}
	used := huge - d.States[0].Remaining
	units := make([]int64, used)
	for c := int64(1); c <= used; c++ {
		d, err := ms.Allow(ctx, store.Request{Key: key, N: 1, Limits: []store.Limit{per(c, w)}, Now: at})
		if err != nil {
			t.Fatal(err)
		}
		units[used-c] = d.States[0].Retry - micros(w) + at
	}
	return units
}
