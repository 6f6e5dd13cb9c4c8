package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// interval is when one admitted request was in flight, in ns since the
// test began: the limiter admitted it at some instant inside.
type interval struct{ start, end int64 }

// WorstWindow returns the largest number of admitted requests that
// certainly fall in one window of length w: the intervals lying wholly
// inside some window (t-w, t]. The admitting instant of each request is
// only known to lie between its call's start and end, so this count is a
// lower bound on the true worst window: a figure above the limit proves
// over-admission, and the client's latency can never inflate it.
func WorstWindow(starts, ends []int64, w int64) int {
	iv := make([]interval, len(starts))
	for i := range iv {
		iv[i] = interval{starts[i], ends[i]}
	}
	return worstWindow(iv, w)
}

func worstWindow(iv []interval, w int64) int {
	slices.SortFunc(iv, func(a, b interval) int { return int(a.end - b.end) })
	worst := 0
	for j := range iv {
		t := iv[j].end
		if j+1 < len(iv) && iv[j+1].end == t {
			continue // the last interval ending at t counts them all
		}
		n := 0
		for i := j; i >= 0 && iv[i].end > t-w; i-- {
			if iv[i].start > t-w {
				n++
			}
		}
		worst = max(worst, n)
	}
	return worst
}

// runAdmission drives one hot key with a limit of 100 per second from many
// goroutines and records when each admitted request was in flight.
func runAdmission(ctx context.Context, rdb *redis.Client, cfg *Config, rep *Report) error {
	for i, c := range rep.Contenders {
		mk, err := c.New(rdb, 100, time.Second)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", c.Name, err)
		}
		key := "admit:" + strconv.Itoa(i) + ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
		var (
			mu     sync.Mutex
			all    []interval
			errs   atomic.Int64
			stop   atomic.Bool
			wg     sync.WaitGroup
			base   = time.Now()
			decide = make([]Decide, cfg.AdmitGoroutines)
		)
		for g := range decide {
			decide[g] = mk()
		}
		for g := range decide {
			wg.Go(func() {
				var mine []interval
				for !stop.Load() {
					s := time.Since(base)
					ok, err := decide[g](ctx, key)
					e := time.Since(base)
					if err != nil {
						errs.Add(1)
						continue
					}
					if ok {
						mine = append(mine, interval{int64(s), int64(e)})
					}
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			})
		}
		time.Sleep(cfg.AdmitFor)
		stop.Store(true)
		wg.Wait()
		a := Admission{Contender: c.Name, Worst: worstWindow(all, int64(time.Second)), Admitted: len(all), Errors: errs.Load(), For: cfg.AdmitFor}
		cfg.logf("%-28s worst 1s window %d (limit 100), admitted %d in %v, errors %d", a.Contender, a.Worst, a.Admitted, a.For, a.Errors)
		rep.Admission = append(rep.Admission, a)
	}
	return nil
}
