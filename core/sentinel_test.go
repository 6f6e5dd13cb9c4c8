package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// decision is one timed call of the sentinel test's load.
type decision struct {
	at      time.Time
	latency time.Duration
	err     error
}

// TestSentinelFailover: Sentinel-managed failovers under load through a
// FailoverClient: a manual one (SENTINEL FAILOVER), and the master killed,
// found down by the sentinel after 1s and replaced by its replica. The
// Limiter keeps deciding (fail-open while there is no master), with errors
// only around the switch and none once the client follows the new master,
// and no panic.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		fault func(t *testing.T, s *redistest.Sentinel) *redistest.Process // returns the new master
	}{
		{"SENTINEL FAILOVER", func(t *testing.T, s *redistest.Sentinel) *redistest.Process {
			s.Failover(t)
			return s.Master
		}},
		{"master killed", func(t *testing.T, s *redistest.Sentinel) *redistest.Process {
			s.Master.Kill(t)
			return s.Replica
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sentinelFailover(t, c.fault)
		})
	}
}

func sentinelFailover(t *testing.T, fault func(*testing.T, *redistest.Sentinel) *redistest.Process) {
	s := redistest.NewSentinel(t)
	rdb := s.Client(t)
	prefix := uniquePrefix(t)
	l, rec := faultLimiter(t, rdb, FailOpen, 1, WithPrefix(prefix))
	stalls := stall.Start(t)
	ctx := context.Background()
	if _, err := l.Allow(ctx, "warm-up", PerSecond(1)); err != nil {
		t.Fatal(err)
	}

	var (
		mu        sync.Mutex
		decisions []decision
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	lim := PerMinute(1 << 30).With(SlidingCounter)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				r, err, took := faultAllow(ctx, l, fmt.Sprintf("load-%d-%d", w, i%20), lim)
				d := decision{start, took, err}
				if !r.Allowed {
					d.err = fmt.Errorf("denied %+v (%w)", r, err)
				}
				mu.Lock()
				decisions = append(decisions, d)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	master := fault(t, s)
	// back on Redis: a decision without error
	for {
		if _, err, _ := faultAllow(ctx, l, "probe", PerSecond(1000)); err == nil {
			break
		}
		if time.Since(began) > 15*time.Second {
			t.Fatal("no master 15s after the fault")
		}
		time.Sleep(10 * time.Millisecond)
	}
	recovered := time.Now()
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()

	// The sentinel ends the failover (and go-redis follows +switch-master)
	// after the first decision succeeds on the new master: a few timeouts
	// may follow within a second. The second after that must be clean.
	const settle = time.Second
	var (
		errs, errsAfter int
		errsLate        int // after the first success, within settle
		slowest         time.Duration
		firstErr        error
		lastErr         time.Time
	)
	for _, d := range decisions {
		if d.at.Add(d.latency).After(began) {
			slowest = max(slowest, d.latency)
		}
		if d.err == nil {
			continue
		}
		errs++
		if firstErr == nil {
			firstErr = d.err
		}
		lastErr = d.at
		if d.at.Add(d.latency).Before(began) {
			t.Fatalf("error before the fault: %v", d.err)
		}
		if d.at.After(recovered.Add(settle)) {
			// A decision shed (Redis answered others, not this one in
			// time) is this process's load, not the failover: while the
			// process stood still for a fifth of the timeout or more, it
			// is inconclusive; without such a stall it is an error.
			if stalled := stalls.Worst(); errors.Is(d.err, ErrShed) && stalled >= DefaultTimeout/5 {
				t.Logf("shed %v after the recovery, latency %v, while this process stalled up to %v: inconclusive", d.at.Sub(recovered), d.latency, stalled)
				continue
			}
			errsAfter++
			t.Logf("error %v after the recovery, latency %v: %v", d.at.Sub(recovered), d.latency, d.err)
		} else if d.at.After(recovered) {
			errsLate++
		}
	}
	if errsAfter != 0 {
		t.Fatalf("%d errors more than %v after the switch", errsAfter, settle)
	}
	// every error the load saw was reported: a failure, or a decision shed
	// at the kill (Redis had answered other calls since it began)
	if c := tallyEvents(rec.take()); c.failed+c.shed < errs {
		t.Fatalf("observer: %d failures and %d shed, the load saw %d errors", c.failed, c.shed, errs)
	}
	// the new master decides, exactly
	for i := int64(1); i <= 3; i++ {
		if r, err, _ := faultAllow(ctx, l, "after", PerMinute(3)); err != nil || !r.Allowed || r.Remaining != 3-i {
			t.Fatalf("after the failover, request %d: %+v %v", i, r, err)
		}
	}
	if r, err, _ := faultAllow(ctx, l, "after", PerMinute(3)); err != nil || r.Allowed {
		t.Fatalf("after the failover, 4th request: %+v %v", r, err)
	}
	key := storageKey(keyTag(prefix, "after"), PerMinute(3))
	if n, err := master.Client(t).Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("the new master %s does not hold the key: %d %v", master.Addr, n, err)
	}
	last := "-"
	if errs > 0 {
		last = lastErr.Sub(began).Round(time.Millisecond).String()
	}
	t.Logf("back on redis %v after the fault: %d decisions, %d errors (%d after the first success; first: %v; last %s after the fault), worst decision %v",
		recovered.Sub(began).Round(time.Millisecond), len(decisions), errs, errsLate, firstErr, last, slowest.Round(time.Millisecond))
}
