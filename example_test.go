package ratewindow_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
	"github.com/ratewindow/ratewindow/nethttp"
)

// Two rules on one route: a global limit per client IP and a stricter one
// per IP and route on the login. Each counts under its own name; the
// response shows the most restrictive of the two.
func Example() {
	l := core.NewMemory() // core.New(redisClient) shares the counts across replicas
	global := nethttp.Limit(l, core.Rule{
		Name:   "global",
		Limits: []core.Limit{core.PerMinute(100)},
	})
	login := nethttp.Limit(l, core.Rule{
		Name:   "login",
		Limits: []core.Limit{core.PerMinute(2)},
		Key:    keyfuncs.Join(keyfuncs.IP(), keyfuncs.Route()),
	})
	mux := http.NewServeMux()
	mux.Handle("POST /login", login(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "welcome")
	})))
	handler := global(mux)

	for i := 0; i < 3; i++ {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/login", nil))
		h := rec.Header()
		fmt.Println(rec.Code, "limit", h.Get("X-RateLimit-Limit"), "remaining", h.Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 limit 2 remaining 1
	// 200 limit 2 remaining 0
	// 429 limit 2 remaining 0
}
