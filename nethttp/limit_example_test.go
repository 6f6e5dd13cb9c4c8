package nethttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
	"github.com/ratewindow/ratewindow/nethttp"
)

func ExampleLimit() {
	l := core.NewMemory() // core.New(redisClient) shares the counts across replicas
	limit := nethttp.Limit(l, core.Rule{
		Name:   "api",
		Limits: []core.Limit{core.Per(2, time.Minute)},
	})
	mux := http.NewServeMux()
	mux.Handle("GET /hello", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))

	for i := 0; i < 3; i++ {
		req := httptest.NewRequest(http.MethodGet, "/hello", nil)
		req.RemoteAddr = "203.0.113.5:4711"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		h := rec.Header()
		fmt.Printf("%d remaining=%s retry-after=%q %q\n", rec.Code, h.Get("X-RateLimit-Remaining"), h.Get("Retry-After"), rec.Body.String())
	}
	// Output:
	// 200 remaining=1 retry-after="" "hello\n"
	// 200 remaining=0 retry-after="" "hello\n"
	// 429 remaining=0 retry-after="60" "Too Many Requests\n"
}

func ExampleWithMux() {
	l := core.NewMemory()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "user", r.PathValue("id"))
	})
	// One limit per route pattern, for the middleware around the whole mux.
	handler := nethttp.Limit(l, core.Rule{
		Name:    "per-route",
		Limits:  []core.Limit{core.PerMinute(1)},
		Key:     keyfuncs.Route(),
		Headers: core.IETF,
	}, nethttp.WithMux(mux))(mux)

	for _, path := range []string{"/users/1", "/users/2"} {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "1-per-1m";r=0;t=60
	// 429 "1-per-1m";r=0;t=60
}
