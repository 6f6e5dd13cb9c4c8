package core

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestFailOpenSurvivesErrReturn: the most natural Go code around Allow,
// "if err != nil { return err }", keeps a fail-open service up while Redis
// is dead: the failure mode's answer is a decision with a nil error, and
// Result.BackendErr holds the failure. The same code under FailClosed
// denies, still without an error.
func TestFailOpenSurvivesErrReturn(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode    FailureMode
		status  int
		allowed bool
	}{{FailOpen, http.StatusOK, true}, {FailClosed, http.StatusTooManyRequests, false}} {
		t.Run(c.mode.String(), func(t *testing.T) {
			t.Parallel()
			p := redistest.Start(t)
			l, err := New(p.Client(t), WithPrefix(uniquePrefix(t)), WithFailureMode(c.mode))
			if err != nil {
				t.Fatal(err)
			}
			var backendErrs int
			shed := false // the last decision was shed (see below)
			handler := func(w http.ResponseWriter, r *http.Request) error {
				res, err := l.Allow(r.Context(), "user:42", PerMinute(100))
				if err != nil {
					return err
				}
				if res.BackendErr != nil {
					backendErrs++ // a service logs it
				}
				shed = errors.Is(res.BackendErr, ErrShed)
				if !res.Allowed {
					w.WriteHeader(http.StatusTooManyRequests)
					return nil
				}
				w.WriteHeader(http.StatusOK)
				return nil
			}
			serve := func() (int, error) {
				rec := httptest.NewRecorder()
				if err := handler(rec, httptest.NewRequest(http.MethodGet, "/", nil)); err != nil {
					return http.StatusInternalServerError, err
				}
				return rec.Code, nil
			}
			if code, err := serve(); code != http.StatusOK || err != nil || backendErrs != 0 {
				t.Fatalf("redis up: %d %v, %d backend errors", code, err, backendErrs)
			}
			p.Kill(t)
			for i := range 20 { // timeouts, then the open circuit
				code, err := serve()
				// a first call that ran out of time (go-redis's dial retries)
				// while this process was short of CPU, a moment after Redis
				// answered, is shed: denied whatever the mode (a loaded machine)
				if err != nil || code != c.status && !(shed && i == 0 && code == http.StatusTooManyRequests) {
					t.Fatalf("redis down, request %d: %d %v; want %d and no error", i, code, err, c.status)
				}
			}
			if backendErrs != 20 {
				t.Fatalf("%d backend errors seen by the handler, want 20", backendErrs)
			}
			// the same holds for Peek and, with its own rule, for WaitN
			r, err := l.Peek(context.Background(), "user:42", PerMinute(100))
			if err != nil || r.BackendErr == nil || r.Allowed != c.allowed {
				t.Fatalf("Peek with redis down: %+v %v", r, err)
			}
			err = l.Wait(context.Background(), "user:42", PerMinute(100))
			if got := err == nil; got != c.allowed {
				t.Fatalf("Wait with redis down under %s: %v", c.mode, err)
			}
			if !c.allowed && !isBackendError(err) {
				t.Fatalf("Wait under fail-closed: %v, want the backend failure", err)
			}
			// bad input is still an error: no decision
			if _, err := l.Allow(context.Background(), "", PerMinute(1)); !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("empty key: %v", fmt.Sprint(err))
			}
		})
	}
}

// isBackendError reports whether err is a failure of Redis that the caller
// is told of (a backendError).
func isBackendError(err error) bool {
	var be backendError
	return errors.As(err, &be)
}
