package connectmw_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/connectmw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/nethttp"
)

// discardWriter is a ResponseWriter that keeps only its header map (cleared
// before each request), so the benchmarks measure the middleware, not a
// recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

func benchHandler(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("ok"))
}

// benchRequests are the requests of the benchmarks, one per kind of caller:
// a plain GET, and a call in each of the three protocols (headers only:
// the middleware decides before any body).
func benchRequests() []struct {
	name string
	req  *http.Request
} {
	call := func(ctype, version string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, procedure, http.NoBody)
		r.Header.Set("Content-Type", ctype)
		if version != "" {
			r.Header.Set("Connect-Protocol-Version", version)
		}
		return r
	}
	return []struct {
		name string
		req  *http.Request
	}{
		{"plain", httptest.NewRequest(http.MethodGet, "/plain", nil)},
		{"connect", call("application/proto", "1")},
		{"grpc", call("application/grpc", "")},
		{"grpc-web", call("application/grpc-web+proto", "")},
	}
}

// benchMiddleware runs each request through nethttp's middleware and
// connectmw's built from rule on l.
func benchMiddleware(b *testing.B, l *core.Limiter, rule core.Rule) {
	next := http.HandlerFunc(benchHandler)
	hs := []struct {
		name string
		h    http.Handler
	}{
		{"nethttp", nethttp.Limit(l, rule)(next)},
		{"connectmw", connectmw.Limit(l, rule)(next)},
	}
	for _, h := range hs {
		for _, r := range benchRequests() {
			if h.name == "nethttp" && r.name != "plain" {
				continue // nethttp answers a call as it answers a GET
			}
			b.Run(fmt.Sprintf("%s/%s", h.name, r.name), func(b *testing.B) {
				w := &discardWriter{h: http.Header{}}
				h.h.ServeHTTP(w, r.req) // warm: the denied key's first denial, from Redis
				b.ReportAllocs()
				for b.Loop() {
					clear(w.h)
					h.h.ServeHTTP(w, r.req)
				}
			})
		}
	}
}

// BenchmarkAllowed measures an allowed request on the memory backend (no
// round trip): the middleware's own cost, X-RateLimit fields included.
func BenchmarkAllowed(b *testing.B) {
	rule := core.Rule{
		Name:   "bench",
		Limits: []core.Limit{{Count: 1e9, Window: time.Hour, Algorithm: core.SlidingCounter}},
	}
	benchMiddleware(b, core.NewMemory(), rule)
}

// BenchmarkDeniedHotKey measures the denial of one hot key on Redis,
// answered by the deny cache without a round trip: the cost of the answer
// (nethttp's 429, connectmw's Connect error with RetryInfo).
func BenchmarkDeniedHotKey(b *testing.B) {
	l := newRedisLimiter(b, fmt.Sprintf("cmwbench%d:", time.Now().UnixNano()), core.WithDenyCache(1000))
	benchMiddleware(b, l, core.Rule{Name: "denied", Limits: []core.Limit{core.PerHour(1)}})
}
