package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestEveryKeyKeepsTTL drives random AllowN (committed and Peeks), Refunds
// (of the newest units and of a decision's), Resets and Waits (a
// reservation, then its release, or not) over the three algorithms, a
// sliding log whose layout goes from compact to sorted and back (under
// plans of 3,000 and 16,000 units, AllowN of up to 6,000), and two
// counter plans of one window (one beyond the packed form's range), in
// the scripts and the memory backend at the same times: the answers must
// agree, and after every step every key under the test's prefix must have
// a TTL. Both transitions of the log's layout must happen.
func TestEveryKeyKeepsTTL(t *testing.T) {
	var toSorted, toCompact atomic.Int64
	forSeeds(t, 4, func(t *testing.T, rdb redis.Scripter, seed uint64) {
		s, c := checkTTLs(t, rdb, seed)
		toSorted.Add(s)
		toCompact.Add(c)
	})
	t.Logf("the log went sorted %d times, compact again %d times", toSorted.Load(), toCompact.Load())
	if toSorted.Load() < 10 || toCompact.Load() < 10 {
		t.Fatalf("the log went sorted %d times, compact again %d times: want both", toSorted.Load(), toCompact.Load())
	}
}

func checkTTLs(t *testing.T, rdb redis.Scripter, seed uint64) (toSorted, toCompact int64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 35))
	prefix := uniquePrefix(t)
	rs := New(rdb, prefix)
	ms := memstore.New(func() int64 { panic("the test passes every time") })
	c := rdb.(redis.Cmdable)
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC).UnixMicro()
	// windows long enough that real Redis never expires a key (by its own
	// clock) while the test's units still count; the buckets' ring (256
	// buckets of a minute) longer than the test's clock moves in all, so
	// that a hash Redis keeps past its TTL (by the test's clock) never
	// holds a bucket old enough to pass for a new one
	long := per(3000, 100*time.Second) // compact up to a hundred units or so, then sorted
	// a plan of the same window whose AllowN of thousands of units makes
	// a long log (the format before this one paged it, without a TTL)
	logs := []store.Limit{long, per(40, 20*time.Second), per(16000, 100*time.Second)}
	others := []store.Limit{
		with(per(500, time.Hour), store.SlidingBuckets),
		with(per(5_000_000, time.Hour), store.SlidingCounter),
		with(per(1000, time.Hour), store.SlidingCounter), // the same key as the plan above
	}
	keys := []string{"a", "b"}
	type held struct {
		r   store.Request
		res store.Reservation
	}
	var reserved []held
	var decided []int64
	layout := map[string]string{}
	for step := range 1500 {
		key := keys[rng.IntN(len(keys))]
		lims := []store.Limit{logs[rng.IntN(len(logs))]}
		if rng.IntN(2) == 0 {
			lims = append(lims, others[rng.IntN(len(others))])
		}
		n := int64(1 + rng.IntN(8))
		if rng.IntN(40) == 0 {
			n = int64(100 + rng.IntN(2000))
		}
		if lims[0] == logs[2] && rng.IntN(4) == 0 {
			n = int64(4000 + rng.IntN(2000))
		}
		if lims[len(lims)-1] == others[1] && rng.IntN(3) == 0 {
			n = int64(1_000_000 + rng.IntN(3_000_000)) // the counter beyond 2^22
		}
		r := store.Request{Key: key, N: n, Limits: lims, Now: now}
		what := ""
		switch op := rng.IntN(100); {
		case op < 55:
			r.Commit = rng.IntN(8) > 0
			what = fmt.Sprintf("allow %d commit %v", n, r.Commit)
			if d := allowBoth(t, ms, rs, r, step, what); d.Allowed && r.Commit {
				decided = append(decided, now)
			}
		case op < 70:
			if rng.IntN(2) == 0 && len(decided) > 0 {
				r.At = decided[rng.IntN(len(decided))]
			}
			what = fmt.Sprintf("refund %d at %d", n, r.At)
			refundBoth(t, ms, rs, r, step, what)
		case op < 73:
			what = "reset"
			if err := ms.Reset(ctx, r); err != nil {
				t.Fatal(err)
			}
			if err := rs.Reset(ctx, r); err != nil {
				t.Fatalf("step %d reset: %v", step, err)
			}
		case op < 88:
			r.Limits = lims[:1] // a Wait: sliding logs only
			longest := rng.Int64N(int64(200 * time.Second / time.Microsecond))
			what = fmt.Sprintf("reserve %d within %d", n, longest)
			mr, err := ms.Reserve(ctx, r, longest)
			if err != nil {
				t.Fatal(err)
			}
			rr, err := rs.Reserve(ctx, r, longest)
			if err != nil {
				t.Fatalf("step %d %s: %v", step, what, err)
			}
			if mr != rr {
				t.Fatalf("step %d %s at %d: memory %+v, redis %+v", step, what, now, mr, rr)
			}
			if mr.OK {
				reserved = append(reserved, held{r, mr})
			}
		case op < 95 && len(reserved) > 0:
			i := rng.IntN(len(reserved))
			h := reserved[i]
			reserved = slices.Delete(reserved, i, i+1)
			what = fmt.Sprintf("release %d at %d", h.r.N, h.res.At)
			h.r.Now = now
			if err := ms.Release(ctx, h.r, h.res); err != nil {
				t.Fatal(err)
			}
			if err := rs.Release(ctx, h.r, h.res); err != nil {
				t.Fatalf("step %d %s: %v", step, what, err)
			}
		default:
			what = "nothing"
		}
		for _, k := range keys {
			name := storageKey(keyTag(prefix, k), long)
			typ := c.Type(ctx, name).Val()
			switch was := layout[name]; {
			case was == "string" && typ == "zset":
				toSorted++
			case was == "zset" && typ == "string":
				toCompact++
			}
			layout[name] = typ
		}
		requireTTLs(t, rdb, prefix)
		if t.Failed() {
			t.Fatalf("after step %d (%s)", step, what)
		}
		switch r := rng.IntN(100); {
		case r < 80:
			now += rng.Int64N(300_000)
		case r < 98:
			now += rng.Int64N(int64(20 * time.Second / time.Microsecond))
		default:
			now += int64(100*time.Second/time.Microsecond) + rng.Int64N(1000)
		}
	}
	return toSorted, toCompact
}

// TestCounterAcrossPackedRange: the sliding counter's state is one
// integer while its counts fit 22 bits, else a string, chosen by the
// counts it stores, not by the Count of the limit that writes it (limits
// of one algorithm and window share the key). A window holding 2^22 units
// or more, then a refund or a decision under a plan below 2^22: nothing
// is lost, as in the memory backend.
func TestCounterAcrossPackedRange(t *testing.T) {
	big := with(per(5_000_000, time.Hour), store.SlidingCounter)
	small := with(per(1000, time.Hour), store.SlidingCounter)
	hour := int64(time.Hour / time.Microsecond)
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC).UnixMicro() / hour * hour // a window's start
	type step struct {
		n      int64
		lim    store.Limit
		refund bool
		at     int64 // µs after t0
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"refund under the small plan", []step{{4_194_400, big, false, 10}, {1, small, true, 20}, {1, big, false, 30}}},
		{"decision under the small plan", []step{{4_194_400, big, false, 10}, {1, small, false, 20}, {800_000, big, false, 30}, {1, big, false, 40}}},
		{"next window", []step{{3_000_000, big, false, 10}, {2_000_000, big, false, hour / 2}, {1, small, true, hour + 10}, {1, big, false, hour + 20}, {1_999_000, big, false, hour + 30}}},
		{"back into the packed range", []step{{4_194_400, big, false, 10}, {4_194_400, small, true, 20}, {10, small, false, 30}, {1, big, false, 40}}},
	}
	for _, server := range diffServers(1) {
		t.Run(server.name, func(t *testing.T) {
			rdb := server.new(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					rs := New(rdb, uniquePrefix(t))
					ms := memstore.New(func() int64 { panic("the test passes every time") })
					for i, s := range c.steps {
						r := store.Request{Key: "k", N: s.n, Limits: []store.Limit{s.lim}, Now: t0 + s.at, Commit: true}
						if s.refund {
							refundBoth(t, ms, rs, r, i, "refund")
						} else {
							allowBoth(t, ms, rs, r, i, fmt.Sprint("allow ", s.n))
						}
						r.Commit = false
						allowBoth(t, ms, rs, r, i, "peek")
					}
				})
			}
		})
	}
}

// TestBesideFormerKeys: a Redis holding the keys of the format this one
// replaces (the limit keys "<prefix>{<key>}:r1m" and the like, unmarked: a
// sliding log as a compact string, a ring string or a paged hash, a
// counter, a bucket hash), written by hand from that format's description,
// and a ban set in the shared block key. This version decides beside them
// without an error and without reading them (its answers are those of an
// empty limit, but for the ban, which holds for both), and leaves them as
// they were.
func TestBesideFormerKeys(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.New(t).Client(t)
	prefix := uniquePrefix(t)
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC).UnixMicro()
	be := func(x int64, w int) string { // x as w bytes, big-endian
		b := make([]byte, w)
		for i := w - 1; i >= 0; i-- {
			b[i], x = byte(x), x>>8
		}
		return string(b)
	}
	// the former compact log: w, base (7 bytes), offsets of w bytes
	compact := string(rune(2)) + be(now-1000, 7) + be(0, 2) + be(10, 2) + be(20, 2)
	// the former ring: 16 + w, base, cap (3), head (3), used (3), newest
	// (7), expires (7), then cap slots of w bytes
	ring := string(rune(16+3)) + be(now-5000, 7) + be(8, 3) + be(0, 3) + be(3, 3) + be(now-4000, 7) + be(now+60e6, 7) +
		be(0, 3) + be(500, 3) + be(1000, 3) + strings.Repeat("\x00", 5*3)
	// the former paged hash: 'h' holds s0, used, newest, expires, gc (7
	// bytes each); page 0 the units' times, 7 bytes each
	pages := map[string]any{"h": be(0, 7) + be(2, 7) + be(now-100, 7) + be(now+60e6, 7) + be(0, 7), "0": be(now-200, 7) + be(now-100, 7)}
	former := map[string]func(key string) error{
		"r1m": func(k string) error { return rdb.Set(ctx, k, compact, time.Minute).Err() },
		"r1h": func(k string) error { return rdb.Set(ctx, k, ring, time.Hour).Err() },
		"r1s": func(k string) error {
			if err := rdb.HSet(ctx, k, pages).Err(); err != nil {
				return err
			}
			return rdb.Expire(ctx, k, time.Minute).Err()
		},
		"c1m": func(k string) error { return rdb.Set(ctx, k, (5*4194304+7)*16+now/60e6%16, time.Minute).Err() },
		"b1m": func(k string) error { return rdb.HSet(ctx, k, "3", 9, "t", 9, "o", 3*256+3).Err() },
	}
	limits := map[string]store.Limit{
		"r1m": perMinute(10), "r1h": perHour(10), "r1s": perSecond(10),
		"c1m": with(perMinute(10), store.SlidingCounter), "b1m": with(perMinute(10), store.SlidingBuckets),
	}
	tag := keyTag(prefix, "k")
	before := map[string]string{}
	for name, write := range former {
		if err := write(tag + name); err != nil {
			t.Fatal(err)
		}
		before[name] = rdb.Dump(ctx, tag+name).Val()
	}
	rs := New(rdb, prefix)
	for name, l := range limits {
		for i := range int64(3) {
			d, err := rs.Allow(ctx, store.Request{Key: "k", N: 2, Limits: []store.Limit{l}, Now: now + i, Commit: true})
			if err != nil || !d.Allowed || d.States[0].Remaining != 8-2*i {
				t.Fatalf("%s decision %d beside the former keys: %+v, %v", name, i, d, err)
			}
		}
		if err := rs.Refund(ctx, store.Request{Key: "k", N: 1, Limits: []store.Limit{l}, Now: now + 5}); err != nil {
			t.Fatalf("%s refund: %v", name, err)
		}
		if l.Algorithm == store.SlidingLog {
			res, err := rs.Reserve(ctx, store.Request{Key: "k", N: 1, Limits: []store.Limit{l}, Now: now + 6}, -1)
			if err != nil || !res.OK || res.Wait != 0 {
				t.Fatalf("%s reserve: %+v, %v", name, res, err)
			}
		}
	}
	for name := range former {
		if got := rdb.Dump(ctx, tag+name).Val(); got != before[name] {
			t.Errorf("the former key %s changed", name)
		}
	}
	// a ban in the shared block key holds for this version
	if err := rdb.Set(ctx, tag+blockName, now+30e6, 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := rs.Allow(ctx, store.Request{Key: "k", N: 1, Limits: []store.Limit{perMinute(10)}, Now: now + 10, Commit: true})
	if err != nil || d.Allowed || !d.Blocked || d.States[0].Retry != 30e6-10 {
		t.Fatalf("under the former version's ban: %+v, %v", d, err)
	}
}
