package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// TestLoneMatchesGeneral makes random decisions of one log, counter or
// buckets limit, which allow.lua answers by allow_one (its own lean path),
// and the same decisions with a second limit that never binds, which go
// through decide, on another key; and wants the same answers under the
// shared limit. The decisions cover units of 1 to 4 (more than a limit's
// Count too), Peeks, blocks, reservations (units in the future: the lean
// path hands them over), keys new and used (and phases in which the paths
// expect keys missing, see fresh_hint), times that stay, move within a
// window or jump past it, logs long enough to leave the compact layout,
// hashes of more buckets than are kept unsummed, and a key of another type
// under each algorithm. Every key keeps a TTL.
func TestLoneMatchesGeneral(t *testing.T) {
	forSeeds(t, 5, checkLoneAgainstGeneral)
}

func checkLoneAgainstGeneral(t *testing.T, rdb redis.Scripter, seed uint64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 13))
	prefix := uniquePrefix(t)
	lone := New(rdb, prefix+"lone:")
	general := New(rdb, prefix+"general:")
	never := with(per(1<<40, time.Hour), store.SlidingCounter) // never binds
	// windows long enough that Redis never expires a key by its own clock
	// while its units still count by the test's, which moves far faster
	coarse := with(per(4, 36*time.Second), store.SlidingBuckets)
	coarse.Precision = 12 * time.Second // buckets leave often while the key lives
	limits := []store.Limit{
		per(5, time.Minute),
		per(3, 30*time.Second),
		per(300, time.Minute), // past the compact layout
		with(per(7, time.Minute), store.SlidingCounter),
		with(per(2, 40*time.Second), store.SlidingCounter),
		with(per(4, time.Minute), store.SlidingCounter),
		with(per(6, time.Minute), store.SlidingBuckets),
		with(per(3, 30*time.Second), store.SlidingBuckets),
		with(per(300, time.Minute), store.SlidingBuckets), // more live buckets than a hash keeps unsummed
		coarse,
	}
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC).UnixMicro()
	var admitted, denied, peeks, blocked int
	var phaseLimit store.Limit
	var reserved *struct {
		key string
		l   store.Limit
	}
	for step := range 1500 {
		// every other 150 steps, a phase of one limit, decided on two new
		// keys then on p, in turn, at short steps: the paths expect keys
		// missing (fresh_hint) when they find p, whose units leave one by
		// one as the window moves on
		phase := step/150%2 == 1
		if step%150 == 0 {
			phaseLimit = limits[rng.IntN(len(limits))]
		}
		switch r := rng.IntN(10); {
		case r < 3: // the same time
		case phase:
			now += rng.Int64N(3_000_000)
		case r < 9:
			now += rng.Int64N(8_000_000)
		default: // past a window
			now += int64(2 * time.Minute / time.Microsecond)
		}
		key := fmt.Sprint("k", rng.IntN(4))
		l := limits[rng.IntN(len(limits))]
		follow := reserved != nil
		if follow { // a decision right after a reservation, on its key
			key, l, reserved = reserved.key, reserved.l, nil
		}
		switch r := rng.IntN(40); {
		case r < 3:
			d := time.Duration(1+rng.IntN(20)) * time.Second
			for _, s := range []*Store{lone, general} {
				if err := s.Block(ctx, store.Request{Key: key, Now: now}, d); err != nil {
					t.Fatal(err)
				}
			}
			continue
		case r == 3 && l.Algorithm == store.SlidingLog:
			// a reservation: units in the future in both logs (the
			// storage key of l is the same alone or beside never)
			at := now + rng.Int64N(20_000_000)
			for _, s := range []*Store{lone, general} {
				q := store.Request{Key: key, N: 1, Limits: []store.Limit{l}, Now: at}
				if _, err := s.Reserve(ctx, q, int64(time.Minute/time.Microsecond)); err != nil {
					t.Fatal(err)
				}
			}
			reserved = &struct {
				key string
				l   store.Limit
			}{key, l}
			continue
		}
		switch {
		case follow:
		case phase:
			l, key = phaseLimit, "p" // never blocked: a block key left by the test's moved clock hands a decision to decide
			if step%3 < 2 {
				key = fmt.Sprint("new", step)
			}
		case rng.IntN(10) < 4: // a new key
			key = fmt.Sprint("new", step)
		}
		q := store.Request{Key: key, N: int64(1 + rng.IntN(4)), Limits: []store.Limit{l}, Commit: rng.IntN(8) > 0, Now: now}
		if rng.IntN(30) == 0 {
			q.N = l.Count + 1 // never fits
		}
		g := q
		g.Limits = []store.Limit{l, never}
		got, err := lone.Allow(ctx, q)
		if err != nil {
			t.Fatalf("step %d: lone: %v", step, err)
		}
		want, err := general.Allow(ctx, g)
		if err != nil {
			t.Fatalf("step %d: general: %v", step, err)
		}
		if got.Allowed != want.Allowed || got.Blocked != want.Blocked || got.At != want.At || got.States[0] != want.States[0] {
			t.Fatalf("step %d (%s, n %d, commit %v, %v): lone %s, general %s", step, key, q.N, q.Commit, l,
				answer(got, 1), answer(want, 1))
		}
		switch {
		case got.Blocked:
			blocked++
		case !q.Commit:
			peeks++
		case got.Allowed:
			admitted++
		default:
			denied++
		}
	}
	t.Logf("%d admitted, %d denied, %d peeks, %d blocked", admitted, denied, peeks, blocked)
	if admitted < 100 || denied < 40 || peeks < 20 || blocked < 5 {
		t.Fatalf("%d admitted, %d denied, %d peeks, %d blocked: want more of each", admitted, denied, peeks, blocked)
	}
	requireTTLs(t, rdb, prefix)
	c := rdb.(redis.UniversalClient)
	// a key of another type fails under either path, as WRONGTYPE
	for _, l := range []store.Limit{per(5, time.Minute), with(per(5, time.Minute), store.SlidingCounter), with(per(5, time.Minute), store.SlidingBuckets)} {
		for _, s := range []*Store{lone, general} {
			q := store.Request{Key: "foreign", N: 1, Limits: []store.Limit{l}, Commit: true, Now: now}
			if s == general {
				q.Limits = []store.Limit{l, never}
			}
			keys := appendKeys(nil, s.prefix, q.Key, q.Limits, 0)
			if err := c.LPush(ctx, keys[0], "x").Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Allow(ctx, q); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("%v on a list: %v, want WRONGTYPE", l, err)
			}
			c.Del(ctx, keys[0])
		}
	}
}
