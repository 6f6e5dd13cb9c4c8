package ginmw_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

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

func TestInvalidRule(t *testing.T) {
	if _, err := ginmw.New(nil, core.Rule{Name: "x", Limits: []core.Limit{core.PerMinute(1)}}); !errors.Is(err, core.ErrInvalidRule) {
		t.Errorf("New(nil, ...) = %v, want ErrInvalidRule", err)
	}
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, core.ErrInvalidLimit) || !strings.Contains(err.Error(), "ginmw.Limit") {
			t.Errorf("Limit panicked with %v, want an ErrInvalidLimit naming ginmw.Limit", err)
		}
	}()
	ginmw.Limit(core.NewMemory(), core.Rule{Name: "x", Limits: []core.Limit{{Count: 1}}})
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

func TestLimitByIP(t *testing.T) {
	gin.SetMode(gin.TestMode)
	l := core.NewMemory()
	e := gin.New()
	e.Use(ginmw.LimitByIP(l, 2, time.Minute), ginmw.LimitByIP(l, 5, time.Hour))
	e.GET("/", func(c *gin.Context) {})
	var codes []int
	for _, ip := range []string{"203.0.113.9", "203.0.113.9", "203.0.113.9", "198.51.100.1"} {
		rec, req := httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = ip + ":4000"
		e.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	if !slices.Equal(codes, []int{200, 200, 429, 200}) {
		t.Fatalf("codes %v, want [200 200 429 200]", codes)
	}
}
