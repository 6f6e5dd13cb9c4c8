// Package ratewindowotel records the decisions of ratewindow Limiters as
// OpenTelemetry metrics. It is a module of its own, so that the main module
// does not depend on OpenTelemetry.
//
// Its import path ends in "otel", and its name is ratewindowotel, so that a
// file can use it beside go.opentelemetry.io/otel without an alias.
//
//	rec, err := ratewindowotel.New(otel.GetMeterProvider())
//	l, err := core.New(rdb, core.WithObserver(rec.Observe))
//
// # Instruments
//
//	ratewindow.decisions               counter    {decision}  ratewindow.rule, ratewindow.outcome
//	ratewindow.decision.duration       histogram  s           ratewindow.rule
//	ratewindow.deny_cache.hits         counter    {decision}  ratewindow.rule
//	ratewindow.failure_mode.answers    counter    {decision}  ratewindow.rule, ratewindow.failure_mode
//	ratewindow.upstream.refusals       counter    {refusal}   ratewindow.rule, ratewindow.retried
//	ratewindow.bans                    counter    {ban}       ratewindow.rule
//
// ratewindow.rule is the Rule's Name (empty for direct calls of the
// Limiter). ratewindow.outcome is "allowed" or "denied" when Redis (or the
// deny cache) decided, and "error" when it did not: the failure mode
// answered (ratewindow.failure_mode names it: fail-open, fail-closed,
// fail-local), or the caller's context ended first. A Wait counts as
// allowed when the caller may proceed, else as denied, also when its
// context ended while it waited (it gave up). Peek is not counted. The duration
// leaves out Wait, whose time is mostly the wait itself. Keys are never
// attributes: the number of series is bounded by the number of rules.
//
// # Traces
//
// Every Limiter call passes its context to go-redis, so with go-redis's
// redisotel instrumentation the script calls of a decision are spans of
// the request's trace (see the example).
package ratewindowotel
