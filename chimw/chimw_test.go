package chimw_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/ratewindow/ratewindow/chimw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

// TestRoutePattern checks the pattern the key function sees, wherever the
// middleware is installed: it must be the one chi gives the handler.
func TestRoutePattern(t *testing.T) {
	var seen []string
	rule := core.Rule{
		Name:   "pattern",
		Limits: []core.Limit{core.PerMinute(1000)},
		Key: func(r *http.Request) (string, error) {
			p, _ := keyfuncs.RouteFrom(r.Context())
			seen = append(seen, p)
			return "k", nil
		},
	}
	mw := chimw.Limit(core.NewMemory(), rule)
	handler := func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, "handler:"+chi.RouteContext(r.Context()).RoutePattern())
	}

	r := chi.NewRouter()
	r.Use(mw) // before routing
	r.Get("/", handler)
	r.Get("/users/{id}", handler)
	r.Get("/static/*", handler)
	r.With(mw).Get("/inline/{id}", handler) // after routing
	r.Route("/api", func(r chi.Router) {
		r.Use(mw) // inside a sub-router, before its routing
		r.Get("/", handler)
		r.Get("/items/{id}", handler)
		r.Route("/v2", func(r chi.Router) {
			r.Get("/things/{id}/*", handler)
		})
	})
	sub := chi.NewRouter()
	sub.Use(mw)
	sub.Get("/{name}", handler)
	r.Mount("/mounted", sub)

	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/", []string{"/", "handler:/"}},
		{"/users/7", []string{"/users/{id}", "handler:/users/{id}"}},
		{"/static/css/site.css", []string{"/static/*", "handler:/static/*"}},
		{"/inline/3", []string{"/inline/{id}", "/inline/{id}", "handler:/inline/{id}"}},
		{"/api", []string{"/api", "/api", "handler:/api"}},
		{"/api/", []string{"/api", "/api", "handler:/api"}},
		{"/api/items/9", []string{"/api/items/{id}", "/api/items/{id}", "handler:/api/items/{id}"}},
		{"/api/v2/things/1/a/b", []string{"/api/v2/things/{id}/*", "/api/v2/things/{id}/*", "handler:/api/v2/things/{id}/*"}},
		{"/mounted/bob", []string{"/mounted/{name}", "/mounted/{name}", "handler:/mounted/{name}"}},
		{"/nowhere", []string{""}},
	} {
		seen = nil
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, tc.path, nil))
		if strings.Join(seen, " | ") != strings.Join(tc.want, " | ") {
			t.Errorf("%s: saw %q, want %q", tc.path, seen, tc.want)
		}
	}
}

func TestOutsideChi(t *testing.T) {
	var saw string
	h := chimw.Limit(core.NewMemory(), core.Rule{
		Name:   "outside",
		Limits: []core.Limit{core.PerMinute(5)},
		Key: func(r *http.Request) (string, error) {
			saw, _ = keyfuncs.RouteFrom(r.Context())
			return "k", nil
		},
	})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	if rec.Code != 200 || saw != "" {
		t.Errorf("got %d with route %q, want 200 without a route", rec.Code, saw)
	}
}

func ExampleLimit() {
	l := core.NewMemory() // core.New(redisClient) shares the counts across replicas
	r := chi.NewRouter()
	// Router-wide, before routing: the key still sees the route pattern.
	r.Use(chimw.Limit(l, core.Rule{
		Name:    "per-route",
		Limits:  []core.Limit{core.PerMinute(2)},
		Key:     keyfuncs.Join(keyfuncs.IP(), keyfuncs.Route()),
		Headers: core.IETF,
	}))
	r.Get("/users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "user", chi.URLParam(r, "id"))
	})

	for _, path := range []string{"/users/1", "/users/2", "/users/3"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Printf("%s %d %s %q\n", path, rec.Code, rec.Header().Get("RateLimit"), rec.Body.String())
	}
	// Output:
	// /users/1 200 "2-per-1m";r=1;t=60 "user 1\n"
	// /users/2 200 "2-per-1m";r=0;t=60 "user 2\n"
	// /users/3 429 "2-per-1m";r=0;t=60 "Too Many Requests\n"
}
