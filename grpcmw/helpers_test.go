package grpcmw_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The test service, test.Echo, without generated code: Say (unary) echoes
// its string, or fails with the code it names ("code:16"); Chat (both
// ways streaming) echoes every message.
type echoService interface{}

type echo struct {
	mu       sync.Mutex
	arrivals []time.Time // of Say calls that reached the handler
}

const sayMethod, chatMethod = "/test.Echo/Say", "/test.Echo/Chat"

var echoDesc = grpc.ServiceDesc{
	ServiceName: "test.Echo",
	HandlerType: (*echoService)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Say", Handler: sayHandler}},
	Streams:     []grpc.StreamDesc{{StreamName: "Chat", Handler: chatHandler, ServerStreams: true, ClientStreams: true}},
}

func (e *echo) say(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	e.mu.Lock()
	e.arrivals = append(e.arrivals, time.Now())
	e.mu.Unlock()
	if c, ok := strings.CutPrefix(in.GetValue(), "code:"); ok {
		n, _ := strconv.Atoi(c)
		return nil, status.Error(codes.Code(n), "asked for")
	}
	return wrapperspb.String(in.GetValue()), nil
}

func sayHandler(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
	in := new(wrapperspb.StringValue)
	if err := dec(in); err != nil {
		return nil, err
	}
	h := func(ctx context.Context, req any) (any, error) {
		return srv.(*echo).say(ctx, req.(*wrapperspb.StringValue))
	}
	if icpt == nil {
		return h(ctx, in)
	}
	return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: sayMethod}, h)
}

func chatHandler(_ any, stream grpc.ServerStream) error {
	for {
		in := new(wrapperspb.StringValue)
		if err := stream.RecvMsg(in); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := stream.SendMsg(in); err != nil {
			return err
		}
	}
}

// serve starts a server of test.Echo on 127.0.0.1 with opts and returns a
// client connection to it (with copts) and the service.
func serve(t testing.TB, opts []grpc.ServerOption, copts ...grpc.DialOption) (*grpc.ClientConn, *echo) {
	t.Helper()
	addr, e := start(t, opts...)
	return dial(t, addr, copts...), e
}

// start starts a server of test.Echo on a free port of 127.0.0.1.
func start(t testing.TB, opts ...grpc.ServerOption) (string, *echo) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(opts...)
	e := &echo{}
	s.RegisterService(&echoDesc, e)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String(), e
}

// dial returns a client connection to addr.
func dial(t testing.TB, addr string, copts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, copts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// serveRule serves test.Echo behind the interceptors of rule.
func serveRule(t testing.TB, l *core.Limiter, rule grpcmwRule, copts ...grpc.DialOption) (*grpc.ClientConn, *echo) {
	t.Helper()
	i := mustNew(t, l, rule)
	return serve(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(i.Unary()), grpc.ChainStreamInterceptor(i.Stream())}, copts...)
}

func say(ctx context.Context, cc *grpc.ClientConn, msg string, opts ...grpc.CallOption) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, sayMethod, wrapperspb.String(msg), out, opts...)
	return out.GetValue(), err
}

// fixedClock is a Limiter clock that moves only when told.
type fixedClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fixedClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// redisLimiter returns a Limiter on a fresh prefix of the test's Redis.
func redisLimiter(t testing.TB, srv *redistest.Server, opts ...core.Option) *core.Limiter {
	t.Helper()
	opts = append([]core.Option{core.WithPrefix("grpcmw-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"),
		// a generous timeout: calls that expect Redis to decide must not
		// be shed on a loaded machine
		core.WithTimeout(5 * time.Second)}, opts...)
	l, err := core.New(srv.Client(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
