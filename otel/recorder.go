package ratewindowotel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ratewindow/ratewindow/core"
)

// Attribute keys and outcome values.
const (
	AttrRule        = "ratewindow.rule"
	AttrOutcome     = "ratewindow.outcome"
	AttrFailureMode = "ratewindow.failure_mode"
	AttrRetried     = "ratewindow.retried"

	OutcomeAllowed = "allowed"
	OutcomeDenied  = "denied"
	OutcomeError   = "error"
	// OutcomeShed: the decision was shed for overload (core.ErrShed):
	// Redis answered other calls but not this one in time; answered as
	// FailClosed answers, and no Redis failure.
	OutcomeShed = "shed"
)

// Recorder turns core.Events into OpenTelemetry measurements. Pass its
// Observe method to core.WithObserver. It is safe for concurrent use; one
// Recorder may observe many Limiters.
type Recorder struct {
	decisions, cacheHits, answers, refusals, bans metric.Int64Counter
	duration                                      metric.Float64Histogram

	rules sync.Map // rule name → *ruleAttrs
}

// ruleAttrs are the attribute sets of one rule, built once.
type ruleAttrs struct {
	allowed, denied, failed, shed metric.MeasurementOption
	rule                          metric.MeasurementOption
	modes                         [core.FailLocal + 1]metric.MeasurementOption
	refused, retried              metric.MeasurementOption
}

// New returns a Recorder whose instruments come from mp's meter
// "github.com/ratewindow/ratewindow/otel".
func New(mp metric.MeterProvider) (*Recorder, error) {
	if mp == nil {
		return nil, errors.New("ratewindow: otel: nil MeterProvider")
	}
	m := mp.Meter("github.com/ratewindow/ratewindow/otel")
	r := &Recorder{}
	var err, e error
	r.decisions, e = m.Int64Counter("ratewindow.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Rate-limit decisions by rule and outcome: allowed, denied, or error when Redis did not decide."))
	err = errors.Join(err, e)
	r.cacheHits, e = m.Int64Counter("ratewindow.deny_cache.hits", metric.WithUnit("{decision}"),
		metric.WithDescription("Denials answered from the deny cache without a round trip to Redis."))
	err = errors.Join(err, e)
	r.answers, e = m.Int64Counter("ratewindow.failure_mode.answers", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions that the failure mode answered because Redis failed, by failure mode."))
	err = errors.Join(err, e)
	r.refusals, e = m.Int64Counter("ratewindow.upstream.refusals", metric.WithUnit("{refusal}"),
		metric.WithDescription("Refusals by an upstream of requests sent through a throttler (nethttp.Transport, grpcmw's client interceptors), which blocked the key for the fleet."))
	err = errors.Join(err, e)
	r.bans, e = m.Int64Counter("ratewindow.bans", metric.WithUnit("{ban}"),
		metric.WithDescription("Keys banned by a rule's Penalty: denials that reached its count and started a ban on every replica."))
	err = errors.Join(err, e)
	r.duration, e = m.Float64Histogram("ratewindow.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time taken by rate-limit decisions, including deny-cache hits and failures; Wait is not included."),
		metric.WithExplicitBucketBoundaries(50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("ratewindow: otel: %w", err)
	}
	return r, nil
}

// Observe records one event. It is a core.Observer:
//
//	core.WithObserver(rec.Observe)
func (r *Recorder) Observe(e core.Event) {
	ctx := context.Background()
	a := r.forRule(e.Rule)
	if e.Op == core.OpRefused {
		if e.Retried {
			r.refusals.Add(ctx, 1, a.retried)
		} else {
			r.refusals.Add(ctx, 1, a.refused)
		}
		return
	}
	if e.Failed && int(e.Fallback) < len(a.modes) {
		r.answers.Add(ctx, 1, a.modes[e.Fallback])
	}
	if e.Op == core.OpPeek {
		return
	}
	switch e.Outcome() {
	case OutcomeShed:
		r.decisions.Add(ctx, 1, a.shed)
	case OutcomeError:
		r.decisions.Add(ctx, 1, a.failed)
	case OutcomeAllowed:
		r.decisions.Add(ctx, 1, a.allowed)
	default:
		r.decisions.Add(ctx, 1, a.denied)
	}
	if e.CacheHit {
		r.cacheHits.Add(ctx, 1, a.rule)
	}
	if e.Banned {
		r.bans.Add(ctx, 1, a.rule)
	}
	if e.Op != core.OpWait {
		r.duration.Record(ctx, e.Latency.Seconds(), a.rule)
	}
}

func (r *Recorder) forRule(rule string) *ruleAttrs {
	if a, ok := r.rules.Load(rule); ok {
		return a.(*ruleAttrs)
	}
	ra := attribute.String(AttrRule, rule)
	set := func(kvs ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{ra}, kvs...)...))
	}
	a := &ruleAttrs{
		allowed: set(attribute.String(AttrOutcome, OutcomeAllowed)),
		denied:  set(attribute.String(AttrOutcome, OutcomeDenied)),
		failed:  set(attribute.String(AttrOutcome, OutcomeError)),
		shed:    set(attribute.String(AttrOutcome, OutcomeShed)),
		rule:    set(),
		refused: set(attribute.Bool(AttrRetried, false)),
		retried: set(attribute.Bool(AttrRetried, true)),
	}
	for mode := range a.modes {
		a.modes[mode] = set(attribute.String(AttrFailureMode, core.FailureMode(mode).String()))
	}
	actual, _ := r.rules.LoadOrStore(rule, a)
	return actual.(*ruleAttrs)
}
