package core

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
)

// ruleError is an error of a rule's key function, cost function or
// backend, as OnError receives it: "ratewindow: rule login: ..." with the
// prefix once, whether or not the cause has it.
type ruleError struct {
	rule string
	err  error
}

func (e ruleError) Error() string {
	msg, _ := strings.CutPrefix(e.err.Error(), "ratewindow: ")
	return "ratewindow: rule " + e.rule + ": " + msg
}

func (e ruleError) Unwrap() error { return e.err }

// errorLog logs a rule's errors with slog.Default when the rule has no
// OnError, at most one line per errorLogEvery: a flood of failing
// requests cannot flood the log.
type errorLog struct {
	next    atomic.Int64 // ns: no line before then
	skipped atomic.Int64 // errors not logged since the last line
}

const errorLogEvery = time.Second

func (l *errorLog) log(err error, mode FailureMode) {
	now := time.Now().UnixNano()
	next := l.next.Load()
	if now < next || !l.next.CompareAndSwap(next, now+int64(errorLogEvery)) {
		l.skipped.Add(1)
		return
	}
	slog.Default().LogAttrs(context.Background(), slog.LevelWarn, "ratewindow: a rule could not decide; the failure mode answered",
		slog.String("error", err.Error()), slog.String("failure_mode", mode.String()),
		slog.Int64("errors_not_logged", l.skipped.Swap(0)))
}
