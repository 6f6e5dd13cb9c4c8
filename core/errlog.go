package core

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// ruleError is a rule's error for OnError: "ratewindow: rule login: ...",
// the prefix once; it unwraps to the error unprefixed holds.
type ruleError struct {
	rule string
	unprefixed
}

func (e ruleError) Error() string { return "ratewindow: rule " + e.rule + ": " + e.unprefixed.Error() }

// errorLog logs the errors of a rule without OnError to slog.Default, at
// most one line a second.
type errorLog struct {
	next    atomic.Int64 // ns: no line before then
	skipped atomic.Int64 // errors not logged since the last line
}

// What a rule did about the error.
const (
	fallbackMessage  = "ratewindow: a rule's key, cost or limits could not be computed; the request was limited under the rule's fallback (see Rule.FallbackKey)"
	failureMessage   = "ratewindow: a rule could not decide; the failure mode answered"
	refundMessage    = "ratewindow: a rule could not give back a request's units (Rule.CountIf)"
	undecidedMessage = "ratewindow: a request got no decision and was answered 503"
)

func (l *errorLog) log(err error, msg string, mode FailureMode) {
	now := time.Now().UnixNano()
	next := l.next.Load()
	if now < next || !l.next.CompareAndSwap(next, now+int64(time.Second)) {
		l.skipped.Add(1)
		return
	}
	attrs := []slog.Attr{slog.String("error", err.Error())}
	if msg == failureMessage {
		attrs = append(attrs, slog.String("failure_mode", mode.String()))
	}
	attrs = append(attrs, slog.Int64("errors_not_logged", l.skipped.Swap(0)))
	slog.Default().LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}
