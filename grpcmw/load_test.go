package grpcmw_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/grpcmw"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// sharedLimiters returns n Limiters (n replicas) on one Redis and one
// prefix.
func sharedLimiters(t *testing.T, srv *redistest.Server, n int, opts ...core.Option) []*core.Limiter {
	t.Helper()
	prefix := "grpcmw-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	out := make([]*core.Limiter, n)
	for i := range out {
		l, err := core.New(srv.Client(t), append([]core.Option{core.WithPrefix(prefix), core.WithTimeout(5 * time.Second)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = l
	}
	return out
}

// worstWindow returns the largest number of admitted calls certainly in
// one window of length w: the calls whose whole [start, end] lies inside
// some (t-w, t]. The admitting instant lies inside each call, so this is a
// lower bound on the true worst window: a figure above the limit proves
// over-admission, and latency can never inflate it.
func worstWindow(starts, ends []time.Time, w time.Duration) int {
	idx := make([]int, len(ends))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return ends[a].Compare(ends[b]) })
	worst := 0
	for j, e := range idx {
		t := ends[e]
		n := 0
		for _, i := range idx[:j+1] {
			if ends[i].After(t.Add(-w)) && starts[i].After(t.Add(-w)) {
				n++
			}
		}
		worst = max(worst, n)
	}
	return worst
}

// TestExactness: 3 server instances, each with its own Limiter, on one
// Redis, under concurrent load on one key: no strict 1 s window admits
// more than the limit.
func TestExactness(t *testing.T) {
	const limit, run = 20, 3 * time.Second
	srv := redistest.New(t)
	var conns []*grpc.ClientConn
	for _, l := range sharedLimiters(t, srv, 3) {
		cc, _ := serveRule(t, l, grpcmw.Rule{Name: "exact", Limits: []core.Limit{core.PerSecond(limit)}, Key: grpcmw.Method()})
		conns = append(conns, cc)
	}
	var (
		mu           sync.Mutex
		starts, ends []time.Time
		denied       atomic.Int64
		failed       atomic.Int64
		wg           sync.WaitGroup
	)
	stop := time.Now().Add(run)
	for g := range 9 {
		wg.Add(1)
		go func(cc *grpc.ClientConn) {
			defer wg.Done()
			for time.Now().Before(stop) {
				start := time.Now()
				_, err := say(context.Background(), cc, "x")
				end := time.Now()
				switch status.Code(err) {
				case codes.OK:
					mu.Lock()
					starts, ends = append(starts, start), append(ends, end)
					mu.Unlock()
				case codes.ResourceExhausted:
					denied.Add(1)
				default:
					failed.Add(1)
				}
			}
		}(conns[g%3])
	}
	wg.Wait()
	worst := worstWindow(starts, ends, time.Second)
	t.Logf("3 servers, 9 clients, %s: %d admitted, %d denied; worst strict 1 s window %d (limit %d)", run, len(ends), denied.Load(), worst, limit)
	if worst > limit {
		t.Errorf("worst strict 1 s window admitted %d, limit %d", worst, limit)
	}
	if failed.Load() > 0 || denied.Load() == 0 || len(ends) < limit {
		t.Errorf("%d calls failed, %d denied, %d admitted: want no failure, some denials, at least %d admitted", failed.Load(), denied.Load(), len(ends), limit)
	}
}

// TestClientThrottle: two client replicas share one quota through the
// client interceptor against an upstream as strict as the quota: every
// call is delivered, none dropped; the time is reported against the ideal.
func TestClientThrottle(t *testing.T) {
	const rate, calls = 10, 40
	srv := redistest.New(t)
	var upstreamDenied atomic.Int64
	upstream := sharedLimiters(t, srv, 1, core.WithObserver(func(ev core.Event) {
		if !ev.Result.Allowed && ev.Err == nil {
			upstreamDenied.Add(1)
		}
	}))[0]
	strict := grpcmw.Rule{Name: "upstream", Limits: []core.Limit{core.PerSecond(rate)}, Key: grpcmw.Method(), Pushback: true}
	i := mustNew(t, upstream, strict)
	addr, _ := start(t, grpc.ChainUnaryInterceptor(i.Unary()))
	var conns []*grpc.ClientConn
	for _, l := range sharedLimiters(t, srv, 2) {
		ci, err := grpcmw.NewClient(l, grpcmw.ClientRule{Name: "out", Limits: []core.Limit{core.PerSecond(rate)}})
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, dial(t, addr, grpc.WithChainUnaryInterceptor(ci.Unary())))
	}
	began := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range calls {
		wg.Add(1)
		go func(cc *grpc.ClientConn) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := say(ctx, cc, "x"); err != nil {
				failed.Add(1)
				t.Errorf("call failed: %v", err)
			}
		}(conns[g%2])
	}
	wg.Wait()
	elapsed := time.Since(began)
	ideal := time.Duration(calls-rate) * time.Second / rate
	t.Logf("%d calls from 2 replicas at %d/s: delivered %d, %d refused by the upstream (then retried), %s against the ideal %s (%.1f%% over)",
		calls, rate, calls-int(failed.Load()), upstreamDenied.Load(), elapsed.Round(time.Millisecond), ideal, 100*(elapsed.Seconds()/ideal.Seconds()-1))
}

// TestRetryPolicyHonoursPushback: a grpc-go client whose retry policy
// retries RESOURCE_EXHAUSTED after a 10 ms backoff retries a denial after
// the server's pushback instead, and the retry passes.
func TestRetryPolicyHonoursPushback(t *testing.T) {
	l := redisLimiter(t, redistest.New(t))
	i := mustNew(t, l, grpcmw.Rule{Name: "pushback", Limits: []core.Limit{core.PerSecond(1)}, Key: grpcmw.Method(), Pushback: true})
	var (
		mu       sync.Mutex
		attempts []time.Time
	)
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		return h(ctx, req)
	}
	const config = `{"methodConfig": [{"name": [{"service": "test.Echo"}], "retryPolicy": {
		"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
		"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}`
	cc, _ := serve(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(record, i.Unary())}, grpc.WithDefaultServiceConfig(config))
	if _, err := say(context.Background(), cc, "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := say(context.Background(), cc, "second"); err != nil {
		t.Fatalf("the retried call: %v, want it to pass after the pushback", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 3 {
		t.Fatalf("%d attempts reached the server, want 3 (one, then a denial and its retry)", len(attempts))
	}
	gap := attempts[2].Sub(attempts[1])
	floor := time.Second - attempts[1].Sub(attempts[0]) // the pushback, about
	t.Logf("the retry came %s after the denial (pushback about %s; the policy's backoff 10ms)", gap.Round(time.Millisecond), floor.Round(time.Millisecond))
	if gap < floor-100*time.Millisecond {
		t.Errorf("the retry came %s after the denial, sooner than the pushback (about %s)", gap, floor)
	}
}

// TestClientObeysRefusals: a client quota looser than the upstream's: the
// upstream refuses with RetryInfo, the key is blocked on both replicas and
// the refused calls go again after the delay: every call is delivered.
func TestClientObeysRefusals(t *testing.T) {
	const rate, calls = 5, 15
	srv := redistest.New(t)
	var refused atomic.Int64
	upstream := sharedLimiters(t, srv, 1)[0]
	i := mustNew(t, upstream, grpcmw.Rule{Name: "upstream", Limits: []core.Limit{core.PerSecond(rate)}, Key: grpcmw.Method()})
	addr, _ := start(t, grpc.ChainUnaryInterceptor(i.Unary()))
	var conns []*grpc.ClientConn
	for _, l := range sharedLimiters(t, srv, 2, core.WithObserver(func(ev core.Event) {
		if ev.Op == core.OpRefused {
			refused.Add(1)
		}
	})) {
		ci, err := grpcmw.NewClient(l, grpcmw.ClientRule{Name: "loose", Limits: []core.Limit{core.PerSecond(100)}, MaxRetries: 20})
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, dial(t, addr, grpc.WithChainUnaryInterceptor(ci.Unary())))
	}
	began := time.Now()
	var wg sync.WaitGroup
	for g := range calls {
		wg.Add(1)
		go func(cc *grpc.ClientConn) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := say(ctx, cc, "x"); err != nil {
				t.Errorf("call failed: %v", err)
			}
		}(conns[g%2])
	}
	wg.Wait()
	t.Logf("%d calls, upstream %d/s, client quota 100/s: all delivered in %s (ideal %s), %d refusals obeyed",
		calls, rate, time.Since(began).Round(time.Millisecond), time.Duration(calls-rate)*time.Second/rate, refused.Load())
	if refused.Load() == 0 {
		t.Error("the upstream refused nothing: the test tested nothing")
	}
}

// TestClientStream: the stream client interceptor counts each stream, and
// a stream the upstream refuses when it starts blocks the quota on every
// replica: the next stream whose deadline ends before the block does fails
// at once, unsent, with core.ErrWaitExceedsDeadline.
func TestClientStream(t *testing.T) {
	srv := redistest.New(t)
	upstream := mustNew(t, sharedLimiters(t, srv, 1)[0], grpcmw.Rule{Name: "streams", Limits: []core.Limit{core.PerMinute(1)}, Key: grpcmw.Method()})
	addr, _ := start(t, grpc.ChainStreamInterceptor(upstream.Stream()))
	var conns []*grpc.ClientConn
	for _, l := range sharedLimiters(t, srv, 2) {
		ci, err := grpcmw.NewClient(l, grpcmw.ClientRule{Name: "out", Limits: []core.Limit{core.PerSecond(100)}})
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, dial(t, addr, grpc.WithChainStreamInterceptor(ci.Stream())))
	}
	desc := &grpc.StreamDesc{StreamName: "Chat", ServerStreams: true, ClientStreams: true}
	open := func(cc *grpc.ClientConn, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cs, err := cc.NewStream(ctx, desc, chatMethod)
		if err != nil {
			return err
		}
		if err := cs.SendMsg(wrapperspb.String("x")); err != nil {
			return cs.RecvMsg(new(wrapperspb.StringValue))
		}
		if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
			return err
		}
		return cs.CloseSend()
	}
	if err := open(conns[0], 10*time.Second); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	if err := open(conns[0], 10*time.Second); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v, want the upstream's ResourceExhausted", err)
	}
	began := time.Now()
	err := open(conns[1], 2*time.Second) // the other replica
	if !errors.Is(err, core.ErrWaitExceedsDeadline) {
		t.Fatalf("third stream, from the other replica: %v, want ErrWaitExceedsDeadline (the quota is blocked)", err)
	}
	if d := time.Since(began); d > 1500*time.Millisecond {
		t.Errorf("the third stream failed after %s, want at once", d)
	}
}

// TestClientObeysUnavailable: an upstream whose limiter fails closed
// answers UNAVAILABLE with a RetryInfo of a second; the client takes it as
// a refusal (as nethttp.Transport takes a 503 with Retry-After): it blocks
// the quota for that second and tries again, up to MaxRetries, then hands
// the caller the upstream's answer.
func TestClientObeysUnavailable(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Silent(t), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	closed, err := core.New(rdb, core.WithFailureMode(core.FailClosed), core.WithWaitTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	i := mustNew(t, closed, grpcmw.Rule{Name: "closed", Limits: []core.Limit{core.PerMinute(5)}, OnError: func(grpcmw.Call, error) {}})
	addr, e := start(t, grpc.ChainUnaryInterceptor(i.Unary()))
	var refused []bool
	var mu sync.Mutex
	l := sharedLimiters(t, redistest.New(t), 1, core.WithObserver(func(ev core.Event) {
		if ev.Op == core.OpRefused {
			mu.Lock()
			refused = append(refused, ev.Retried)
			mu.Unlock()
		}
	}))[0]
	ci, err := grpcmw.NewClient(l, grpcmw.ClientRule{Name: "out", Limits: []core.Limit{core.PerSecond(100)}, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, addr, grpc.WithChainUnaryInterceptor(ci.Unary()))
	began := time.Now()
	_, err = say(context.Background(), cc, "x")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("%v, want the upstream's Unavailable", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(refused, []bool{true, false}) {
		t.Errorf("refusals observed (retried) %v, want [true false]", refused)
	}
	if d := time.Since(began); d < 900*time.Millisecond {
		t.Errorf("the retry came after %s, sooner than the upstream's second", d)
	}
	if len(e.arrivals) != 0 {
		t.Errorf("%d calls reached the handler, want none", len(e.arrivals))
	}
}

// TestClientRefusalsOnly: the client interceptor takes for a refusal only
// what an upstream refuses. grpc-go's own RESOURCE_EXHAUSTED (a reply
// larger than the client accepts: the upstream ran the call) is returned
// as it is, the call sent once and its key not blocked; a refusal with a
// negative pushback (gRPC A6: do not retry) is not sent again.
func TestClientRefusalsOnly(t *testing.T) {
	ci, err := grpcmw.NewClient(core.NewMemory(), grpcmw.ClientRule{Name: "c", Limits: []core.Limit{core.PerSecond(100)}})
	if err != nil {
		t.Fatal(err)
	}
	addr, e := start(t)
	cc := dial(t, addr, grpc.WithChainUnaryInterceptor(ci.Unary()))
	ctx := context.Background()
	_, err = say(ctx, cc, strings.Repeat("a", 2000), grpc.MaxCallRecvMsgSize(1000))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("an oversized reply: %v, want grpc-go's RESOURCE_EXHAUSTED", err)
	}
	began := time.Now()
	if _, err := say(ctx, cc, "small"); err != nil || time.Since(began) > 500*time.Millisecond {
		t.Fatalf("the next call: %v after %s, want at once: the key was blocked", err, time.Since(began))
	}
	e.mu.Lock()
	sent := len(e.arrivals)
	e.mu.Unlock()
	if sent != 2 {
		t.Fatalf("the handler ran %d times, want 2: the oversized call was sent again", sent)
	}

	// an upstream that refuses with a pushback of -1
	var calls atomic.Int64
	refuse := func(ctx context.Context, _ any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		_ = grpc.SetTrailer(ctx, metadata.Pairs(grpcmw.PushbackTrailer, "-1"))
		return nil, status.Error(codes.ResourceExhausted, "no more")
	}
	addr, _ = start(t, grpc.ChainUnaryInterceptor(refuse))
	cc = dial(t, addr, grpc.WithChainUnaryInterceptor(ci.Unary()))
	if _, err := say(ctx, cc, "x"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a refusal with a negative pushback: %v, want RESOURCE_EXHAUSTED", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("sent %d times, want once (a negative pushback asks for no retry)", n)
	}
}

// TestClientErrorCodes: a call the client interceptors stop unsent fails
// with a gRPC status of what stopped it, as grpc-go's own errors do, and
// still wraps the cause: the caller's context (CANCELED), a slot past the
// deadline (DEADLINE_EXCEEDED, core.ErrWaitExceedsDeadline), a cost above
// the limit (RESOURCE_EXHAUSTED, core.ErrNeverFits), a cost below one
// (INVALID_ARGUMENT, core.ErrInvalidCost), a key function's
// error (UNKNOWN, the function's own error), a Limiter failing closed on a
// Redis that never answers (UNAVAILABLE); unary calls and streams alike.
func TestClientErrorCodes(t *testing.T) {
	srv := redistest.New(t)
	addr, _ := start(t)
	errKey := errors.New("no tenant")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name  string
		rule  grpcmw.ClientRule
		ctx   context.Context
		first bool // a first call takes the quota
		code  codes.Code
		is    error
	}{
		{"context cancelled", grpcmw.ClientRule{Limits: []core.Limit{core.PerMinute(5)}}, cancelled, false, codes.Canceled, context.Canceled},
		{"slot past the deadline", grpcmw.ClientRule{Limits: []core.Limit{core.PerMinute(1)}}, nil, true, codes.DeadlineExceeded, core.ErrWaitExceedsDeadline},
		{"cost above the limit", grpcmw.ClientRule{Limits: []core.Limit{core.PerMinute(1)}, Cost: func(grpcmw.OutboundCall) int64 { return 2 }}, nil, false, codes.ResourceExhausted, core.ErrNeverFits},
		{"cost below one", grpcmw.ClientRule{Limits: []core.Limit{core.PerMinute(5)}, Cost: func(grpcmw.OutboundCall) int64 { return 0 }}, nil, false, codes.InvalidArgument, core.ErrInvalidCost},
		{"key function failed", grpcmw.ClientRule{Limits: []core.Limit{core.PerMinute(5)}, Key: func(grpcmw.OutboundCall) (string, error) { return "", errKey }}, nil, false, codes.Unknown, errKey},
		{"redis down, fail closed", grpcmw.ClientRule{Limits: []core.Limit{core.PerMinute(5)}}, nil, false, codes.Unavailable, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.rule.Name = "codes"
			l := redisLimiter(t, srv)
			if c.is == nil { // a server that never answers
				rdb := redis.NewClient(&redis.Options{Addr: redistest.Silent(t), MaxRetries: -1, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = rdb.Close() })
				var err error
				if l, err = core.New(rdb, core.WithFailureMode(core.FailClosed), core.WithWaitTimeout(50*time.Millisecond)); err != nil {
					t.Fatal(err)
				}
			}
			ci, err := grpcmw.NewClient(l, c.rule)
			if err != nil {
				t.Fatal(err)
			}
			cc := dial(t, addr, grpc.WithChainUnaryInterceptor(ci.Unary()), grpc.WithChainStreamInterceptor(ci.Stream()))
			if c.first {
				if _, err := say(context.Background(), cc, "first"); err != nil {
					t.Fatal(err)
				}
			}
			ctx := c.ctx
			if ctx == nil {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
			}
			_, unary := say(ctx, cc, "x")
			_, stream := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: "Chat", ServerStreams: true, ClientStreams: true}, chatMethod)
			for what, err := range map[string]error{"unary": unary, "stream": stream} {
				if status.Code(err) != c.code || (c.is != nil && !errors.Is(err, c.is)) || !strings.Contains(err.Error(), `rule "codes"`) {
					t.Errorf("%s: %v (code %v), want code %v wrapping %v", what, err, status.Code(err), c.code, c.is)
				}
			}
		})
	}
}

// TestClientNeverFits: a call whose cost exceeds the upstream's limit can
// never pass: the upstream (Pushback) answers it with a pushback of -1,
// and the client interceptor neither sends it again nor blocks the
// upstream for the calls that fit.
func TestClientNeverFits(t *testing.T) {
	var arrived atomic.Int64
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		arrived.Add(1)
		return h(ctx, req)
	}
	upstream := mustNew(t, core.NewMemory(), grpcmw.Rule{Name: "sized", Limits: []core.Limit{core.PerMinute(5)}, Pushback: true,
		Cost: func(c grpcmw.Call) int64 { return int64(len(c.Message.(*wrapperspb.StringValue).GetValue())) }})
	addr, _ := start(t, grpc.ChainUnaryInterceptor(count, upstream.Unary()))
	ctx := context.Background()

	var trailer metadata.MD
	if _, err := say(ctx, dial(t, addr), "0123456789", grpc.Trailer(&trailer)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("an oversized call: %v, want RESOURCE_EXHAUSTED", err)
	}
	if got := trailer.Get(grpcmw.PushbackTrailer); len(got) != 1 || got[0] != "-1" {
		t.Fatalf("pushback %q, want -1", got)
	}

	ci, err := grpcmw.NewClient(core.NewMemory(), grpcmw.ClientRule{Name: "out", Limits: []core.Limit{core.PerSecond(100)}})
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, addr, grpc.WithChainUnaryInterceptor(ci.Unary()))
	arrived.Store(0)
	if _, err := say(ctx, cc, "0123456789"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("an oversized call through the client: %v, want RESOURCE_EXHAUSTED", err)
	}
	if n := arrived.Load(); n != 1 {
		t.Fatalf("the oversized call was sent %d times, want once", n)
	}
	began := time.Now()
	if _, err := say(ctx, cc, "ok"); err != nil || time.Since(began) > 500*time.Millisecond {
		t.Fatalf("a call that fits: %v after %s, want at once: the upstream was blocked", err, time.Since(began))
	}
}
