package adaptertest_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
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

// byIPRoutes builds, per adapter, GET /a and GET /b, each behind a
// LimitByIP(l, 2, time.Minute) of its own (perRoute), or both behind one
// around the whole router (whole).
var byIPRoutes = map[string]struct {
	perRoute, whole func(l *core.Limiter) http.Handler
}{
	"nethttp": {
		func(l *core.Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /a", nethttp.LimitByIP(l, 2, time.Minute)(http.HandlerFunc(okHandler)))
			mux.Handle("GET /b", nethttp.LimitByIP(l, 2, time.Minute)(http.HandlerFunc(okHandler)))
			return mux
		},
		func(l *core.Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.HandleFunc("GET /a", okHandler)
			mux.HandleFunc("GET /b", okHandler)
			return nethttp.LimitByIP(l, 2, time.Minute)(mux)
		},
	},
	"chi": {
		func(l *core.Limiter) http.Handler {
			r := chi.NewRouter()
			r.With(chimw.LimitByIP(l, 2, time.Minute)).Get("/a", okHandler)
			r.With(chimw.LimitByIP(l, 2, time.Minute)).Get("/b", okHandler)
			return r
		},
		func(l *core.Limiter) http.Handler {
			r := chi.NewRouter()
			r.Use(chimw.LimitByIP(l, 2, time.Minute))
			r.Get("/a", okHandler)
			r.Get("/b", okHandler)
			return r
		},
	},
	"gin": {
		func(l *core.Limiter) http.Handler {
			e := gin.New()
			e.GET("/a", ginmw.LimitByIP(l, 2, time.Minute), gin.WrapF(okHandler))
			e.GET("/b", ginmw.LimitByIP(l, 2, time.Minute), gin.WrapF(okHandler))
			return e
		},
		func(l *core.Limiter) http.Handler {
			e := gin.New()
			e.Use(ginmw.LimitByIP(l, 2, time.Minute))
			e.GET("/a", gin.WrapF(okHandler))
			e.GET("/b", gin.WrapF(okHandler))
			return e
		},
	},
	"echo": {
		func(l *core.Limiter) http.Handler {
			e := echo.New()
			e.GET("/a", echo.WrapHandler(http.HandlerFunc(okHandler)), echomw.LimitByIP(l, 2, time.Minute))
			e.GET("/b", echo.WrapHandler(http.HandlerFunc(okHandler)), echomw.LimitByIP(l, 2, time.Minute))
			return e
		},
		func(l *core.Limiter) http.Handler {
			e := echo.New()
			e.Use(echomw.LimitByIP(l, 2, time.Minute))
			e.GET("/a", echo.WrapHandler(http.HandlerFunc(okHandler)))
			e.GET("/b", echo.WrapHandler(http.HandlerFunc(okHandler)))
			return e
		},
	},
}

// TestLimitByIPCountsPerCallSite: in every adapter, two LimitByIP of the
// same limit on two routes count apart (a client that used up /a still
// reaches /b; named after the limit alone, they shared one counter), and
// one LimitByIP around the whole router counts every route together.
func TestLimitByIPCountsPerCallSite(t *testing.T) {
	for _, ad := range adapters {
		build, ok := byIPRoutes[ad.name]
		if !ok {
			t.Fatalf("no byIPRoutes for adapter %s", ad.name)
		}
		for _, tc := range []struct {
			name  string
			h     func(l *core.Limiter) http.Handler
			codes []int
		}{
			{"two routes", build.perRoute, []int{200, 200, 429, 200, 200, 429}},
			{"whole router", build.whole, []int{200, 200, 429, 429, 429, 429}},
		} {
			t.Run(ad.name+"/"+tc.name, func(t *testing.T) {
				h := tc.h(core.NewMemory())
				var codes []int
				for _, path := range []string{"/a", "/a", "/a", "/b", "/b", "/b"} {
					rec, req := httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil)
					req.RemoteAddr = "203.0.113.9:4000"
					h.ServeHTTP(rec, req)
					codes = append(codes, rec.Code)
				}
				if !slices.Equal(codes, tc.codes) {
					t.Fatalf("codes of /a, /a, /a, /b, /b, /b: %v, want %v", codes, tc.codes)
				}
			})
		}
	}
}
