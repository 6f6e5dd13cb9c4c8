package core

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// benchKeys spreads the benchmark over many keys, so that few are denied.
const benchKeys = 10000

func benchKeyNames() []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "ip:10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
	return keys
}

func benchAllow(b *testing.B, l *Limiter) {
	keys := benchKeyNames()
	for _, a := range algorithms {
		lim := PerMinute(1000000).With(a)
		if a == SlidingLog {
			lim = PerSecond(100)
		}
		b.Run(a.String(), func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := l.Allow(ctx, keys[i%benchKeys], lim); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkAllowMemory is one decision of the in-memory backend.
func BenchmarkAllowMemory(b *testing.B) {
	benchAllow(b, NewMemory())
}

// BenchmarkAllowRedis is one decision on a real Redis: one round trip.
func BenchmarkAllowRedis(b *testing.B) {
	srv := redistest.New(b)
	l, err := New(srv.Client(b), WithPrefix("bench:"+strconv.FormatInt(time.Now().UnixNano(), 36)+":"))
	if err != nil {
		b.Fatal(err)
	}
	benchAllow(b, l)
}

// BenchmarkAllowRedisParallel is many goroutines deciding at once.
func BenchmarkAllowRedisParallel(b *testing.B) {
	srv := redistest.New(b)
	l, err := New(srv.Client(b), WithPrefix("benchp:"+strconv.FormatInt(time.Now().UnixNano(), 36)+":"))
	if err != nil {
		b.Fatal(err)
	}
	keys := benchKeyNames()
	for _, a := range algorithms {
		lim := PerMinute(MaxLogCount).With(a)
		b.Run(a.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				i := 0
				for pb.Next() {
					if _, err := l.Allow(ctx, keys[i%benchKeys], lim); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}
