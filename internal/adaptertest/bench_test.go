package adaptertest_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"

	"github.com/ratewindow/ratewindow/chimw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/echomw"
	"github.com/ratewindow/ratewindow/ginmw"
	"github.com/ratewindow/ratewindow/nethttp"
)

// discardWriter is a ResponseWriter that keeps only its header map, so the
// benchmarks measure the middleware, not a recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

func benchHandler(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("ok"))
}

// benchRule never denies: a sliding counter (O(1) per key) with a Count
// far above the number of iterations, so every request takes the full
// allowed path.
func benchRule() core.Rule {
	return core.Rule{
		Name:   "bench",
		Limits: []core.Limit{{Count: 1e9, Window: time.Hour, Algorithm: core.SlidingCounter}},
	}
}

// BenchmarkAdapters measures the cost per request of each adapter on the
// memory backend, against the same router without it ("bare"): the
// difference is the middleware's overhead. The key is the client IP (the
// default); the response carries the X-RateLimit fields.
func BenchmarkAdapters(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	type setup func(l *core.Limiter) http.Handler
	cases := []struct {
		name  string
		build setup
	}{
		{"nethttp/bare", func(*core.Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.HandleFunc("GET /users/{id}", benchHandler)
			return mux
		}},
		{"nethttp/limit", func(l *core.Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /users/{id}", nethttp.Limit(l, benchRule())(http.HandlerFunc(benchHandler)))
			return mux
		}},
		{"nethttp/limit-whole-mux", func(l *core.Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.HandleFunc("GET /users/{id}", benchHandler)
			return nethttp.Limit(l, benchRule(), nethttp.WithMux(mux))(mux)
		}},
		{"nethttp/denied", func(l *core.Limiter) http.Handler {
			mux := http.NewServeMux()
			rule := core.Rule{Name: "denied", Limits: []core.Limit{core.PerHour(1)}}
			mux.Handle("GET /users/{id}", nethttp.Limit(l, rule)(http.HandlerFunc(benchHandler)))
			return mux
		}},
		{"nethttp/limits-for", func(l *core.Limiter) http.Handler {
			// a plan per request: the same limits as benchRule, found by
			// their contents (a new slice each time)
			mux := http.NewServeMux()
			rule := benchRule()
			rule.LimitsFor = func(*http.Request) ([]core.Limit, error) {
				return []core.Limit{{Count: 1e9, Window: time.Hour, Algorithm: core.SlidingCounter}}, nil
			}
			mux.Handle("GET /users/{id}", nethttp.Limit(l, rule)(http.HandlerFunc(benchHandler)))
			return mux
		}},
		{"nethttp/count-if", func(l *core.Limiter) http.Handler {
			// a status to capture, a charge to settle; 200 is counted
			mux := http.NewServeMux()
			rule := benchRule()
			rule.CountIf = func(s int) bool { return s == http.StatusOK }
			mux.Handle("GET /users/{id}", nethttp.Limit(l, rule)(http.HandlerFunc(benchHandler)))
			return mux
		}},
		{"chi/bare", func(*core.Limiter) http.Handler {
			r := chi.NewRouter()
			r.Get("/users/{id}", benchHandler)
			return r
		}},
		{"chi/limit", func(l *core.Limiter) http.Handler {
			r := chi.NewRouter()
			r.With(chimw.Limit(l, benchRule())).Get("/users/{id}", benchHandler)
			return r
		}},
		{"chi/limit-use", func(l *core.Limiter) http.Handler {
			r := chi.NewRouter()
			r.Use(chimw.Limit(l, benchRule())) // before routing: finds the pattern
			r.Get("/users/{id}", benchHandler)
			return r
		}},
		{"gin/bare", func(*core.Limiter) http.Handler {
			e := gin.New()
			e.GET("/users/:id", gin.WrapF(benchHandler))
			return e
		}},
		{"gin/limit", func(l *core.Limiter) http.Handler {
			e := gin.New()
			e.GET("/users/:id", ginmw.Limit(l, benchRule()), gin.WrapF(benchHandler))
			return e
		}},
		{"echo/bare", func(*core.Limiter) http.Handler {
			e := echo.New()
			e.GET("/users/:id", echo.WrapHandler(http.HandlerFunc(benchHandler)))
			return e
		}},
		{"echo/limit", func(l *core.Limiter) http.Handler {
			e := echo.New()
			e.GET("/users/:id", echo.WrapHandler(http.HandlerFunc(benchHandler)), echomw.Limit(l, benchRule()))
			return e
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := c.build(core.NewMemory())
			req := httptest.NewRequest(http.MethodGet, "/users/42", nil)
			req.RemoteAddr = "203.0.113.5:4711"
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
}
