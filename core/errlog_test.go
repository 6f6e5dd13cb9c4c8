package core

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestErrorLogDefault: without OnError, a rule's key errors are logged with
// slog's default logger, once per second at most, naming the rule once and
// counting the lines left out; the requests are limited under the
// fallback key. (Not parallel: it swaps slog's default.)
func TestErrorLogDefault(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})))
	t.Cleanup(func() { slog.SetDefault(prev) })

	e, err := NewEnforcer(NewMemory(), Rule{Name: "login", Limits: []Limit{PerMinute(100)},
		Key: func(*http.Request) (string, error) { return "", errors.New("ratewindow: header missing") }})
	if err != nil {
		t.Fatal(err)
	}
	serve := func() int {
		rec := httptest.NewRecorder()
		if _, ok := e.Handle(rec, httptest.NewRequest(http.MethodGet, "/", nil), ""); ok {
			return http.StatusOK
		}
		return rec.Code
	}
	for i := range 100 {
		if code := serve(); code != http.StatusOK {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	if code := serve(); code != http.StatusTooManyRequests {
		t.Fatalf("request 101 without a key: %d, want 429 (limited under the fallback key)", code)
	}
	want := `level=WARN msg="ratewindow: a rule's key, cost or limits could not be computed; the request was limited under the rule's fallback (see Rule.FallbackKey)" error="ratewindow: rule login: header missing" errors_not_logged=0` + "\n"
	if got := buf.String(); got != want {
		t.Fatalf("log:\n%s\nwant one line:\n%s", got, want)
	}
	// the next line, a second later, counts the 99 left out
	e.d.logs.next.Store(0)
	buf.Reset()
	serve()
	if got := buf.String(); !strings.Contains(got, "errors_not_logged=100\n") {
		t.Fatalf("second line: %s", got)
	}
}

func TestRuleErrorPrefixOnce(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{errors.New("ratewindow: header missing"), "ratewindow: rule login: header missing"},
		{errors.New("no user"), "ratewindow: rule login: no user"},
	} {
		err := ruleError{"login", unprefixed{c.err}}
		if err.Error() != c.want || !errors.Is(err, c.err) {
			t.Errorf("%q, Is %v; want %q", err.Error(), errors.Is(err, c.err), c.want)
		}
	}
}
