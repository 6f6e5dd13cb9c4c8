// Command grpc is a grpc-go server rate-limited by ratewindow: the
// standard health service, never limited, and ratewindow.example.Greeter,
// whose Hello method takes 5 calls a minute per API key (x-api-key
// metadata), or per peer address for calls without one; a refused call
// gets RESOURCE_EXHAUSTED with RetryInfo and the pushback trailer. Run it
// with
//
//	go run ./_examples/grpc
//
// and call it with the same program (no grpcurl needed):
//
//	go run ./_examples/grpc -call 127.0.0.1:8080
//
// which calls Hello until the limit refuses and prints what the client
// sees. It uses REDIS_URL when set, else an embedded Redis, and listens on
// ADDR (default 127.0.0.1:8080).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/_examples/internal/redisenv"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/grpcmw"
)

func main() {
	call := flag.String("call", "", "call Hello at this address until the limit refuses, and print what the client sees")
	flag.Parse()
	if *call != "" {
		if err := callUntilRefused(*call); err != nil {
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

	// Hello: 5 calls a minute per API key, else per peer address (behind
	// a proxy or a load balancer, grpcmw.Peer(its own address prefix)
	// reads x-forwarded-for from it alone). The health service passes.
	limits, err := grpcmw.New(l, grpcmw.Rule{
		Name:        "greeter",
		Limits:      []core.Limit{core.PerMinute(5)},
		Key:         grpcmw.Metadata("x-api-key"),
		FallbackKey: grpcmw.Peer(),
		Skip:        func(c grpcmw.Call) bool { return strings.HasPrefix(c.Method, "/grpc.health.v1.Health/") },
		Headers:     core.IETF,
		Pushback:    true,
		// a call without an API key is no error worth a log line here
		OnError: func(grpcmw.Call, error) {},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Authentication, logging and the like come before the limits, so
	// that the rule can key by what they found; recovery comes first.
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(limits.Unary()),
		grpc.ChainStreamInterceptor(limits.Stream()),
	)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	srv.RegisterService(&greeterDesc, greeter{})

	ln, err := net.Listen("tcp", redisenv.Addr())
	if err != nil {
		log.Fatal(err)
	}
	log.SetFlags(log.Ltime)
	log.SetOutput(os.Stdout)
	log.Printf("limits: ratewindow.example.Greeter/Hello 5/min per x-api-key, else per peer address; the health service unlimited")
	os.Stdout.WriteString("listening on grpc://" + ln.Addr().String() + "\n")
	go func() {
		<-ctx.Done()
		hs.Shutdown()
		srv.GracefulStop()
	}()
	if err := srv.Serve(ln); err != nil {
		log.Fatal(err)
	}
}

// The service, written by hand so that the example needs no protoc:
// Hello takes a google.protobuf.StringValue (a name) and answers one.
type greeterService interface{}

type greeter struct{}

const helloMethod = "/ratewindow.example.Greeter/Hello"

var greeterDesc = grpc.ServiceDesc{
	ServiceName: "ratewindow.example.Greeter",
	HandlerType: (*greeterService)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Hello", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		hello := func(_ context.Context, req any) (any, error) {
			return wrapperspb.String("hello, " + req.(*wrapperspb.StringValue).GetValue()), nil
		}
		if icpt == nil {
			return hello(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: helloMethod}, hello)
	}}},
}

// callUntilRefused checks the server's health, then calls Hello with an
// API key until RESOURCE_EXHAUSTED (at most 20 calls) and prints the
// refusal as a grpc-go client sees it.
func callUntilRefused(addr string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	fmt.Println("health:", h.GetStatus())
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", "example-key")
	for i := 1; i <= 20; i++ {
		var header, trailer metadata.MD
		out := new(wrapperspb.StringValue)
		err := cc.Invoke(ctx, helloMethod, wrapperspb.String("smoke"), out, grpc.Header(&header), grpc.Trailer(&trailer))
		if err == nil {
			fmt.Printf("call %d: %s (ratelimit: %s)\n", i, out.GetValue(), strings.Join(header.Get("ratelimit"), ""))
			continue
		}
		st := status.Convert(err)
		if st.Code() != codes.ResourceExhausted {
			return fmt.Errorf("call %d: %w", i, err)
		}
		fmt.Printf("call %d: code %d %s: %s\n", i, st.Code(), st.Code(), st.Message())
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				fmt.Println("  RetryInfo: retry_delay", d.GetRetryDelay().AsDuration())
			case *errdetails.QuotaFailure:
				for _, v := range d.GetViolations() {
					fmt.Printf("  QuotaFailure: subject %q quota_id %q quota_value %d\n", v.GetSubject(), v.GetQuotaId(), v.GetQuotaValue())
				}
			case *errdetails.ErrorInfo:
				fmt.Printf("  ErrorInfo: reason %s domain %s metadata %v\n", d.GetReason(), d.GetDomain(), d.GetMetadata())
			}
		}
		keys := make([]string, 0, len(trailer))
		for k := range trailer {
			if k != "content-type" && !strings.HasSuffix(k, "-bin") { // grpc's own
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Printf("  trailer %s: %s\n", k, strings.Join(trailer[k], ", "))
		}
		return nil
	}
	return errors.New("no RESOURCE_EXHAUSTED after 20 calls")
}
