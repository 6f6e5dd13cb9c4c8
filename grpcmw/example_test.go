package grpcmw_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/grpcmw"
)

// A server limits each API key (x-api-key metadata) to 2 calls a minute;
// the third call is refused with RESOURCE_EXHAUSTED and the time to wait.
func ExampleNew() {
	limiter := core.NewMemory() // core.New(redisClient) across replicas
	rl, err := grpcmw.New(limiter, grpcmw.Rule{
		Name:     "api",
		Limits:   []core.Limit{core.PerMinute(2)},
		Key:      grpcmw.Metadata("x-api-key"),
		Pushback: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(rl.Unary()), grpc.ChainStreamInterceptor(rl.Stream()))
	srv.RegisterService(&echoDesc, &echo{}) // your services
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
	for i := 1; i <= 3; i++ {
		var header, trailer metadata.MD
		out := new(wrapperspb.StringValue)
		err := cc.Invoke(ctx, "/test.Echo/Say", wrapperspb.String("hi"), out, grpc.Header(&header), grpc.Trailer(&trailer))
		if err == nil {
			fmt.Printf("call %d: %s, x-ratelimit-remaining %s\n", i, out.GetValue(), header.Get("x-ratelimit-remaining")[0])
			continue
		}
		st := status.Convert(err)
		fmt.Printf("call %d: %s, retry-after %s\n", i, st.Code(), trailer.Get("retry-after")[0])
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("RetryInfo:", ri.GetRetryDelay().AsDuration().Round(time.Second))
			}
		}
	}
	// Output:
	// call 1: hi, x-ratelimit-remaining 1
	// call 2: hi, x-ratelimit-remaining 0
	// call 3: ResourceExhausted, retry-after 60
	// RetryInfo: 1m0s
}

// A client throttles its calls to an upstream's quota shared by every
// replica: each call waits for its slot instead of failing, and an
// upstream's RESOURCE_EXHAUSTED blocks the quota for the delay it asks.
func ExampleNewClient() {
	limiter := core.NewMemory() // core.New(redisClient) across replicas
	throttle, err := grpcmw.NewClient(limiter, grpcmw.ClientRule{
		Name:   "pricing-api",
		Limits: []core.Limit{core.PerSecond(200)},
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := grpc.NewClient("127.0.0.1:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(throttle.Unary()),
		grpc.WithChainStreamInterceptor(throttle.Stream()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	fmt.Println(cc.Target())
	// Output: 127.0.0.1:50051
}
