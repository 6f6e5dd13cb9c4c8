// Command nethttp is a net/http server rate-limited by ratewindow: a global
// limit per client IP, a stricter one per user on POST /login, and an
// export that costs 5 units. Run it with
//
//	go run ./_examples/nethttp
//
// It uses REDIS_URL when set, else an embedded Redis, and listens on ADDR
// (default 127.0.0.1:8080).
package main

import (
	"io"
	"net/http"

	"github.com/ratewindow/ratewindow/_examples/internal/exampleapp"
	"github.com/ratewindow/ratewindow/nethttp"
)

func main() {
	exampleapp.Main("net/http", func(a *exampleapp.App) http.Handler {
		l, rules := a.Limiter, a.Rules
		mux := http.NewServeMux()
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, exampleapp.Home("net/http"))
		})
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ok\n")
		})
		// keyfuncs.Route() reads r.Pattern, which the mux sets before it calls
		// the handler it matched: wrap the handler, not the mux.
		mux.Handle("POST /login", nethttp.Limit(l, rules.Login)(http.HandlerFunc(
			func(w http.ResponseWriter, r *http.Request) {
				code, body := exampleapp.Login(r.Header.Get("X-User"))
				w.WriteHeader(code)
				io.WriteString(w, body)
			})))
		mux.Handle("GET /export", nethttp.Limit(l, rules.Export)(http.HandlerFunc(
			func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/csv")
				io.WriteString(w, exampleapp.ExportCSV)
			})))
		// The global limit wraps the whole mux: it keys by IP, not by route.
		return nethttp.Limit(l, rules.Global)(mux)
	})
}
