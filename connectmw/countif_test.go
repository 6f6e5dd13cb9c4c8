package connectmw_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/connectmw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

// The login procedures: a unary call and a server stream that sends one
// message before its code; "wrong" fails with Unauthenticated, "boom"
// panics.
const (
	loginProcedure  = "/test.v1.TestService/Login"
	streamProcedure = "/test.v1.TestService/Watch"
)

var errWrongPassword = errors.New("wrong password")

// loginService serves the login procedures and counts the calls that
// reached them.
func loginService(reached *atomic.Int64) *http.ServeMux {
	check := func(password string) error {
		reached.Add(1)
		switch password {
		case "wrong":
			return connect.NewError(connect.CodeUnauthenticated, errWrongPassword)
		case "boom":
			panic("the handler panicked")
		}
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle(loginProcedure, connect.NewUnaryHandler(loginProcedure,
		func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			if err := check(req.Msg.GetValue()); err != nil {
				return nil, err
			}
			return connect.NewResponse(wrapperspb.String("welcome")), nil
		}))
	mux.Handle(streamProcedure, connect.NewServerStreamHandler(streamProcedure,
		func(_ context.Context, req *connect.Request[wrapperspb.StringValue], s *connect.ServerStream[wrapperspb.StringValue]) error {
			if err := s.Send(wrapperspb.String("checking")); err != nil {
				return err
			}
			return check(req.Msg.GetValue())
		}))
	return mux
}

// TestCountIfEachProtocol: the README's failed-login rule (CountIf status
// == 401, 3 a minute) admits exactly 3 wrong passwords of one client,
// unary or streamed, whatever protocol its connect-go client speaks: the
// rule sees the HTTP status Unauthenticated maps to under the Connect
// protocol, read from the grpc-status trailer (gRPC, gRPC-Web) or the
// Connect error. Calls that succeed are not counted. Before, gRPC and
// gRPC-Web calls answered HTTP 200 and reached the handler 20 times of 20.
func TestCountIfEachProtocol(t *testing.T) {
	for _, p := range protocols {
		for _, stream := range []bool{false, true} {
			name := p.name + "/unary"
			if stream {
				name = p.name + "/stream"
			}
			t.Run(name, func(t *testing.T) {
				l, _ := redisLimiter(t, uniquePrefix(t))
				var reached atomic.Int64
				rule := core.Rule{Name: "login", Limits: []core.Limit{core.PerMinute(3)},
					CountIf: func(status int) bool { return status == http.StatusUnauthorized }}
				srv := serve(t, connectmw.Limit(l, rule)(loginService(&reached)))
				call := func(password string) error {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					req := connect.NewRequest(wrapperspb.String(password))
					if !stream {
						c := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+loginProcedure, p.opts...)
						_, err := c.CallUnary(ctx, req)
						return err
					}
					c := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+streamProcedure, p.opts...)
					s, err := c.CallServerStream(ctx, req)
					if err != nil {
						return err
					}
					defer s.Close()
					for s.Receive() {
					}
					return s.Err()
				}
				for i := range 5 { // successes are not counted
					if err := call("right"); err != nil {
						t.Fatalf("right password %d: %v", i+1, err)
					}
				}
				codes := map[connect.Code]int{}
				for range 20 {
					codes[connect.CodeOf(call("wrong"))]++
				}
				if got := reached.Load() - 5; got != 3 || codes[connect.CodeUnauthenticated] != 3 || codes[connect.CodeResourceExhausted] != 17 {
					t.Fatalf("20 wrong passwords reached the handler %d times (codes %v), want 3 (3 unauthenticated, 17 resource_exhausted)", got, codes)
				}
			})
		}
	}
}

// TestCountIfPanicEachProtocol: a handler that panics counts as 500,
// whatever the protocol: a rule counting 500s admits its limit of them.
func TestCountIfPanicEachProtocol(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			l, _ := redisLimiter(t, uniquePrefix(t))
			var reached atomic.Int64
			rule := core.Rule{Name: "panics", Limits: []core.Limit{core.PerMinute(2)},
				CountIf: func(status int) bool { return status == http.StatusInternalServerError }}
			srv := serve(t, connectmw.Limit(l, rule)(loginService(&reached)))
			srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics' stacks
			c := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+loginProcedure, p.opts...)
			for range 5 {
				_, _ = c.CallUnary(context.Background(), connect.NewRequest(wrapperspb.String("boom")))
			}
			if got := reached.Load(); got != 2 {
				t.Fatalf("5 panicking calls reached the handler %d times, want 2", got)
			}
		})
	}
}

// TestStackedEachProtocol: an outer rule (3 a minute per client) in front
// of an inner one (1 a minute per tenant) counts the calls the inner rule
// denies, whatever the protocol: the fourth call is the outer rule's
// denial, and the tenant of another client is still denied by the inner.
func TestStackedEachProtocol(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			l, d := redisLimiter(t, uniquePrefix(t))
			s := newService()
			outer := connectmw.Limit(l, core.Rule{Name: "client", Limits: []core.Limit{core.PerMinute(3)}, Key: keyfuncs.Header("X-Client")})
			inner := connectmw.Limit(l, core.Rule{Name: "tenant", Limits: []core.Limit{core.PerMinute(1)}, Key: keyfuncs.Header("X-Tenant")})
			srv := serve(t, outer(inner(s.mux)))
			c := newClient(srv, p.opts...)
			var denied []string // the rule of each denial
			for i := range 5 {
				req := connect.NewRequest(wrapperspb.String("x"))
				req.Header().Set("X-Tenant", "acme")
				req.Header().Set("X-Client", "c1")
				_, err := c.CallUnary(context.Background(), req)
				if i > 0 && connect.CodeOf(err) != connect.CodeResourceExhausted {
					t.Fatalf("call %d: %v, want resource_exhausted", i+1, err)
				}
			}
			d.mu.Lock()
			for _, ev := range d.evs {
				if !ev.Result.Allowed {
					denied = append(denied, ev.Rule)
				}
			}
			d.mu.Unlock()
			if want := []string{"tenant", "tenant", "client", "client"}; !slices.Equal(denied, want) || s.calls.Load() != 1 {
				t.Fatalf("denials by %v, %d calls served; want %v and 1", denied, s.calls.Load(), want)
			}
		})
	}
}
