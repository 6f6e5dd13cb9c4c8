package core

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// Three Limiters on three clients, 64 goroutines each, one key: the limit
// holds exactly across them, for every algorithm.
func TestConcurrentLimitersAdmitExactly(t *testing.T) {
	srv := redistest.New(t)
	prefix := uniquePrefix(t)
	var limiters []*Limiter
	for i := 0; i < 3; i++ {
		l, err := New(srv.Client(t), WithPrefix(prefix), WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		limiters = append(limiters, l)
	}
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			lim := PerHour(200).With(a)
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			for _, l := range limiters {
				for g := 0; g < 64; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < 5; i++ {
							r, err := l.Allow(context.Background(), "hot", lim)
							if err != nil {
								t.Error(err)
								return
							}
							if r.Allowed {
								admitted.Add(1)
							} else {
								denied.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			if admitted.Load() != 200 || denied.Load() != 3*64*5-200 {
				t.Fatalf("admitted %d, denied %d; want exactly 200 admitted", admitted.Load(), denied.Load())
			}
		})
	}
}

// The memory backend holds the limit exactly under concurrency too.
func TestMemoryConcurrentAdmitsExactly(t *testing.T) {
	l := NewMemory()
	for _, a := range algorithms {
		lim := PerHour(500).With(a)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					if r, _ := l.Allow(context.Background(), "hot", lim); r.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 500 {
			t.Fatalf("%s: admitted %d, want 500", a, admitted.Load())
		}
	}
}
