package ratewindowprom

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
)

// TestCollectorEvents: every kind of event lands in its series, exactly.
func TestCollectorEvents(t *testing.T) {
	c := NewCollector(Opts{Buckets: []float64{0.001, 0.1}})
	ms := time.Millisecond
	events := []core.Event{
		{Op: core.OpAllow, Rule: "login", Result: core.Result{Allowed: true}, Latency: 500 * time.Microsecond},
		{Op: core.OpAllow, Rule: "login", Result: core.Result{Allowed: true}, Latency: 2 * ms},
		{Op: core.OpAllow, Rule: "login", Result: core.Result{}, Latency: 2 * ms},
		{Op: core.OpAllow, Rule: "login", Result: core.Result{}, CacheHit: true, Latency: 10 * time.Microsecond},
		{Op: core.OpAllow, Rule: "login", Result: core.Result{Allowed: true}, Failed: true, Fallback: core.FailOpen, Latency: 100 * ms},
		{Op: core.OpAllow, Rule: "api", Result: core.Result{}, Failed: true, Fallback: core.FailClosed, Latency: 250 * ms},
		{Op: core.OpAllow, Rule: "api", Result: core.Result{}, Failed: true, Fallback: core.FailClosed, Err: core.ErrCircuitOpen, Latency: 0}, // the breaker answered
		{Op: core.OpAllow, Rule: "api", Result: core.Result{Allowed: true}, Failed: true, Fallback: core.FailLocal, Latency: 62500 * time.Microsecond},
		{Op: core.OpAllow, Rule: "api", Result: core.Result{}, Shed: true, Err: core.ErrShed, Latency: 100 * ms},  // overload: no failure
		{Op: core.OpPeek, Rule: "api", Result: core.Result{Allowed: true}, Latency: ms},                           // not a decision
		{Op: core.OpPeek, Rule: "api", Result: core.Result{Allowed: true}, Failed: true, Fallback: core.FailOpen}, // but an error
		{Op: core.OpWait, Rule: "", Result: core.Result{Allowed: true}, Latency: 3 * time.Second},                 // no duration
		{Op: core.OpWait, Rule: "", Result: core.Result{}, Latency: time.Millisecond},                             // gave up
	}
	for _, e := range events {
		c.Observe(e)
	}
	want := `
# HELP ratewindow_backend_errors_total Calls that Redis did not answer in time (an error, the timeout or the open circuit breaker), by the failure mode that answered instead.
# TYPE ratewindow_backend_errors_total counter
ratewindow_backend_errors_total{mode="fail-closed",rule=""} 0
ratewindow_backend_errors_total{mode="fail-closed",rule="api"} 2
ratewindow_backend_errors_total{mode="fail-closed",rule="login"} 0
ratewindow_backend_errors_total{mode="fail-local",rule=""} 0
ratewindow_backend_errors_total{mode="fail-local",rule="api"} 1
ratewindow_backend_errors_total{mode="fail-local",rule="login"} 0
ratewindow_backend_errors_total{mode="fail-open",rule=""} 0
ratewindow_backend_errors_total{mode="fail-open",rule="api"} 1
ratewindow_backend_errors_total{mode="fail-open",rule="login"} 1
# HELP ratewindow_decisions_total Rate-limit decisions by rule and outcome: allowed, denied, error when the failure mode answered for Redis, or shed when this process's decision ran out of time while Redis answered (overload).
# TYPE ratewindow_decisions_total counter
ratewindow_decisions_total{outcome="allowed",rule=""} 1
ratewindow_decisions_total{outcome="allowed",rule="api"} 0
ratewindow_decisions_total{outcome="allowed",rule="login"} 2
ratewindow_decisions_total{outcome="denied",rule=""} 1
ratewindow_decisions_total{outcome="denied",rule="api"} 0
ratewindow_decisions_total{outcome="denied",rule="login"} 2
ratewindow_decisions_total{outcome="error",rule=""} 0
ratewindow_decisions_total{outcome="error",rule="api"} 3
ratewindow_decisions_total{outcome="error",rule="login"} 1
ratewindow_decisions_total{outcome="shed",rule=""} 0
ratewindow_decisions_total{outcome="shed",rule="api"} 1
ratewindow_decisions_total{outcome="shed",rule="login"} 0
# HELP ratewindow_deny_cache_hits_total Denials answered from the deny cache without a round trip to Redis.
# TYPE ratewindow_deny_cache_hits_total counter
ratewindow_deny_cache_hits_total{rule=""} 0
ratewindow_deny_cache_hits_total{rule="api"} 0
ratewindow_deny_cache_hits_total{rule="login"} 1
# HELP ratewindow_decision_duration_seconds Time taken by rate-limit decisions, including deny-cache hits and failures; Wait is not included.
# TYPE ratewindow_decision_duration_seconds histogram
ratewindow_decision_duration_seconds_bucket{rule="",le="0.001"} 0
ratewindow_decision_duration_seconds_bucket{rule="",le="0.1"} 0
ratewindow_decision_duration_seconds_bucket{rule="",le="+Inf"} 0
ratewindow_decision_duration_seconds_sum{rule=""} 0
ratewindow_decision_duration_seconds_count{rule=""} 0
ratewindow_decision_duration_seconds_bucket{rule="api",le="0.001"} 1
ratewindow_decision_duration_seconds_bucket{rule="api",le="0.1"} 3
ratewindow_decision_duration_seconds_bucket{rule="api",le="+Inf"} 4
ratewindow_decision_duration_seconds_sum{rule="api"} 0.4125
ratewindow_decision_duration_seconds_count{rule="api"} 4
ratewindow_decision_duration_seconds_bucket{rule="login",le="0.001"} 2
ratewindow_decision_duration_seconds_bucket{rule="login",le="0.1"} 5
ratewindow_decision_duration_seconds_bucket{rule="login",le="+Inf"} 5
ratewindow_decision_duration_seconds_sum{rule="login"} 0.10451
ratewindow_decision_duration_seconds_count{rule="login"} 5
# HELP ratewindow_circuit_open_total Calls the failure mode answered without asking Redis because the circuit breaker was open (after failures in a row; it probes Redis again every 250ms). Also counted in ratewindow_backend_errors_total.
# TYPE ratewindow_circuit_open_total counter
ratewindow_circuit_open_total{rule=""} 0
ratewindow_circuit_open_total{rule="api"} 1
ratewindow_circuit_open_total{rule="login"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "ratewindow_backend_errors_total", "ratewindow_circuit_open_total", "ratewindow_decision_duration_seconds", "ratewindow_decisions_total", "ratewindow_deny_cache_hits_total"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
	reg := prom.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

// TestCollectorWithLimiter: a Limiter's decisions, deny-cache hits and
// failures, observed through core.WithObserver.
func TestCollectorWithLimiter(t *testing.T) {
	ctx := context.Background()
	c := NewCollector(Opts{ConstLabels: prom.Labels{"service": "test"}})

	l := core.NewMemory(core.WithObserver(c.Observe))
	for range 5 {
		l.Allow(ctx, "user:42", core.PerMinute(3))
	}

	// a port that refuses connections: every call fails, fail-closed answers
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	down, err := core.New(rdb, core.WithFailureMode(core.FailClosed), core.WithTimeout(50*time.Millisecond), core.WithObserver(c.Observe))
	if err != nil {
		t.Fatal(err)
	}
	// A refused connection is evidence that Redis is down: from then on,
	// for 250ms, the failure mode answers without a call (a starved test
	// may miss that pause, so it asks until the open circuit has answered).
	calls, open := 0, 0
	for ; calls < 20 && open == 0; calls++ {
		r, err := down.Allow(ctx, "user:42", core.PerMinute(3))
		if err != nil || r.BackendErr == nil || r.Allowed {
			t.Fatalf("fail-closed: %+v %v", r, err)
		}
		if errors.Is(r.BackendErr, core.ErrCircuitOpen) {
			open++
		}
	}
	if open == 0 || calls < 2 {
		t.Fatalf("%d calls, %d answered by the open circuit; want it open after the first refusal", calls, open)
	}

	for _, m := range []struct {
		c    prom.Collector
		want float64
	}{
		{c.decisions.WithLabelValues("", OutcomeAllowed), 3},
		{c.decisions.WithLabelValues("", OutcomeDenied), 2},
		{c.decisions.WithLabelValues("", OutcomeError), float64(calls)},
		{c.errors.WithLabelValues("", "fail-closed"), float64(calls)},
		{c.circuit.WithLabelValues(""), float64(open)},
		{c.errors.WithLabelValues("", "fail-open"), 0},
		{c.cacheHits.WithLabelValues(""), 0}, // NewMemory has no deny cache
	} {
		if got := testutil.ToFloat64(m.c); got != m.want {
			t.Errorf("%v: %v, want %v", m.c, got, m.want)
		}
	}
	if n := testutil.CollectAndCount(c, "ratewindow_decision_duration_seconds"); n != 1 {
		t.Fatalf("%d duration series", n)
	}
}

// BenchmarkObserve is the cost of one event for an existing rule.
func BenchmarkObserve(b *testing.B) {
	c := NewCollector(Opts{})
	e := core.Event{Op: core.OpAllow, Rule: "login", Result: core.Result{Allowed: true}, Latency: 200 * time.Microsecond}
	b.ReportAllocs()
	for b.Loop() {
		c.Observe(e)
	}
}

// TestCollectorRefusals: upstream refusals are counted apart, never as
// decisions.
func TestCollectorRefusals(t *testing.T) {
	c := NewCollector(Opts{})
	c.Observe(core.Event{Op: core.OpRefused, Rule: "api", Retried: true})
	c.Observe(core.Event{Op: core.OpRefused, Rule: "api"})
	c.Observe(core.Event{Op: core.OpRefused, Rule: "api", Retried: true})
	for _, m := range []struct {
		c    prom.Collector
		want float64
	}{
		{c.refusals.WithLabelValues("api", "true"), 2},
		{c.refusals.WithLabelValues("api", "false"), 1},
		{c.decisions.WithLabelValues("api", OutcomeDenied), 0},
		{c.decisions.WithLabelValues("api", OutcomeError), 0},
	} {
		if got := testutil.ToFloat64(m.c); got != m.want {
			t.Errorf("%v = %v, want %v", m.c, got, m.want)
		}
	}
}

// TestCollectorBans: a denial that started a Penalty's ban is a denied
// decision and a ban.
func TestCollectorBans(t *testing.T) {
	c := NewCollector(Opts{})
	c.Observe(core.Event{Op: core.OpAllow, Rule: "login"})
	c.Observe(core.Event{Op: core.OpAllow, Rule: "login", Banned: true})
	for _, m := range []struct {
		c    prom.Collector
		want float64
	}{
		{c.bans.WithLabelValues("login"), 1},
		{c.decisions.WithLabelValues("login", OutcomeDenied), 2},
	} {
		if got := testutil.ToFloat64(m.c); got != m.want {
			t.Errorf("%v = %v, want %v", m.c, got, m.want)
		}
	}
}
