// Package prometheus exports the decisions of ratewindow Limiters as
// Prometheus metrics. It is a module of its own, so that the main module
// does not depend on the Prometheus client.
//
// A Collector is both the Limiter's observer and a prometheus.Collector:
//
//	c := prometheus.NewCollector(prometheus.Opts{})
//	registry.MustRegister(c)
//	l, err := core.New(rdb, core.WithObserver(c.Observe))
//
// # Metrics
//
//	ratewindow_decisions_total{rule, outcome}        counter
//	ratewindow_deny_cache_hits_total{rule}           counter
//	ratewindow_backend_errors_total{rule, mode}      counter
//	ratewindow_decision_duration_seconds{rule}       histogram
//
// rule is the Rule's Name for decisions of the HTTP middleware, and empty
// for direct calls of the Limiter (Allow, AllowN, Wait).
// Keys are never labels: the number of series is bounded by the number of
// rules.
//
// outcome is "allowed" or "denied" for the answers of Redis (or of the deny
// cache), and "error" when Redis gave no answer in time and the failure
// mode answered instead; mode is then "fail-open", "fail-closed" or
// "fail-local". A Wait counts as allowed when the caller may proceed.
//
// ratewindow_deny_cache_hits_total counts the denials answered from memory
// without a round trip; they are also counted as denied decisions.
//
// The duration histogram measures Allow, AllowN and the middleware's
// decisions, including deny-cache hits and failures; it leaves out Wait,
// whose duration is mostly the wait itself. Peek is not a decision: it is
// counted only when Redis fails.
package prometheus
