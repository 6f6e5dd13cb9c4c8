// Command chi is a chi server rate-limited by ratewindow: a global limit
// per client IP, a stricter one per user on POST /login, and an export that
// costs 5 units. Run it with
//
//	go run ./_examples/chi
//
// It uses REDIS_URL when set, else an embedded Redis, and listens on ADDR
// (default 127.0.0.1:8080).
package main

import (
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/ratewindow/ratewindow/_examples/internal/exampleapp"
	"github.com/ratewindow/ratewindow/chimw"
)

func main() {
	exampleapp.Main("chi", func(a *exampleapp.App) http.Handler {
		l, rules := a.Limiter, a.Rules
		r := chi.NewRouter()
		r.Use(chimw.Limit(l, rules.Global))
		r.Get("/", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, exampleapp.Home("chi"))
		})
		r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ok\n")
		})
		r.With(chimw.Limit(l, rules.Login)).Post("/login", func(w http.ResponseWriter, r *http.Request) {
			code, body := exampleapp.Login(r.Header.Get("X-User"))
			w.WriteHeader(code)
			io.WriteString(w, body)
		})
		r.With(chimw.Limit(l, rules.Export)).Get("/export", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/csv")
			io.WriteString(w, exampleapp.ExportCSV)
		})
		return r
	})
}
