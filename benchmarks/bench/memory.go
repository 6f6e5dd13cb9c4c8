package bench

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// memGoroutines fill the keys of a memory measurement.
const memGoroutines = 32

// runMemory measures each contender's Redis memory per key: FLUSHALL, then
// cfg.MemKeys keys with cfg.MemRequests requests each; again with one
// request each. The limit (100 per hour) admits every request and keeps
// every contender's keys alive until the measurement is taken (a shorter
// limit lets GCRA's keys expire during the fill).
func runMemory(ctx context.Context, rdb *redis.Client, cfg *Config, rep *Report) error {
	for _, c := range rep.Contenders {
		mk, err := c.New(rdb, 100, time.Hour)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", c.Name, err)
		}
		// warm up: scripts loaded, every connection open
		if _, _, err := fill(ctx, mk, keyNames("warm:", 2*memGoroutines), 1); err != nil {
			return fmt.Errorf("bench: %s: warming up: %w", c.Name, err)
		}
		m := Memory{Contender: c.Name}
		for _, reqs := range []int{cfg.MemRequests, 1} {
			if err := rdb.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
				return err
			}
			before, err := keyMemory(ctx, rdb, cfg.Settle)
			if err != nil {
				return err
			}
			admitted, failed, err := fill(ctx, mk, keyNames("user:", cfg.MemKeys), reqs)
			if err != nil {
				return fmt.Errorf("bench: %s: %d requests per key: %w", c.Name, reqs, err)
			}
			after, err := keyMemory(ctx, rdb, cfg.Settle)
			if err != nil {
				return err
			}
			per := float64(after-before) / float64(cfg.MemKeys)
			m.Errors += failed
			if reqs == 1 {
				m.PerKeyOne = per
			} else {
				m.PerKey, m.Admitted = per, admitted
			}
		}
		cfg.logf("%-28s %6.1f bytes/key at %d requests (%d admitted), %6.1f at 1; %d errors", m.Contender, m.PerKey, cfg.MemRequests, m.Admitted, m.PerKeyOne, m.Errors)
		rep.Memory = append(rep.Memory, m)
	}
	return rdb.Do(ctx, "FLUSHALL", "SYNC").Err()
}

// keyMemory is INFO memory's used_memory less mem_clients_normal, after
// leaving the server alone for settle (see Config.Settle): the connections' buffers grow and shrink with traffic and are no
// key's cost.
func keyMemory(ctx context.Context, rdb *redis.Client, settle time.Duration) (int64, error) {
	time.Sleep(settle)
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	var used, clients int64
	found := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch name {
		case "used_memory":
			used, err = strconv.ParseInt(v, 10, 64)
			found++
		case "mem_clients_normal":
			clients, err = strconv.ParseInt(v, 10, 64)
			found++
		}
		if err != nil {
			return 0, fmt.Errorf("bench: INFO memory %s: %w", name, err)
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("bench: INFO memory lacks used_memory or mem_clients_normal")
	}
	return used - clients, nil
}

// fill sends reqs requests for every key, spread over memGoroutines, and
// returns how many were admitted and how many failed. A failure (such as
// ratewindow's timeout on a loaded machine) is counted, not fatal, unless
// more than 1% of the requests fail.
func fill(ctx context.Context, mk func() Decide, keys []string, reqs int) (admitted, failed int64, err error) {
	var (
		wg        sync.WaitGroup
		next      atomic.Int64
		ok, fails atomic.Int64
		firstErr  atomic.Pointer[error]
	)
	for range memGoroutines {
		decide := mk()
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(keys)) {
					return
				}
				for range reqs {
					yes, err := decide(ctx, keys[i])
					switch {
					case err != nil:
						fails.Add(1)
						firstErr.CompareAndSwap(nil, &err)
					case yes:
						ok.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil && fails.Load()*100 > int64(len(keys)*reqs) {
		return ok.Load(), fails.Load(), *p
	}
	return ok.Load(), fails.Load(), nil
}
