// Command gin is a gin server rate-limited by ratewindow: a global limit
// per client IP, a stricter one per user on POST /login, and an export that
// costs 5 units. Run it with
//
//	go run ./_examples/gin
//
// It uses REDIS_URL when set, else an embedded Redis, and listens on ADDR
// (default 127.0.0.1:8080).
package main

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/ratewindow/ratewindow/_examples/internal/exampleapp"
	"github.com/ratewindow/ratewindow/ginmw"
)

func main() {
	exampleapp.Main("gin", func(a *exampleapp.App) http.Handler {
		l, rules := a.Limiter, a.Rules
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(gin.Recovery(), ginmw.Limit(l, rules.Global))
		r.GET("/", func(c *gin.Context) {
			c.String(http.StatusOK, "%s", exampleapp.Home("gin"))
		})
		r.GET("/healthz", func(c *gin.Context) {
			c.String(http.StatusOK, "ok\n")
		})
		r.POST("/login", ginmw.Limit(l, rules.Login), func(c *gin.Context) {
			code, body := exampleapp.Login(c.GetHeader("X-User"))
			c.String(code, "%s", body)
		})
		r.GET("/export", ginmw.Limit(l, rules.Export), func(c *gin.Context) {
			c.Data(http.StatusOK, "text/csv", []byte(exampleapp.ExportCSV))
		})
		return r
	})
}
