package grpcmw_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/grpcmw"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/nethttp"
)

// BenchmarkInterceptor measures one decision through the unary server
// interceptor beside the same decision through nethttp's middleware, on
// real Redis: an allowed key (a round trip) and a denied hot key (answered
// by the deny cache). The interceptor is called directly, without a
// network: the figures are the adapter's cost and the decision's.
func BenchmarkInterceptor(b *testing.B) {
	srv := redistest.New(b)
	allowed := []core.Limit{{Count: 1e12, Window: time.Hour, Algorithm: core.SlidingCounter}}
	denied := []core.Limit{core.PerHour(1)}
	for _, tc := range []struct {
		name   string
		limits []core.Limit
	}{{"allowed", allowed}, {"denied", denied}} {
		b.Run("grpcmw/"+tc.name, func(b *testing.B) {
			i := mustNew(b, redisLimiter(b, srv), grpcmw.Rule{Name: "bench", Limits: tc.limits})
			unary := i.Unary()
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:4711"))})
			ctx = grpc.NewContextWithServerTransportStream(ctx, transportStream{})
			info := &grpc.UnaryServerInfo{FullMethod: sayMethod}
			handler := func(context.Context, any) (any, error) { return nil, nil }
			_, _ = unary(ctx, nil, info, handler) // the one allowed call of "denied"
			b.ReportAllocs()
			for b.Loop() {
				_, _ = unary(ctx, nil, info, handler)
			}
		})
		b.Run("nethttp/"+tc.name, func(b *testing.B) {
			h := nethttp.Limit(redisLimiter(b, srv), core.Rule{Name: "bench", Limits: tc.limits})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = "192.0.2.1:4711"
			w := &discardWriter{h: http.Header{}}
			h.ServeHTTP(w, req)
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
}

type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

// transportStream stands for the server's stream of a call, which
// grpc.SetHeader and grpc.SetTrailer reach through the context.
type transportStream struct{}

func (transportStream) Method() string               { return sayMethod }
func (transportStream) SetHeader(metadata.MD) error  { return nil }
func (transportStream) SendHeader(metadata.MD) error { return nil }
func (transportStream) SetTrailer(metadata.MD) error { return nil }
