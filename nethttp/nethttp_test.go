package nethttp_test

import (
	"net/http"
	"net/http/httptest"
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
