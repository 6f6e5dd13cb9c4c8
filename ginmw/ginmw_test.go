package ginmw_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/ginmw"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

func TestAbortAndRoute(t *testing.T) {
	gin.SetMode(gin.TestMode)
	var routes []string
	var handled int
	e := gin.New()
	e.Use(ginmw.Limit(core.NewMemory(), core.Rule{
		Name:   "gin",
		Limits: []core.Limit{core.PerMinute(1)},
		Key: func(r *http.Request) (string, error) {
			p, _ := keyfuncs.RouteFrom(r.Context())
			routes = append(routes, p)
			return keyfuncs.Route()(r)
		},
	}))
	after := func(c *gin.Context) { handled++ }
	e.GET("/users/:id", after, func(c *gin.Context) { c.String(200, "ok") })

	for _, path := range []string{"/users/1", "/users/2"} {
		e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	if strings.Join(routes, ",") != "/users/:id,/users/:id" || handled != 1 {
		t.Errorf("routes %q, later handlers ran %d times; want /users/:id twice and 1 run", routes, handled)
	}
}

func ExampleLimit() {
	gin.SetMode(gin.ReleaseMode) // no debug output
	l := core.NewMemory()        // core.New(redisClient) shares the counts across replicas
	r := gin.New()
	r.GET("/login", ginmw.Limit(l, core.Rule{
		Name:   "login",
		Limits: []core.Limit{core.PerMinute(1)},
	}), func(c *gin.Context) { c.String(http.StatusOK, "welcome\n") })

	for i := 0; i < 2; i++ {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/login", nil))
		fmt.Printf("%d remaining=%s retry-after=%q %q\n", rec.Code, rec.Header().Get("X-RateLimit-Remaining"), rec.Header().Get("Retry-After"), rec.Body.String())
	}
	// Output:
	// 200 remaining=0 retry-after="" "welcome\n"
	// 429 remaining=0 retry-after="60" "Too Many Requests\n"
}
