// Command grpcupstream is the gRPC half of the promises command's upstream
// scenario (internal/cmd/promises, see its upstream.go): a strict gRPC
// upstream, and a client process whose calls go through grpcmw's client
// interceptors. The promises command runs it; build it and pass it with
// -grpc, from the repository root:
//
//	go build -o /tmp/grpcupstream ./grpcmw/internal/cmd/grpcupstream
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 -rounds 5 -busy 8 -grpc /tmp/grpcupstream upstream
//
// "grpcupstream serve" serves the gRPC health service's Check on a free
// port of 127.0.0.1, at most 5 calls in any 1s window by its arrival
// times; a call that would be the 6th within 1s is refused with
// RESOURCE_EXHAUSTED and RetryInfo. It prints its address, and on SIGTERM
// what it saw as JSON.
//
// "grpcupstream -redis addr -margin d client target rule start goroutines
// duration" sends Check calls to target through grpcmw.NewClient's unary
// interceptor with a core.Limiter with the library's defaults and a
// ClientRule with only Name and Limits (PerSecond(5)) set, besides Margin
// when -margin is not 0, and prints its strictup.Stats as JSON.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/grpcmw"
	"github.com/ratewindow/ratewindow/internal/strictup"
)

// limit is what the strict upstream admits in any 1s window, and the
// clients' rule.
const limit = 5

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "the Redis server (loopback only)")
	margin := flag.Duration("margin", 0, "the client rule's Margin (0: its default)")
	flag.Parse()
	var err error
	switch flag.Arg(0) {
	case "serve":
		err = serve()
	case "client":
		if host, _, herr := net.SplitHostPort(*addr); herr != nil || !net.ParseIP(host).IsLoopback() {
			err = errors.New("-redis must be a loopback address")
			break
		}
		err = client(*addr, *margin, flag.Arg(1), flag.Arg(2), flag.Arg(3), flag.Arg(4), flag.Arg(5))
	default:
		err = errors.New("usage: grpcupstream serve | grpcupstream [-redis addr] [-margin d] client target rule start goroutines duration")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcupstream:", err)
		os.Exit(1)
	}
}

// strictHealth answers Check as a strict upstream.
type strictHealth struct {
	healthpb.UnimplementedHealthServer
	log *strictup.Log
}

func (h strictHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if ok, retry := h.log.Arrive(time.Now()); !ok {
		st, err := status.New(codes.ResourceExhausted, "too many calls").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func serve() error {
	log := strictup.New(limit)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, strictHealth{log: log})
	return strictup.Serve(log, srv.Serve, srv.Stop, func(err error) bool { return errors.Is(err, grpc.ErrServerStopped) })
}

func client(addr string, margin time.Duration, target, rule, start, goroutines, d string) error {
	l, err := core.New(redis.NewClient(&redis.Options{Addr: addr}))
	if err != nil {
		return err
	}
	ci, err := grpcmw.NewClient(l, grpcmw.ClientRule{Name: rule, Limits: []core.Limit{core.PerSecond(limit)}, Margin: margin})
	if err != nil {
		return err
	}
	// the second interceptor runs when the throttler lets a call go
	var starts strictup.Starts
	started := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		starts.Go()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(ci.Unary(), started))
	if err != nil {
		return err
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	return strictup.Clients(start, goroutines, d, &starts, func() (bool, error) {
		_, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if status.Code(err) == codes.ResourceExhausted {
			return true, nil
		}
		return false, err
	})
}
