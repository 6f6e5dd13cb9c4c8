// Command echo is an echo server rate-limited by ratewindow: a global limit
// per client IP, a stricter one per user on POST /login, and an export that
// costs 5 units. Run it with
//
//	go run ./_examples/echo
//
// It uses REDIS_URL when set, else an embedded Redis, and listens on ADDR
// (default 127.0.0.1:8080).
package main

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/ratewindow/ratewindow/_examples/internal/exampleapp"
	"github.com/ratewindow/ratewindow/echomw"
)

func main() {
	exampleapp.Main("echo", func(a *exampleapp.App) http.Handler {
		l, rules := a.Limiter, a.Rules
		e := echo.New()
		e.Use(echomw.Limit(l, rules.Global))
		e.GET("/", func(c echo.Context) error {
			return c.String(http.StatusOK, exampleapp.Home("echo"))
		})
		e.GET("/healthz", func(c echo.Context) error {
			return c.String(http.StatusOK, "ok\n")
		})
		e.POST("/login", func(c echo.Context) error {
			return c.String(exampleapp.Login(c.Request().Header.Get("X-User")))
		}, echomw.Limit(l, rules.Login))
		e.GET("/export", func(c echo.Context) error {
			return c.Blob(http.StatusOK, "text/csv", []byte(exampleapp.ExportCSV))
		}, echomw.Limit(l, rules.Export))
		return e
	})
}
