// Package ratewindowprom exports the decisions of ratewindow Limiters as
// Prometheus metrics. It is a module of its own, so that the main module
// does not depend on the Prometheus client.
//
// Its import path ends in "prometheus", and its name is ratewindowprom, so
// that a file can use it beside the client library's own prometheus
// package without an alias:
//
//	import (
//		"github.com/prometheus/client_golang/prometheus"
//		"github.com/ratewindow/ratewindow/prometheus" // package ratewindowprom
//	)
//
// A Collector is both the Limiter's observer and a prometheus.Collector:
//
//	c := ratewindowprom.NewCollector(ratewindowprom.Opts{})
//	prometheus.MustRegister(c)
//	l, err := core.New(rdb, core.WithObserver(c.Observe))
//
// # Metrics
//
//	ratewindow_decisions_total{rule, outcome}        counter
//	ratewindow_deny_cache_hits_total{rule}           counter
//	ratewindow_backend_errors_total{rule, mode}      counter
//	ratewindow_decision_duration_seconds{rule}       histogram
//	ratewindow_upstream_refusals_total{rule, retried} counter
//	ratewindow_bans_total{rule}                      counter
//	ratewindow_circuit_open_total{rule}              counter
//
// rule is the Rule's Name for decisions of the HTTP middleware, and empty
// for direct calls of the Limiter (Allow, AllowN, Wait).
// Keys are never labels: the number of series is bounded by the number of
// rules.
//
// outcome is "allowed" or "denied" for the answers of Redis (or of the deny
// cache), and "error" when Redis gave no answer in time and the failure
// mode answered instead (mode is then "fail-open", "fail-closed" or
// "fail-local"), or when no decision was made because the caller's context
// ended first. A Wait counts as allowed when the caller may proceed, else
// as denied, also when its context ended while it waited (it gave up).
//
// ratewindow_upstream_refusals_total counts the refusals (429, 503 with
// Retry-After, RateLimit r=0) of an upstream called through
// nethttp.Transport; each blocked the key for every replica, and retried
// is "true" when the request went again.
//
// ratewindow_bans_total counts the bans a rule's Penalty started: each
// denial that reached the Penalty's count (it is also a denied decision).
//
// ratewindow_circuit_open_total counts the calls the failure mode answered
// because the circuit breaker was open, without asking Redis (they are
// also backend errors): it is zero while Redis answers, and its rate shows
// when and for which rules the breaker stood open.
//
// ratewindow_deny_cache_hits_total counts the denials answered from memory
// without a round trip; they are also counted as denied decisions.
//
// The duration histogram measures Allow, AllowN and the middleware's
// decisions, including deny-cache hits and failures; it leaves out Wait,
// whose duration is mostly the wait itself. Peek is not a decision: it is
// counted only when Redis fails.
package ratewindowprom
