package connectmw_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/connectmw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// procedure is the one RPC of the test service, served by a generic
// handler over a well-known message (no generated code).
const procedure = "/test.v1.TestService/Ping"

// service is a mux with the Ping procedure and a plain HTTP route, and
// counts the calls that reached them.
type service struct {
	mux   *http.ServeMux
	calls atomic.Int64
	mu    sync.Mutex
	spans []span // of the calls that reached a handler through startAt
}

// span is when one admitted call was decided: from its arrival at the
// server (startAt) to its arrival at the handler, in µs. The Limiter
// admitted it at some instant inside.
type span struct{ start, end int64 }

// startKey is the context key of the time a request reached startAt.
type startKey struct{}

// startAt records when each request reaches h, for the service's spans.
func startAt(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), startKey{}, time.Now().UnixMicro())
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

func newService() *service {
	s := &service{mux: http.NewServeMux()}
	s.mux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			s.arrived(ctx)
			return connect.NewResponse(wrapperspb.String("pong " + req.Msg.GetValue())), nil
		}))
	s.mux.HandleFunc("/plain", func(w http.ResponseWriter, r *http.Request) {
		s.arrived(r.Context())
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	return s
}

func (s *service) arrived(ctx context.Context) {
	now := time.Now().UnixMicro()
	s.calls.Add(1)
	if start, ok := ctx.Value(startKey{}).(int64); ok {
		s.mu.Lock()
		s.spans = append(s.spans, span{start, now})
		s.mu.Unlock()
	}
}

// serve starts h on 127.0.0.1 with TLS and HTTP/2, which gRPC needs, and
// returns the server, whose Client trusts it.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// protocols are connect-go's three, by client option.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
}

type pingClient = *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]

func newClient(srv *httptest.Server, opts ...connect.ClientOption) pingClient {
	return connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+procedure, opts...)
}

// ping calls Ping with the X-Tenant header tenant ("" for none).
func ping(ctx context.Context, c pingClient, tenant string) error {
	req := connect.NewRequest(wrapperspb.String("x"))
	if tenant != "" {
		req.Header().Set("X-Tenant", tenant)
	}
	resp, err := c.CallUnary(ctx, req)
	if err == nil && resp.Msg.GetValue() != "pong x" {
		return fmt.Errorf("answer %q", resp.Msg.GetValue())
	}
	return err
}

// redisLimiter returns a Limiter on the shared test Redis with a prefix of
// its own and a client of its own, and the decisions it made.
func redisLimiter(t testing.TB, prefix string, opts ...core.Option) (*core.Limiter, *decisions) {
	t.Helper()
	d := &decisions{}
	return newRedisLimiter(t, prefix, append(opts, core.WithObserver(d.observe))...), d
}

// newRedisLimiter returns a Limiter on the shared test Redis with a prefix
// of its own and a client of its own.
func newRedisLimiter(t testing.TB, prefix string, opts ...core.Option) *core.Limiter {
	t.Helper()
	srv := redistest.New(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	l, err := core.New(c, append([]core.Option{core.WithPrefix(prefix), core.WithTimeout(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// decisions records the Limiter's decisions, for the exact retry delay.
type decisions struct {
	mu  sync.Mutex
	evs []core.Event
}

func (d *decisions) observe(ev core.Event) {
	d.mu.Lock()
	d.evs = append(d.evs, ev)
	d.mu.Unlock()
}

// lastDenial returns the RetryAfter of the last denial recorded.
func (d *decisions) lastDenial(t testing.TB) time.Duration {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.evs) - 1; i >= 0; i-- {
		if ev := d.evs[i]; !ev.Result.Allowed && ev.Err == nil {
			return ev.Result.RetryAfter
		}
	}
	t.Fatal("no denial recorded")
	return 0
}

func uniquePrefix(t *testing.T) string {
	return fmt.Sprintf("cmw%d-%s:", time.Now().UnixNano(), strings.ReplaceAll(t.Name(), "/", "-"))
}

// retryDelays returns the RetryInfo delays among the details of err.
func retryDelays(t *testing.T, err error) []time.Duration {
	t.Helper()
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		t.Fatalf("%v (%T) is no *connect.Error", err, err)
	}
	var ds []time.Duration
	for _, d := range cerr.Details() {
		v, err := d.Value()
		if err != nil {
			t.Fatalf("detail %s: %v", d.Type(), err)
		}
		ri, ok := v.(*errdetails.RetryInfo)
		if !ok {
			t.Fatalf("detail %s, want only google.rpc.RetryInfo", d.Type())
		}
		ds = append(ds, ri.GetRetryDelay().AsDuration())
	}
	return ds
}

// describe prints an error as a connect-go client sees it, for the log.
func describe(err error) string {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "code=%s (%d) message=%q", cerr.Code(), cerr.Code(), cerr.Message())
	for _, d := range cerr.Details() {
		v, _ := d.Value()
		fmt.Fprintf(&b, "\n\tdetail %s: %v", d.Type(), v)
	}
	keys := make([]string, 0, len(cerr.Meta()))
	for k := range cerr.Meta() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "\n\tmeta %s: %s", k, strings.Join(cerr.Meta()[k], ", "))
	}
	return b.String()
}

// A denial in each protocol: CodeResourceExhausted, a RetryInfo of the
// Limiter's exact RetryAfter, the rate-limit fields of the rule's style and
// Retry-After in the metadata; the handler never runs. Plain callers of the
// same mux, under the same key, get nethttp's 429.
func TestDenialEachProtocol(t *testing.T) {
	styles := []struct {
		style  core.HeaderStyle
		fields func(retry string) map[string]string
	}{
		{core.XRateLimit, func(retry string) map[string]string {
			return map[string]string{"X-Ratelimit-Limit": "2", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": retry, "Ratelimit": "", "Ratelimit-Policy": ""}
		}},
		{core.IETF, func(retry string) map[string]string {
			return map[string]string{"X-Ratelimit-Limit": "", "Ratelimit-Policy": `"2-per-1m";q=2;w=60`, "Ratelimit": `"2-per-1m";r=0;t=` + retry}
		}},
	}
	for _, st := range styles {
		for _, p := range protocols {
			t.Run(st.style.String()+"/"+p.name, func(t *testing.T) {
				l, d := redisLimiter(t, uniquePrefix(t), core.WithDenyCache(1000))
				s := newService()
				rule := core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(2)}, Key: keyfuncs.Header("X-Tenant"), Headers: st.style}
				srv := serve(t, connectmw.Limit(l, rule)(s.mux))
				c := newClient(srv, p.opts...)
				ctx := context.Background()
				for i := range 2 {
					if err := ping(ctx, c, "acme"); err != nil {
						t.Fatalf("call %d: %v", i+1, err)
					}
				}
				for i := range 2 { // by Redis, then by the deny cache
					err := ping(ctx, c, "acme")
					if got := connect.CodeOf(err); got != connect.CodeResourceExhausted {
						t.Fatalf("denied call %d: code %s (%v), want resource_exhausted", i+1, got, err)
					}
					retry := d.lastDenial(t)
					if got := retryDelays(t, err); !slices.Equal(got, []time.Duration{retry}) {
						t.Fatalf("denied call %d: RetryInfo %v, want the decision's %v", i+1, got, retry)
					}
					if retry <= 55*time.Second || retry > time.Minute {
						t.Fatalf("retry %v, want just under a minute", retry)
					}
					var cerr *connect.Error
					errors.As(err, &cerr)
					if cerr.Message() != "rate limit exceeded" {
						t.Fatalf("message %q", cerr.Message())
					}
					secs := fmt.Sprint(int64((retry + time.Second - 1) / time.Second))
					want := st.fields(secs)
					want["Retry-After"] = secs
					for k, v := range want {
						if got := cerr.Meta().Get(k); got != v {
							t.Errorf("denied call %d: meta %s = %q, want %q", i+1, k, got, v)
						}
					}
					if i == 0 {
						t.Logf("%s client sees: %s", p.name, describe(err))
					}
				}
				if n := s.calls.Load(); n != 2 {
					t.Fatalf("the handler ran %d times, want 2", n)
				}
				// a plain HTTP caller with the same key: nethttp's 429
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/plain", nil)
				req.Header.Set("X-Tenant", "acme")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusTooManyRequests || string(body) != "Too Many Requests\n" ||
					resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("plain caller: %d %q %v, want nethttp's 429", resp.StatusCode, body, resp.Header)
				}
			})
		}
	}
}

// Plain callers and Connect calls count under the same keys, and plain
// callers get exactly nethttp's answers: a rule guarded by nethttp on one
// server and by connectmw on another, on one Redis, answers the same
// requests the same, byte for byte.
func TestPlainCallersAsNethttp(t *testing.T) {
	l, _ := redisLimiter(t, uniquePrefix(t))
	s := newService()
	rule := core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(3)}, Key: keyfuncs.Header("X-Tenant"), Headers: core.Both}
	srv := serve(t, connectmw.Limit(l, rule)(s.mux))
	c := newClient(srv)
	if err := ping(context.Background(), c, "acme"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, method, ctype, accept string
		status                      int
		ctypeOut                    string
	}{
		{"GET", http.MethodGet, "", "", http.StatusOK, "text/plain; charset=utf-8"},
		// a JSON POST without Connect-Protocol-Version is no Connect call
		{"JSON POST", http.MethodPost, "application/json", "", http.StatusOK, "text/plain; charset=utf-8"},
		{"GET denied", http.MethodGet, "", "", http.StatusTooManyRequests, "text/plain; charset=utf-8"},
		{"GET denied, problem", http.MethodGet, "", "application/problem+json", http.StatusTooManyRequests, "application/problem+json"},
		{"JSON POST denied", http.MethodPost, "application/json", "", http.StatusTooManyRequests, "text/plain; charset=utf-8"},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(tc.method, srv.URL+"/plain", strings.NewReader("{}"))
		req.Header.Set("X-Tenant", "acme")
		if tc.ctype != "" {
			req.Header.Set("Content-Type", tc.ctype)
		}
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != tc.ctypeOut {
			t.Fatalf("%s: %d %s %q", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		if tc.status == http.StatusTooManyRequests {
			if resp.Header.Get("Retry-After") == "" || resp.Header.Get("Ratelimit") == "" || resp.Header.Get("X-Ratelimit-Remaining") != "0" {
				t.Fatalf("%s: header %v", tc.name, resp.Header)
			}
			if tc.ctypeOut == "application/problem+json" && !strings.Contains(string(body), `"violated-policies":["3-per-1m"]`) {
				t.Fatalf("%s: body %s", tc.name, body)
			}
		}
	}
}

// deadRedis returns a Limiter on a Redis that never answers (a loopback
// listener that reads and stays silent).
func deadRedis(t *testing.T, mode core.FailureMode) *core.Limiter {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.Silent(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	opts := []core.Option{core.WithFailureMode(mode), core.WithTimeout(300 * time.Millisecond)}
	if mode == core.FailLocal {
		opts = append(opts, core.WithLocalShare(1))
	}
	l, err := core.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Redis down: FailClosed answers CodeUnavailable with a RetryInfo of a
// second (plain callers its 503); FailOpen and FailLocal let calls through,
// after OnError saw the failure.
func TestRedisDown(t *testing.T) {
	cases := []struct {
		mode  core.FailureMode
		code  connect.Code // 0: the call passes
		plain int
	}{
		{core.FailClosed, connect.CodeUnavailable, http.StatusServiceUnavailable},
		{core.FailOpen, 0, http.StatusOK},
		{core.FailLocal, 0, http.StatusOK},
	}
	for _, tc := range cases {
		for _, p := range protocols {
			t.Run(tc.mode.String()+"/"+p.name, func(t *testing.T) {
				var errs atomic.Int64
				rule := core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(100)},
					OnError: func(http.ResponseWriter, *http.Request, error) { errs.Add(1) }}
				s := newService()
				srv := serve(t, connectmw.Limit(deadRedis(t, tc.mode), rule)(s.mux))
				err := ping(context.Background(), newClient(srv, p.opts...), "")
				if got := connect.CodeOf(err); err != nil && got != tc.code || err == nil && tc.code != 0 {
					t.Fatalf("call: %v, want code %v", err, tc.code)
				}
				if tc.code != 0 {
					if got := retryDelays(t, err); !slices.Equal(got, []time.Duration{time.Second}) {
						t.Fatalf("RetryInfo %v, want [1s]", got)
					}
					var cerr *connect.Error
					errors.As(err, &cerr)
					if cerr.Message() != "rate limiter unavailable" || cerr.Meta().Get("Retry-After") != "1" {
						t.Fatalf("%s", describe(err))
					}
					t.Logf("%s client sees: %s", p.name, describe(err))
				}
				if errs.Load() != 1 {
					t.Fatalf("OnError called %d times, want 1", errs.Load())
				}
				resp, err := srv.Client().Get(srv.URL + "/plain")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.plain {
					t.Fatalf("plain caller: %d %q", resp.StatusCode, body)
				}
				if tc.plain == http.StatusServiceUnavailable && (string(body) != "Service Unavailable\n" || resp.Header.Get("Retry-After") != "1") {
					t.Fatalf("plain caller: %d %q %v, want nethttp's 503", resp.StatusCode, body, resp.Header)
				}
			})
		}
	}
}

// An OnError that writes answers Connect calls itself: the middleware
// turns only the Limiter's own 503 into a Connect error.
func TestOnErrorWrites(t *testing.T) {
	rule := core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(100)},
		OnError: func(w http.ResponseWriter, r *http.Request, err error) {
			connect.NewErrorWriter().Write(w, r, connect.NewError(connect.CodeInternal, errors.New("custom")))
		}}
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			srv := serve(t, connectmw.Limit(deadRedis(t, core.FailOpen), rule)(newService().mux))
			err := ping(context.Background(), newClient(srv, p.opts...), "")
			if connect.CodeOf(err) != connect.CodeInternal || !strings.Contains(err.Error(), "custom") {
				t.Fatalf("call: %v, want OnError's internal error", err)
			}
		})
	}
}

// A key that cannot be computed (no header, a junk forwarded address) is
// counted under the fallback key, never passed uncounted, never a panic.
func TestBadMetadataFallback(t *testing.T) {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			l, _ := redisLimiter(t, uniquePrefix(t))
			var keyErrs atomic.Int64
			rule := core.Rule{
				Name:   "api",
				Limits: []core.Limit{core.PerMinute(2)},
				Key: keyfuncs.Join(keyfuncs.Header("X-Tenant"),
					keyfuncs.IPWith(keyfuncs.IPOptions{Trusted: []netip.Prefix{loopback}})),
				FallbackKey: keyfuncs.IP(),
				OnError:     func(http.ResponseWriter, *http.Request, error) { keyErrs.Add(1) },
			}
			srv := serve(t, connectmw.Limit(l, rule)(newService().mux))
			c := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+procedure,
				append(p.opts, connect.WithInterceptors(junkForwarded{}))...)
			ctx := context.Background()
			bad := []string{"", strings.Repeat("z", 8000)} // no tenant; an oversized one, both with a junk X-Forwarded-For
			for i := range 2 {
				if err := ping(ctx, c, bad[i]); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
			}
			err := ping(ctx, c, "")
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Fatalf("third call: %v, want resource_exhausted under the fallback key", err)
			}
			if keyErrs.Load() != 3 {
				t.Fatalf("OnError saw %d key errors, want 3", keyErrs.Load())
			}
		})
	}
}

// junkForwarded adds an X-Forwarded-For that is no address.
type junkForwarded struct{}

func (junkForwarded) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("X-Forwarded-For", "203.0.113.9, not-an-ip")
		return next(ctx, req)
	}
}

func (junkForwarded) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (junkForwarded) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Invalid configuration is refused when the middleware is built.
func TestInvalidConfig(t *testing.T) {
	l := core.NewMemory()
	good := []core.Limit{core.PerMinute(1)}
	cases := []struct {
		name string
		l    *core.Limiter
		rule core.Rule
		opts []connectmw.Option
		want error
	}{
		{"nil Limiter", nil, core.Rule{Name: "api", Limits: good}, nil, core.ErrInvalidRule},
		{"no limits", l, core.Rule{Name: "api"}, nil, core.ErrNoLimits},
		{"bad name", l, core.Rule{Name: "a:b", Limits: good}, nil, core.ErrInvalidRule},
		{"empty name", l, core.Rule{Limits: good}, nil, core.ErrInvalidRule},
		{"bad limit", l, core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(0)}}, nil, core.ErrInvalidLimit},
		{"nil ErrorWriter", l, core.Rule{Name: "api", Limits: good}, []connectmw.Option{connectmw.WithErrorWriter(nil)}, connectmw.ErrNilErrorWriter},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := connectmw.New(tc.l, tc.rule, tc.opts...)
			if !errors.Is(err, tc.want) || mw != nil {
				t.Fatalf("New: %v, want %v", err, tc.want)
			}
			defer func() {
				if r := recover(); r == nil {
					t.Fatal("Limit did not panic")
				} else if e, ok := r.(error); !ok || !errors.Is(e, tc.want) {
					t.Fatalf("Limit panicked with %v, want %v", r, tc.want)
				}
			}()
			connectmw.Limit(tc.l, tc.rule, tc.opts...)
		})
	}
}

// readCounter is a request body that counts its reads.
type readCounter struct{ reads atomic.Int64 }

func (b *readCounter) Read([]byte) (int, error) { b.reads.Add(1); return 0, io.EOF }
func (b *readCounter) Close() error             { return nil }

// A denied call is answered before its body is read, in each protocol's
// wire form.
func TestDeniedBeforeBody(t *testing.T) {
	cases := []struct {
		name, ctype, version string
		status               int
		grpcStatus           string
	}{
		{"connect", "application/proto", "1", http.StatusTooManyRequests, ""},
		{"connect json", "application/json", "1", http.StatusTooManyRequests, ""},
		{"grpc", "application/grpc", "", http.StatusOK, "8"},
		{"grpc-web", "application/grpc-web+proto", "", http.StatusOK, "8"},
	}
	l := core.NewMemory()
	mw := connectmw.Limit(l, core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(1)}})
	var ran atomic.Int64
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := &readCounter{}
			req := httptest.NewRequest(http.MethodPost, procedure, body)
			req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1234", i+1)
			req.Header.Set("Content-Type", tc.ctype)
			if tc.version != "" {
				req.Header.Set("Connect-Protocol-Version", tc.version)
			}
			h.ServeHTTP(httptest.NewRecorder(), req) // the one allowed
			ranBefore, readsBefore := ran.Load(), body.reads.Load()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if ran.Load() != ranBefore || body.reads.Load() != readsBefore {
				t.Fatalf("the denied call ran the handler or read its body")
			}
			res := rec.Result()
			grpcStatus := res.Header.Get("Grpc-Status") // gRPC-Web: trailers-only, in the header
			if tc.name == "grpc" {
				grpcStatus = res.Trailer.Get("Grpc-Status")
			}
			if res.StatusCode != tc.status || grpcStatus != tc.grpcStatus || res.Header.Get("Retry-After") != "60" {
				t.Fatalf("%d %v %q", res.StatusCode, res.Header, rec.Body.String())
			}
			if tc.grpcStatus == "" && !strings.HasPrefix(rec.Body.String(), `{"code":"resource_exhausted","message":"rate limit exceeded","details":[{"type":"google.rpc.RetryInfo"`) {
				t.Fatalf("body %q", rec.Body.String())
			}
		})
	}
}

// worstWindow returns the largest number of admitted calls that certainly
// fall in one window of length w (µs): the spans lying wholly inside some
// window (t-w, t]. The admitting instant of each call is only known to lie
// inside its span, so this is a lower bound on the true worst window: a
// figure above the limit proves over-admission, and latency can never
// inflate it (the method of benchmarks/bench's WorstWindow).
func worstWindow(spans []span, w int64) int {
	slices.SortFunc(spans, func(a, b span) int { return int(a.end - b.end) })
	worst := 0
	for j := range spans {
		t := spans[j].end
		n := 0
		for i := j; i >= 0 && spans[i].end > t-w; i-- {
			if spans[i].start > t-w {
				n++
			}
		}
		worst = max(worst, n)
	}
	return worst
}

// Three servers (three Limiters) on one Redis, under concurrent calls in
// all three protocols for one key: no window of a second admits more than
// the limit, and every call is either served or denied with
// resource_exhausted.
func TestExactAcrossServers(t *testing.T) {
	const limit = 20
	prefix := uniquePrefix(t)
	s := newService()
	var srvs []*httptest.Server
	for range 3 {
		l := newRedisLimiter(t, prefix, core.WithDenyCache(1000))
		rule := core.Rule{Name: "api", Limits: []core.Limit{core.PerSecond(limit)}, Key: keyfuncs.Header("X-Tenant")}
		srvs = append(srvs, serve(t, startAt(connectmw.Limit(l, rule)(s.mux))))
	}
	var (
		wg                sync.WaitGroup
		denied, otherErrs atomic.Int64
		firstErr          atomic.Value
	)
	start := time.Now()
	deadline := start.Add(3 * time.Second)
	for i := range 9 { // 3 servers × 3 protocols
		c := newClient(srvs[i%3], protocols[i/3].opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				err := ping(context.Background(), c, "hot")
				switch {
				case err == nil:
				case connect.CodeOf(err) == connect.CodeResourceExhausted:
					denied.Add(1)
					time.Sleep(2 * time.Millisecond)
				default:
					otherErrs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if n := otherErrs.Load(); n > 0 {
		t.Fatalf("%d calls failed otherwise, first: %v", n, firstErr.Load())
	}
	s.mu.Lock()
	spans := slices.Clone(s.spans)
	s.mu.Unlock()
	worst := worstWindow(spans, time.Second.Microseconds())
	var longest int64
	for _, sp := range spans {
		longest = max(longest, sp.end-sp.start)
	}
	t.Logf("3 servers on one Redis, 9 clients (3 per protocol), %s: %d served, %d denied; worst strict 1s window %d (limit %d); longest decision span %s",
		took.Round(time.Millisecond), len(spans), denied.Load(), worst, limit, time.Duration(longest)*time.Microsecond)
	if len(spans) < 2*limit || denied.Load() == 0 {
		t.Fatalf("%d served, %d denied: the load did not reach the limit", len(spans), denied.Load())
	}
	if worst > limit {
		t.Fatalf("a window of 1s admitted %d calls, limit %d", worst, limit)
	}
}

// A GET is a Connect call only with the connect=v1 query parameter (the
// default ErrorWriter requires it): the middleware's shortcut for GETs
// answers as the ErrorWriter's IsSupported does.
func TestGetClassification(t *testing.T) {
	ew := connect.NewErrorWriter(connect.WithRequireConnectProtocolHeader())
	cases := []struct {
		query string
		call  bool
	}{
		{"", false},
		{"a=1&b=2", false},
		{"connect=v1&encoding=proto&message=", true},
		{"encoding=json&connect=v1", true},
		{"%63onnect=v1", true}, // an escaped name
		{"connect=", false},
		{"connect%3Dv1", false},
		{"xconnect=v1", false},
	}
	for i, tc := range cases {
		t.Run(tc.query, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, procedure+"?"+tc.query, nil)
			req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1234", i+1)
			if got := ew.IsSupported(req); got != tc.call {
				t.Fatalf("IsSupported = %v, want %v", got, tc.call)
			}
			h := connectmw.Limit(core.NewMemory(), core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(1)}})(http.HandlerFunc(benchHandler))
			h.ServeHTTP(httptest.NewRecorder(), req)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			want := "text/plain; charset=utf-8"
			if tc.call {
				want = "application/json"
			}
			if got := rec.Header().Get("Content-Type"); rec.Code != http.StatusTooManyRequests || got != want {
				t.Fatalf("denial %d %s, want 429 %s", rec.Code, got, want)
			}
		})
	}
}

// A server stream is decided when it starts: its denial reaches the
// client's stream in each protocol (the Connect streaming protocol writes
// the error as its end-of-stream message).
func TestStreamDenied(t *testing.T) {
	const streamProcedure = "/test.v1.TestService/Count"
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			var started atomic.Int64
			mux := http.NewServeMux()
			mux.Handle(streamProcedure, connect.NewServerStreamHandler(streamProcedure,
				func(_ context.Context, _ *connect.Request[wrapperspb.Int64Value], s *connect.ServerStream[wrapperspb.Int64Value]) error {
					started.Add(1)
					for i := range 3 {
						if err := s.Send(wrapperspb.Int64(int64(i))); err != nil {
							return err
						}
					}
					return nil
				}))
			l, d := redisLimiter(t, uniquePrefix(t))
			srv := serve(t, connectmw.Limit(l, core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(1)}})(mux))
			c := connect.NewClient[wrapperspb.Int64Value, wrapperspb.Int64Value](srv.Client(), srv.URL+streamProcedure, p.opts...)
			count := func() (int, error) {
				st, err := c.CallServerStream(context.Background(), connect.NewRequest(wrapperspb.Int64(3)))
				if err != nil {
					return 0, err
				}
				defer st.Close()
				n := 0
				for st.Receive() {
					n++
				}
				return n, st.Err()
			}
			if n, err := count(); n != 3 || err != nil {
				t.Fatalf("first stream: %d messages, %v", n, err)
			}
			n, err := count()
			if n != 0 || connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Fatalf("second stream: %d messages, %v; want resource_exhausted", n, err)
			}
			if got, want := retryDelays(t, err), d.lastDenial(t); !slices.Equal(got, []time.Duration{want}) {
				t.Fatalf("RetryInfo %v, want [%v]", got, want)
			}
			if started.Load() != 1 {
				t.Fatalf("the handler started %d streams, want 1", started.Load())
			}
		})
	}
}

// connect-go and genproto stay out of the root module's graph, and out of
// the build of an application that uses nethttp alone.
func TestRootModuleGraph(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"list", "-m", "all"},
		{"list", "-deps", "github.com/ratewindow/ratewindow/nethttp"},
	} {
		cmd := exec.Command(goTool, args...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		for line := range strings.Lines(string(out)) {
			for _, banned := range []string{"connectrpc.com/", "google.golang.org/genproto", "google.golang.org/grpc", "google.golang.org/protobuf"} {
				if strings.HasPrefix(line, banned) {
					t.Errorf("go %s lists %s", strings.Join(args, " "), strings.TrimSpace(line))
				}
			}
		}
	}
}
