package echomw_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/echomw"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

func TestSkipperAndRoute(t *testing.T) {
	var routes []string
	e := echo.New()
	e.Use(echomw.LimitWithConfig(echomw.Config{
		Skipper: func(c echo.Context) bool { return c.Request().Header.Get("X-Internal") == "1" },
		Limiter: core.NewMemory(),
		Rule: core.Rule{
			Name:   "echo",
			Limits: []core.Limit{core.PerMinute(1)},
			Key: func(r *http.Request) (string, error) {
				p, _ := keyfuncs.RouteFrom(r.Context())
				routes = append(routes, p)
				return keyfuncs.Route()(r)
			},
		},
	}))
	handled := 0
	e.GET("/users/:id", func(c echo.Context) error { handled++; return c.String(200, "ok") })

	codes := []int{}
	for _, internal := range []string{"", "1", "", "1"} {
		req := httptest.NewRequest(http.MethodGet, "/users/1", nil)
		req.Header.Set("X-Internal", internal)
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	if fmt.Sprint(codes) != "[200 200 429 200]" || handled != 3 || strings.Join(routes, ",") != "/users/:id,/users/:id" {
		t.Errorf("codes %v, handled %d, routes %q; want [200 200 429 200], 3, /users/:id twice", codes, handled, routes)
	}
}

func TestInvalidConfig(t *testing.T) {
	if _, err := (echomw.Config{Rule: core.Rule{Name: "x", Limits: []core.Limit{core.PerMinute(1)}}}).ToMiddleware(); err == nil || !strings.HasPrefix(err.Error(), "ratewindow: ") {
		t.Errorf("ToMiddleware without a Limiter = %v, want an error", err)
	}
	defer func() {
		err, _ := recover().(error)
		if err == nil || !strings.Contains(err.Error(), "(echomw.LimitWithConfig)") {
			t.Errorf("LimitWithConfig panicked with %v, want an error naming echomw.LimitWithConfig", err)
		}
	}()
	echomw.LimitWithConfig(echomw.Config{})
}

func ExampleLimitWithConfig() {
	l := core.NewMemory() // core.New(redisClient) shares the counts across replicas
	e := echo.New()
	e.GET("/search", func(c echo.Context) error {
		return c.String(http.StatusOK, "results\n")
	}, echomw.LimitWithConfig(echomw.Config{
		// Requests from the office are not limited.
		Skipper: func(c echo.Context) bool { return c.RealIP() == "198.51.100.10" },
		Limiter: l,
		Rule: core.Rule{
			Name:    "search",
			Limits:  []core.Limit{core.PerMinute(1)},
			Headers: core.IETF,
		},
	}))

	for _, ip := range []string{"203.0.113.5", "203.0.113.5", "198.51.100.10"} {
		req := httptest.NewRequest(http.MethodGet, "/search", nil)
		req.RemoteAddr = ip + ":4711"
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		fmt.Printf("%s %d %q %q\n", ip, rec.Code, rec.Header().Get("RateLimit"), rec.Body.String())
	}
	// Output:
	// 203.0.113.5 200 "\"1-per-1m\";r=0;t=60" "results\n"
	// 203.0.113.5 429 "\"1-per-1m\";r=0;t=60" "Too Many Requests\n"
	// 198.51.100.10 200 "" "results\n"
}

// TestCountIfFinalStatus: CountIf settles by the status the client got.
// After an informational 103, echo drops the handler's own status (its
// Response is committed) and net/http sends 200 with the body: the request
// counts as the 200 it was, not as the 103.
func TestCountIfFinalStatus(t *testing.T) {
	e := echo.New()
	e.Use(echomw.Limit(core.NewMemory(), core.Rule{
		Name:    "ok-only",
		Limits:  []core.Limit{core.PerMinute(1)},
		CountIf: func(status int) bool { return status == http.StatusOK },
	}))
	e.GET("/", func(c echo.Context) error {
		c.Response().Header().Set("Link", "</style.css>; rel=preload")
		c.Response().WriteHeader(http.StatusEarlyHints)
		return c.String(http.StatusUnauthorized, "no")
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	var codes []int
	for range 2 {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 429]" {
		t.Errorf("statuses %v, want [200 429]: the first request was sent as 200 and counted", codes)
	}
}
