package nethttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

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

func TestInvalidRule(t *testing.T) {
	if _, err := nethttp.New(core.NewMemory(), core.Rule{Name: "bad name", Limits: []core.Limit{core.PerMinute(1)}}); !errors.Is(err, core.ErrInvalidRule) {
		t.Errorf("New() = %v, want ErrInvalidRule", err)
	}
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"invalid rule", func() { nethttp.Limit(core.NewMemory(), core.Rule{Name: "x"}) }},
		{"nil next", func() {
			nethttp.Limit(core.NewMemory(), core.Rule{Name: "x", Limits: []core.Limit{core.PerMinute(1)}})(nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if msg := panicText(recover()); !strings.HasPrefix(msg, "ratewindow: ") {
					t.Errorf("panicked with %q, want a ratewindow: message", msg)
				}
			}()
			tc.f()
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

func TestLimitByIP(t *testing.T) {
	l := core.NewMemory()
	h := nethttp.LimitByIP(l, 2, time.Minute)(nethttp.LimitByIP(l, 5, time.Hour)(http.NotFoundHandler()))
	var codes []int
	for _, ip := range []string{"203.0.113.9", "203.0.113.9", "203.0.113.9", "198.51.100.1"} {
		rec, req := httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = ip + ":4000"
		h.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	if !slices.Equal(codes, []int{404, 404, 429, 404}) {
		t.Fatalf("codes %v, want [404 404 429 404]", codes)
	}
}
