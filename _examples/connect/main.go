// Command connect is a connect-go server rate-limited by ratewindow's
// connectmw. One port serves the Connect, gRPC and gRPC-Web protocols,
// over HTTP/1.1 and over plain-text HTTP/2 (h2c): gRPC needs HTTP/2, and
// without TLS a server speaks HTTP/2 only when it is told to
// (http.Server.Protocols). Greeter's Hello method takes 5 calls a minute
// per API key (the X-Api-Key header), or per client IP for calls without
// one; a refused call gets resource_exhausted with a RetryInfo detail, in
// the protocol the client spoke. GET /healthz is never limited. Run it with
//
//	go run ./_examples/connect
//
// and call it with the same program, which calls Hello with a connect-go
// client in each protocol until the limit refuses and prints what each
// client sees:
//
//	go run ./_examples/connect -call 127.0.0.1:8080
//
// It uses REDIS_URL when set, else an embedded Redis, and listens on ADDR
// (default 127.0.0.1:8080).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/_examples/internal/redisenv"
	"github.com/ratewindow/ratewindow/connectmw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

// helloProcedure is Hello's path. The service is written by hand, with
// google.protobuf.StringValue for its request and response, so that the
// example needs no code generation; a generated New...Handler is used the
// same way.
const helloProcedure = "/ratewindow.example.Greeter/Hello"

func main() {
	call := flag.String("call", "", "call Hello at this address in each protocol until the limit refuses, and print what the clients see")
	flag.Parse()
	if *call != "" {
		if err := callEachProtocol(*call); err != nil {
			log.Fatal(err)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Redis: REDIS_URL, or an embedded one for a first try.
	rdb, embedded, closeRedis, err := redisenv.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer closeRedis()
	// One Limiter per process; stop here unless Redis can do the job (see
	// the nethttp example).
	l, err := core.New(rdb, core.WithPrefix("rw:example:"))
	if err != nil {
		log.Fatal(err)
	}
	checkCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Check(checkCtx); err != nil && !(embedded && errors.Is(err, core.ErrCheckIncomplete)) {
		log.Fatalf("redis: %v", err)
	}

	mux := http.NewServeMux()
	mux.Handle(helloProcedure, withHTTPVersion(connect.NewUnaryHandler(helloProcedure, hello)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })

	// connectmw wraps the mux, as any net/http middleware does: it tells a
	// Connect, gRPC or gRPC-Web call from a plain request and answers a
	// refused call in its own protocol, before the body is read.
	limit, err := connectmw.New(l, core.Rule{
		Name:        "greeter",
		Limits:      []core.Limit{core.PerMinute(5)},
		Key:         keyfuncs.Header("X-Api-Key"),
		FallbackKey: keyfuncs.IP(), // behind a proxy, keyfuncs.IP(its own address prefix)
		Skip:        func(r *http.Request) bool { return r.URL.Path == "/healthz" },
		Headers:     core.IETF,
		// a call without an API key is no error worth a log line here
		OnError: func(http.ResponseWriter, *http.Request, error) {},
	})
	if err != nil {
		log.Fatal(err)
	}

	// HTTP/1.1 for Connect and gRPC-Web callers, and HTTP/2 without TLS
	// (h2c) for gRPC. With TLS, HTTP/2 is negotiated and this is not needed.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           limit(mux),
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
	}

	ln, err := net.Listen("tcp", redisenv.Addr())
	if err != nil {
		log.Fatal(err)
	}
	log.SetFlags(log.Ltime)
	log.SetOutput(os.Stdout)
	log.Printf("limits: %s 5/min per X-Api-Key, else per client IP; /healthz unlimited", helloProcedure)
	os.Stdout.WriteString("listening on http://" + ln.Addr().String() + " (HTTP/1.1 and h2c)\n")
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdownCtx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// hello answers a name, saying in which protocol and over which HTTP
// version the call came.
func hello(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
	version, _ := ctx.Value(httpVersionKey{}).(string)
	msg := fmt.Sprintf("hello, %s (%s over %s)", req.Msg.GetValue(), req.Peer().Protocol, version)
	return connect.NewResponse(wrapperspb.String(msg)), nil
}

// httpVersionKey is the context key of a call's HTTP version (r.Proto),
// which a connect.Request does not carry.
type httpVersionKey struct{}

// withHTTPVersion passes r.Proto on to the handler in the context.
func withHTTPVersion(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpVersionKey{}, r.Proto)))
	})
}

// callEachProtocol calls Hello at addr with a connect-go client in each
// protocol, each with an API key of its own, until the limit refuses (at
// most 20 calls each), and prints what the client sees. The gRPC client
// speaks h2c, the only way the gRPC protocol works without TLS; the
// Connect and gRPC-Web clients speak HTTP/1.1, as most proxies and
// browsers do.
func callEachProtocol(addr string) error {
	var h2cOnly http.Protocols
	h2cOnly.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &h2cOnly}}
	http1 := &http.Client{Transport: &http.Transport{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range []struct {
		name   string
		client *http.Client
		opts   []connect.ClientOption
	}{
		{"connect", http1, nil},
		{"grpc", h2c, []connect.ClientOption{connect.WithGRPC()}},
		{"grpcweb", http1, []connect.ClientOption{connect.WithGRPCWeb()}},
	} {
		client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](p.client, "http://"+addr+helloProcedure, p.opts...)
		if err := callUntilRefused(ctx, p.name, client); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	return nil
}

// callUntilRefused calls Hello with the API key "key-"+name until the
// limit refuses, and prints each answer and the refusal.
func callUntilRefused(ctx context.Context, name string, client *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]) error {
	for i := 1; i <= 20; i++ {
		req := connect.NewRequest(wrapperspb.String("smoke"))
		req.Header().Set("X-Api-Key", "key-"+name)
		resp, err := client.CallUnary(ctx, req)
		if err == nil {
			fmt.Printf("%s call %d: %s (RateLimit: %s)\n", name, i, resp.Msg.GetValue(), resp.Header().Get("RateLimit"))
			continue
		}
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			return fmt.Errorf("call %d: %w", i, err)
		}
		var cerr *connect.Error
		if !errors.As(err, &cerr) {
			return fmt.Errorf("call %d: %w", i, err)
		}
		fmt.Printf("%s call %d: %s: %s\n", name, i, cerr.Code(), cerr.Message())
		for _, d := range cerr.Details() {
			if v, err := d.Value(); err == nil {
				if ri, ok := v.(*errdetails.RetryInfo); ok {
					fmt.Printf("  %s RetryInfo: retry_delay %s\n", name, ri.GetRetryDelay().AsDuration())
				}
			}
		}
		fmt.Printf("  %s Retry-After: %s\n", name, cerr.Meta().Get("Retry-After"))
		return nil
	}
	return errors.New("no resource_exhausted after 20 calls")
}
