package nethttp_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
	"github.com/ratewindow/ratewindow/nethttp"
)

// routeRule records the route pattern its key function sees.
func routeRule(seen *[]string) core.Rule {
	return core.Rule{
		Name:   "route",
		Limits: []core.Limit{core.PerMinute(1000)},
		Key: func(r *http.Request) (string, error) {
			k, err := keyfuncs.Route()(r)
			*seen = append(*seen, k)
			if err != nil {
				return "none", nil
			}
			return k, nil
		},
	}
}

func TestRoutePattern(t *testing.T) {
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, tc := range []struct {
		name  string
		build func(rule core.Rule) http.Handler
		want  []string
	}{
		{"around a handler on the mux: Request.Pattern", func(rule core.Rule) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /users/{id}", nethttp.Limit(core.NewMemory(), rule)(ok))
			mux.Handle("/files/", nethttp.Limit(core.NewMemory(), rule)(ok))
			return mux
		}, []string{"route:/users/{id}", "route:/files/", ""}},
		{"around the mux without WithMux: no route", func(rule core.Rule) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /users/{id}", ok)
			mux.Handle("/files/", ok)
			return nethttp.Limit(core.NewMemory(), rule)(mux)
		}, []string{"", "", ""}},
		{"around the mux with WithMux", func(rule core.Rule) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /users/{id}", ok)
			mux.Handle("/files/", ok)
			return nethttp.Limit(core.NewMemory(), rule, nethttp.WithMux(mux))(mux)
		}, []string{"route:/users/{id}", "route:/files/", ""}},
		{"WithRouteFunc", func(rule core.Rule) http.Handler {
			return nethttp.Limit(core.NewMemory(), rule, nethttp.WithRouteFunc(func(r *http.Request) string {
				if strings.HasPrefix(r.URL.Path, "/nowhere") {
					return ""
				}
				return "/custom"
			}))(ok)
		}, []string{"route:/custom", "route:/custom", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []string
			h := tc.build(routeRule(&seen))
			for _, path := range []string{"/users/1", "/files/a/b", "/nowhere"} {
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
			}
			// The key function does not run for /nowhere when the mux
			// answers 404 before the middleware; record it as "".
			for len(seen) < len(tc.want) {
				seen = append(seen, "")
			}
			if strings.Join(seen, ",") != strings.Join(tc.want, ",") {
				t.Errorf("saw %q, want %q", seen, tc.want)
			}
		})
	}
}

func panicText(v any) string {
	switch v := v.(type) {
	case error:
		return v.Error()
	case string:
		return v
	}
	return ""
}

// TestNoRouteNamesWithMux: a rule keyed by route around a whole
// http.ServeMux fails on every request; its error (OnError's, and the
// log's when there is no OnError) names the fix, nethttp.WithMux. Where
// WithMux is given or the pattern is there, it says nothing of the kind.
func TestNoRouteNamesWithMux(t *testing.T) {
	const hint = "ratewindow: rule route: no route pattern (the middleware wraps no handler registered on an http.ServeMux: around the whole mux, pass nethttp.WithMux(mux))"
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	newMux := func(h http.Handler) *http.ServeMux {
		mux := http.NewServeMux()
		mux.Handle("GET /users/{id}", h)
		return mux
	}
	for _, tc := range []struct {
		name  string
		key   keyfuncs.Func
		build func(rule core.Rule) http.Handler
		path  string
		want  string // OnError's error; "" for none
	}{
		{"around the mux", keyfuncs.Route(), func(rule core.Rule) http.Handler {
			return nethttp.Limit(core.NewMemory(), rule)(newMux(ok))
		}, "/users/1", hint},
		{"around the mux, joined", keyfuncs.Join(keyfuncs.IP(), keyfuncs.Route()), func(rule core.Rule) http.Handler {
			return nethttp.Limit(core.NewMemory(), rule)(newMux(ok))
		}, "/users/1", "ratewindow: rule route: no route pattern (Join key 2 of 2) (the middleware wraps no handler registered on an http.ServeMux: around the whole mux, pass nethttp.WithMux(mux))"},
		{"around the mux with WithMux", keyfuncs.Route(), func(rule core.Rule) http.Handler {
			mux := newMux(ok)
			return nethttp.Limit(core.NewMemory(), rule, nethttp.WithMux(mux))(mux)
		}, "/users/1", ""},
		{"around the mux with WithMux, no route matched", keyfuncs.Route(), func(rule core.Rule) http.Handler {
			mux := newMux(ok)
			return nethttp.Limit(core.NewMemory(), rule, nethttp.WithMux(mux))(mux)
		}, "/nowhere", "ratewindow: rule route: no route pattern"},
		{"around a handler on the mux", keyfuncs.Route(), func(rule core.Rule) http.Handler {
			return newMux(nethttp.Limit(core.NewMemory(), rule)(ok))
		}, "/users/1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			rule := core.Rule{
				Name:   "route",
				Limits: []core.Limit{core.PerMinute(1000)},
				Key:    tc.key,
				OnError: func(_ http.ResponseWriter, _ *http.Request, err error) {
					if !errors.Is(err, keyfuncs.ErrNoRoute) {
						t.Errorf("%v does not match keyfuncs.ErrNoRoute", err)
					}
					got = append(got, err.Error())
				},
			}
			r := httptest.NewRequest(http.MethodGet, tc.path, nil)
			tc.build(rule).ServeHTTP(httptest.NewRecorder(), r)
			var want []string
			if tc.want != "" {
				want = []string{tc.want}
			}
			if !slices.Equal(got, want) {
				t.Errorf("OnError saw %q, want %q", got, want)
			}
		})
	}

	// Without OnError, the rule's warning in the log says the same.
	var buf bytes.Buffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})))
	rule := core.Rule{Name: "route", Limits: []core.Limit{core.PerMinute(1000)}, Key: keyfuncs.Route()}
	nethttp.Limit(core.NewMemory(), rule)(newMux(ok)).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/users/1", nil))
	if want := fmt.Sprintf(" error=%q ", hint); !strings.HasPrefix(buf.String(), "level=WARN ") || strings.Count(buf.String(), "\n") != 1 || !strings.Contains(buf.String(), want) {
		t.Errorf("logged\n%s\nwant one warning with%s", buf.String(), want)
	}
}
