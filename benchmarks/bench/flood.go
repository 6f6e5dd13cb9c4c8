package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
)

// Flood is the flood scenario of one algorithm: FloodProcesses OS processes
// (replicas), each with its own client, a Limiter with the default options
// and FloodGoroutines goroutines, hit one key limited to 100 a second as
// hard as they can for FloodFor.
type Flood struct {
	Contender string
	// Worst is the fleet-wide worst count in one 1s window (see
	// WorstWindow: a lower bound, so above 100 proves over-admission).
	Worst    int
	Admitted int
	// Decisions made in all; FailureAnswers of them answered by the
	// failure mode (with the default FailOpen, each was admitted).
	Decisions, FailureAnswers int64
	// P99 of the decisions' latency over every process.
	P99 time.Duration
	For time.Duration
}

// FloodPart is what one process of the flood reports to the parent.
type FloodPart struct {
	Starts, Ends   []int64 // admitted calls, unix ns
	Decisions      int64
	FailureAnswers int64
	Hist           hist
}

// floodAlgorithms are the algorithms the flood runs: those that never
// over-admit.
var floodAlgorithms = []core.Algorithm{core.SlidingLog, core.SlidingBuckets}

// FloodChild runs one process's part of the flood and writes it to stdout
// as JSON: rwbench calls it in its child processes.
func FloodChild(ctx context.Context, addr, key string, alg core.Algorithm, goroutines int, d time.Duration, start time.Time) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var part FloodPart
	var failures, decisions atomic.Int64
	l, err := core.New(rdb, core.WithObserver(func(ev core.Event) {
		decisions.Add(1)
		if ev.Failed {
			failures.Add(1)
		}
	}))
	if err != nil {
		return err
	}
	lim := core.PerSecond(100).With(alg)
	time.Sleep(time.Until(start)) // every process starts together
	end := start.Add(d)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			var starts, ends []int64
			var h hist
			for time.Now().Before(end) {
				t0 := time.Now()
				r, err := l.Allow(ctx, key, lim)
				t1 := time.Now()
				h.record(t1.Sub(t0))
				if err == nil && r.Allowed {
					starts, ends = append(starts, t0.UnixNano()), append(ends, t1.UnixNano())
				}
			}
			mu.Lock()
			part.Starts, part.Ends = append(part.Starts, starts...), append(part.Ends, ends...)
			part.Hist.merge(&h)
			mu.Unlock()
		})
	}
	wg.Wait()
	part.Decisions, part.FailureAnswers = decisions.Load(), failures.Load()
	return json.NewEncoder(os.Stdout).Encode(&part)
}

// runFlood runs the flood for every algorithm in floodAlgorithms, each in
// FloodProcesses child processes of this program (-flood-child).
func runFlood(ctx context.Context, srv *Server, cfg *Config, rep *Report) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: flood: %w", err)
	}
	for _, alg := range floodAlgorithms {
		name := "ratewindow " + alg.String()
		key := "flood:" + strconv.FormatInt(time.Now().UnixNano(), 36)
		start := time.Now().Add(time.Second) // the processes start up meanwhile
		var (
			mu    sync.Mutex
			parts []FloodPart
			errs  []error
			wg    sync.WaitGroup
		)
		for range cfg.FloodProcesses {
			wg.Go(func() {
				cmd := exec.CommandContext(ctx, self, "-flood-child",
					"-flood-addr", srv.Addr, "-flood-key", key, "-flood-alg", strconv.Itoa(int(alg)),
					"-flood-g", strconv.Itoa(cfg.FloodGoroutines), "-flood-for", cfg.FloodFor.String(),
					"-flood-start", strconv.FormatInt(start.UnixNano(), 10))
				var out, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &stderr
				var part FloodPart
				err := cmd.Run()
				if err == nil {
					err = json.Unmarshal(out.Bytes(), &part)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%w: %s", err, stderr.String()))
					return
				}
				parts = append(parts, part)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("bench: flood: %w", err)
		}
		f := Flood{Contender: name, For: cfg.FloodFor}
		var starts, ends []int64
		var h hist
		for _, p := range parts {
			starts, ends = append(starts, p.Starts...), append(ends, p.Ends...)
			f.Decisions += p.Decisions
			f.FailureAnswers += p.FailureAnswers
			h.merge(&p.Hist)
		}
		f.Admitted, f.Worst, f.P99 = len(starts), WorstWindow(starts, ends, int64(time.Second)), h.quantile(0.99)
		cfg.logf("%-28s flood %d×%d: worst 1s window %d (limit 100), admitted %d in %v, %d of %d decisions by the failure mode, p99 %v",
			name, cfg.FloodProcesses, cfg.FloodGoroutines, f.Worst, f.Admitted, f.For, f.FailureAnswers, f.Decisions, f.P99)
		rep.Flood = append(rep.Flood, f)
	}
	return nil
}
