package memstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// benchKeys spreads a benchmark over many keys, so that few are denied.
const benchKeys = 10000

var algorithms = []store.Algorithm{store.SlidingLog, store.SlidingBuckets, store.SlidingCounter}

var algorithmNames = [...]string{"sliding-log", "sliding-buckets", "sliding-counter"}

// BenchmarkAllow is one committed decision on the store's own clock, as
// core's BenchmarkAllowMemory makes it (a sliding log of 100 per second,
// else 1,000,000 per minute), under one limit or three (the same count
// per second, per minute and per hour), over 10,000 keys or on one key.
// The Request and its Limits are built once: what is measured is the
// store's own work.
func BenchmarkAllow(b *testing.B) {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "ip:10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
	s := New(func() int64 { return time.Now().UnixMicro() })
	ctx := context.Background()
	for _, nlim := range []int{1, 3} {
		for _, spread := range []string{"distinct keys", "one key"} {
			for _, a := range algorithms {
				l := store.Limit{Algorithm: a, Count: 1000000, Window: time.Minute}
				if a == store.SlidingLog {
					l = store.Limit{Algorithm: a, Count: 100, Window: time.Second}
				}
				limits := []store.Limit{l}
				if nlim == 3 {
					limits = []store.Limit{
						{Algorithm: a, Count: l.Count, Window: time.Second},
						{Algorithm: a, Count: l.Count, Window: time.Minute},
						{Algorithm: a, Count: l.Count, Window: time.Hour},
					}
				}
				r := store.Request{Key: keys[0], N: 1, Limits: limits, Commit: true}
				name := strconv.Itoa(nlim) + " limits/" + spread + "/" + algorithmNames[a]
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						if spread == "distinct keys" {
							r.Key = keys[i%benchKeys]
						}
						if _, err := s.Allow(ctx, r); err != nil {
							b.Fatal(err)
						}
						i++
					}
				})
			}
		}
	}
}
