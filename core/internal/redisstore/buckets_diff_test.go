package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
)

// TestBucketsMatchMemory drives sliding buckets in the scripts and in the
// memory store through the same random calls, at the same times, and wants
// the same answers (remaining, retry, reset) and the same units counted:
// decisions of 1 to 8 units under two limits (one whose hash holds dozens
// of live buckets, so that it keeps their sum; one of few units, so that
// it denies), Peeks, refunds of the newest units and of a decision's
// units, plan changes (another Count over the same hash), and pauses short
// and longer than a window. Every stored hash keeps a TTL, and a hash that
// keeps a sum holds the sum of its buckets.
func TestBucketsMatchMemory(t *testing.T) {
	againstMemory(t, 6, [2]string{"hashes without a sum", "hashes with one"}, checkBucketsAgainstMemory)
}

func checkBucketsAgainstMemory(t *testing.T, rdb redis.Scripter, seed uint64, summed *[2]atomic.Int64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	rs := New(rdb, uniquePrefix(t))
	ms := memstore.New(func() int64 { panic("the test passes every time") })
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixMicro()
	// windows long enough that real Redis never expires a key (by its own
	// clock) before the test's clock has moved past its units; every step
	// checks both limits, and a pause is shorter than their rings of
	// buckets (see bucket_ring), so a hash Redis keeps past its TTL (by the
	// test's clock) never holds a bucket old enough to pass for a new one
	long, short := 100*time.Second, 20*time.Second
	limits := func() []store.Limit {
		many := store.Limit{Count: []int64{2000, 5000, 400}[rng.IntN(3)], Window: long, Algorithm: store.SlidingBuckets}
		few := store.Limit{Count: int64(10 + rng.IntN(30)), Window: short, Algorithm: store.SlidingBuckets, Precision: 2 * time.Second}
		return []store.Limit{many, few}
	}
	var decided []int64 // times of admitted decisions
	for step := range 2500 {
		lims := limits()
		n := int64(1 + rng.IntN(8))
		r := store.Request{Key: "k", N: n, Limits: lims, Now: now}
		what := ""
		switch op := rng.IntN(100); {
		case op < 80:
			r.Commit = rng.IntN(10) > 0
			what = fmt.Sprintf("allow %d commit %v", n, r.Commit)
			if d := allowBoth(t, ms, rs, r, step, what); d.Allowed && r.Commit {
				decided = append(decided, now)
			}
		case op < 95:
			if rng.IntN(2) == 0 && len(decided) > 0 {
				r.At = decided[rng.IntN(len(decided))]
			}
			what = fmt.Sprintf("refund %d at %d", n, r.At)
			refundBoth(t, ms, rs, r, step, what)
		default:
			what = "nothing"
		}
		compareBuckets(t, fmt.Sprintf("step %d (%s)", step, what), rdb, rs, lims[0], summed)
		switch r := rng.IntN(1000); {
		case r < 800:
			now += rng.Int64N(500_000) // µs: many buckets of 1.67 s
		case r < 997:
			now += rng.Int64N(int64(short / time.Microsecond))
		default: // a pause: the few units leave, the many stay
			now += int64(short/time.Microsecond) + rng.Int64N(int64(short/time.Microsecond))
		}
	}
}

// compareBuckets fails unless the hash of limit l has a TTL, and the sum it
// keeps, if any, is that of its buckets (those the next check drops
// included). It counts the hashes with and without a sum in summed.
func compareBuckets(t *testing.T, step string, rdb redis.Scripter, rs *Store, l store.Limit, summed *[2]atomic.Int64) {
	t.Helper()
	ctx := context.Background()
	c := rdb.(redis.Cmdable)
	key := storageKey(keyTag(rs.prefix, "k"), l)
	h, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatalf("%s: %s: %v", step, key, err)
	}
	if len(h) == 0 {
		return
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl == -1 {
		t.Fatalf("%s: %s has no TTL", step, key)
	}
	sum, ok := h["t"]
	if _, o := h["o"]; ok != o {
		t.Fatalf("%s: %s holds half a sum: %v", step, key, h)
	}
	if !ok {
		summed[0].Add(1)
		return
	}
	summed[1].Add(1)
	var total int64
	for f, v := range h {
		if f == "t" || f == "o" {
			continue
		}
		var n int64
		fmt.Sscan(v, &n)
		total += n
	}
	if fmt.Sprint(total) != sum {
		t.Fatalf("%s: %s keeps the sum %s of buckets holding %d: %v", step, key, sum, total, h)
	}
}
