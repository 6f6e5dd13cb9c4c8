package ratewindowprom

import (
	"errors"
	"sync"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/ratewindow/ratewindow/core"
)

// Opts configures a Collector. The zero value is ready to use.
type Opts struct {
	// ConstLabels are added to every metric, such as {"service": "api"}.
	ConstLabels prom.Labels
	// Buckets are the upper bounds, in seconds, of the decision duration
	// histogram. Nil means DefaultBuckets().
	Buckets []float64
}

// DefaultBuckets returns the default buckets of the decision duration
// histogram: from 50µs (a deny-cache hit, a round trip on loopback) to 1s,
// around the default timeout of 100ms.
func DefaultBuckets() []float64 {
	return []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1}
}

// Outcome label values of ratewindow_decisions_total.
const (
	OutcomeAllowed = "allowed"
	OutcomeDenied  = "denied"
	OutcomeError   = "error"
	// OutcomeShed: the decision was shed for overload (core.ErrShed):
	// Redis answered other calls but not this one in time; answered as
	// FailClosed answers, and no Redis failure.
	OutcomeShed = "shed"
)

// Collector turns core.Events into Prometheus metrics. Pass its Observe
// method to core.WithObserver and register it with a Prometheus registry.
// It is safe for concurrent use; one Collector may observe many Limiters.
type Collector struct {
	decisions *prom.CounterVec
	cacheHits *prom.CounterVec
	errors    *prom.CounterVec
	duration  *prom.HistogramVec
	refusals  *prom.CounterVec
	bans      *prom.CounterVec
	circuit   *prom.CounterVec

	rules sync.Map // rule name → *ruleMetrics
}

// ruleMetrics are the series of one rule, looked up once.
type ruleMetrics struct {
	allowed, denied, failed prom.Counter
	shed                    prom.Counter
	cacheHits               prom.Counter
	bans                    prom.Counter
	circuit                 prom.Counter                     // calls the open breaker answered
	errors                  [core.FailLocal + 1]prom.Counter // by failure mode
	duration                prom.Observer
	refused, retried        prom.Counter // upstream refusals, without and with a retry
}

// NewCollector returns a Collector with the metrics of the package
// documentation.
func NewCollector(opts Opts) *Collector {
	buckets := opts.Buckets
	if buckets == nil {
		buckets = DefaultBuckets()
	}
	return &Collector{
		decisions: prom.NewCounterVec(prom.CounterOpts{
			Name:        "ratewindow_decisions_total",
			Help:        "Rate-limit decisions by rule and outcome: allowed, denied, error when the failure mode answered for Redis, or shed when this process's decision ran out of time while Redis answered (overload).",
			ConstLabels: opts.ConstLabels,
		}, []string{"rule", "outcome"}),
		cacheHits: prom.NewCounterVec(prom.CounterOpts{
			Name:        "ratewindow_deny_cache_hits_total",
			Help:        "Denials answered from the deny cache without a round trip to Redis.",
			ConstLabels: opts.ConstLabels,
		}, []string{"rule"}),
		refusals: prom.NewCounterVec(prom.CounterOpts{
			Name:        "ratewindow_upstream_refusals_total",
			Help:        "Refusals by an upstream of requests sent through a throttler (nethttp.Transport), which blocked the key for the fleet; retried says whether the request went again.",
			ConstLabels: opts.ConstLabels,
		}, []string{"rule", "retried"}),
		bans: prom.NewCounterVec(prom.CounterOpts{
			Name:        "ratewindow_bans_total",
			Help:        "Keys banned by a rule's Penalty: denials that reached its count and started a ban on every replica.",
			ConstLabels: opts.ConstLabels,
		}, []string{"rule"}),
		circuit: prom.NewCounterVec(prom.CounterOpts{
			Name:        "ratewindow_circuit_open_total",
			Help:        "Calls the failure mode answered without asking Redis because the circuit breaker was open (after failures in a row; it probes Redis again every 250ms). Also counted in ratewindow_backend_errors_total.",
			ConstLabels: opts.ConstLabels,
		}, []string{"rule"}),
		errors: prom.NewCounterVec(prom.CounterOpts{
			Name:        "ratewindow_backend_errors_total",
			Help:        "Calls that Redis did not answer in time (an error, the timeout or the open circuit breaker), by the failure mode that answered instead.",
			ConstLabels: opts.ConstLabels,
		}, []string{"rule", "mode"}),
		duration: prom.NewHistogramVec(prom.HistogramOpts{
			Name:        "ratewindow_decision_duration_seconds",
			Help:        "Time taken by rate-limit decisions, including deny-cache hits and failures; Wait is not included.",
			ConstLabels: opts.ConstLabels,
			Buckets:     buckets,
		}, []string{"rule"}),
	}
}

// Observe records one decision. It is a core.Observer:
//
//	core.WithObserver(c.Observe)
func (c *Collector) Observe(e core.Event) {
	m := c.forRule(e.Rule)
	if e.Op == core.OpRefused { // no decision: an upstream's answer
		if e.Retried {
			m.retried.Inc()
		} else {
			m.refused.Inc()
		}
		return
	}
	if e.Failed && int(e.Fallback) < len(m.errors) {
		m.errors[e.Fallback].Inc()
		if errors.Is(e.Err, core.ErrCircuitOpen) {
			m.circuit.Inc()
		}
	}
	if e.Op == core.OpPeek {
		return
	}
	switch e.Outcome() {
	case OutcomeShed:
		m.shed.Inc()
	case OutcomeError:
		m.failed.Inc()
	case OutcomeAllowed:
		m.allowed.Inc()
	default:
		m.denied.Inc()
	}
	if e.CacheHit {
		m.cacheHits.Inc()
	}
	if e.Banned {
		m.bans.Inc()
	}
	if e.Op != core.OpWait {
		m.duration.Observe(e.Latency.Seconds())
	}
}

func (c *Collector) forRule(rule string) *ruleMetrics {
	if m, ok := c.rules.Load(rule); ok {
		return m.(*ruleMetrics)
	}
	m := &ruleMetrics{
		allowed:   c.decisions.WithLabelValues(rule, OutcomeAllowed),
		denied:    c.decisions.WithLabelValues(rule, OutcomeDenied),
		failed:    c.decisions.WithLabelValues(rule, OutcomeError),
		shed:      c.decisions.WithLabelValues(rule, OutcomeShed),
		cacheHits: c.cacheHits.WithLabelValues(rule),
		bans:      c.bans.WithLabelValues(rule),
		circuit:   c.circuit.WithLabelValues(rule),
		duration:  c.duration.WithLabelValues(rule),
		refused:   c.refusals.WithLabelValues(rule, "false"),
		retried:   c.refusals.WithLabelValues(rule, "true"),
	}
	for mode := range m.errors {
		m.errors[mode] = c.errors.WithLabelValues(rule, core.FailureMode(mode).String())
	}
	actual, _ := c.rules.LoadOrStore(rule, m)
	return actual.(*ruleMetrics)
}

// Describe sends the descriptions of the metrics. It implements
// prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prom.Desc) {
	c.decisions.Describe(ch)
	c.cacheHits.Describe(ch)
	c.errors.Describe(ch)
	c.duration.Describe(ch)
	c.refusals.Describe(ch)
	c.bans.Describe(ch)
	c.circuit.Describe(ch)
}

// Collect sends the current values of the metrics. It implements
// prometheus.Collector.
func (c *Collector) Collect(ch chan<- prom.Metric) {
	c.decisions.Collect(ch)
	c.cacheHits.Collect(ch)
	c.errors.Collect(ch)
	c.duration.Collect(ch)
	c.refusals.Collect(ch)
	c.bans.Collect(ch)
	c.circuit.Collect(ch)
}

var _ prom.Collector = (*Collector)(nil)
