package ratewindowotel

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratewindow/ratewindow/core"
)

// collect returns every data point of the reader's metrics: counter sums and
// histogram counts, by metric name and attribute set.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[attribute.Distinct]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[attribute.Distinct]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			pts := map[attribute.Distinct]int64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					pts[p.Attributes.Equivalent()] = p.Value
					if _, ok := p.Attributes.Value("ratewindow.key"); ok {
						t.Fatalf("%s has a key attribute", m.Name)
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					pts[p.Attributes.Equivalent()] = int64(p.Count)
				}
			}
			out[m.Name] = pts
		}
	}
	return out
}

func set(kvs ...attribute.KeyValue) attribute.Distinct {
	s := attribute.NewSet(kvs...)
	return s.Equivalent()
}

func TestRecorder(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	rec, err := New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := core.PerMinute(2)

	// decisions on memory: 2 allowed, 1 denied
	l := core.NewMemory(core.WithObserver(rec.Observe))
	for range 3 {
		l.Allow(ctx, "user:1", lim)
	}
	l.Peek(ctx, "user:1", lim) // not counted
	// a Redis nobody listens at: each mode answers, once each
	for _, mode := range []core.FailureMode{core.FailOpen, core.FailClosed, core.FailLocal} {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}) // loopback, a closed port
		t.Cleanup(func() { rdb.Close() })
		down, err := core.New(rdb, core.WithFailureMode(mode), core.WithLocalShare(1), core.WithTimeout(50*time.Millisecond), core.WithObserver(rec.Observe))
		if err != nil {
			t.Fatal(err)
		}
		down.Allow(ctx, "user:1", lim)
	}
	// a deny-cache hit: on Redis that fails closed, no; use a denied key
	// twice on a Limiter with a deny cache (the memory one has none)
	rec.Observe(core.Event{Op: core.OpAllow, Rule: "login", CacheHit: true})
	rec.Observe(core.Event{Op: core.OpRefused, Rule: "api", Retried: true})
	rec.Observe(core.Event{Op: core.OpAllow, Rule: "login", Banned: true})                // a Penalty's ban
	rec.Observe(core.Event{Op: core.OpAllow, Rule: "api", Shed: true, Err: core.ErrShed}) // overload: no failure

	got := collect(t, reader)
	rule := func(r string) attribute.KeyValue { return attribute.String(AttrRule, r) }
	for _, c := range []struct {
		metric string
		attrs  attribute.Distinct
		want   int64
	}{
		{"ratewindow.decisions", set(rule(""), attribute.String(AttrOutcome, OutcomeAllowed)), 2},
		{"ratewindow.decisions", set(rule(""), attribute.String(AttrOutcome, OutcomeDenied)), 1},
		{"ratewindow.decisions", set(rule(""), attribute.String(AttrOutcome, OutcomeError)), 3},
		{"ratewindow.decisions", set(rule("login"), attribute.String(AttrOutcome, OutcomeDenied)), 2},
		{"ratewindow.decisions", set(rule("api"), attribute.String(AttrOutcome, OutcomeShed)), 1},
		{"ratewindow.bans", set(rule("login")), 1},
		{"ratewindow.failure_mode.answers", set(rule(""), attribute.String(AttrFailureMode, "fail-open")), 1},
		{"ratewindow.failure_mode.answers", set(rule(""), attribute.String(AttrFailureMode, "fail-closed")), 1},
		{"ratewindow.failure_mode.answers", set(rule(""), attribute.String(AttrFailureMode, "fail-local")), 1},
		{"ratewindow.deny_cache.hits", set(rule("login")), 1},
		{"ratewindow.upstream.refusals", set(rule("api"), attribute.Bool(AttrRetried, true)), 1},
		{"ratewindow.decision.duration", set(rule("")), 6},
	} {
		if v := got[c.metric][c.attrs]; v != c.want {
			t.Errorf("%s %v = %d, want %d", c.metric, c.attrs, v, c.want)
		}
	}
}

func TestNewNil(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Fatal("New(nil) = nil error, want one")
	}
}

func BenchmarkObserve(b *testing.B) {
	rec, err := New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))
	if err != nil {
		b.Fatal(err)
	}
	ev := core.Event{Op: core.OpAllow, Rule: "login", Result: core.Result{Allowed: true}, Latency: time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		rec.Observe(ev)
	}
}
