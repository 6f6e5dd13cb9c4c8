package grpcmw_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/grpcmw"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

type grpcmwRule = grpcmw.Rule

func mustNew(t testing.TB, l *core.Limiter, rule grpcmw.Rule) *grpcmw.Interceptors {
	t.Helper()
	i, err := grpcmw.New(l, rule)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// keyRecorder observes the keys of a Limiter's decisions.
type keyRecorder struct {
	mu   sync.Mutex
	keys []string
}

func (r *keyRecorder) Observe(ev core.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, ev.Key)
}

func (r *keyRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys
	r.keys = nil
	return k
}

// details returns a status's details as text, in order.
func details(st *status.Status) []string {
	var out []string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			out = append(out, "RetryInfo "+d.GetRetryDelay().AsDuration().String())
		case *errdetails.QuotaFailure:
			for _, v := range d.GetViolations() {
				out = append(out, fmt.Sprintf("QuotaFailure subject=%s quota_id=%s quota_value=%d", v.GetSubject(), v.GetQuotaId(), v.GetQuotaValue()))
			}
		case *errdetails.ErrorInfo:
			keys := make([]string, 0, len(d.GetMetadata()))
			for k, v := range d.GetMetadata() {
				keys = append(keys, k+"="+v)
			}
			slices.Sort(keys)
			out = append(out, fmt.Sprintf("ErrorInfo reason=%s domain=%s %s", d.GetReason(), d.GetDomain(), strings.Join(keys, " ")))
		default:
			out = append(out, fmt.Sprintf("%T", d))
		}
	}
	return out
}

// rateMD returns the rate-limit metadata of md, joined, in key order.
func rateMD(md metadata.MD) []string {
	var out []string
	for k, vs := range md {
		if strings.Contains(k, "ratelimit") || k == "retry-after" || k == grpcmw.PushbackTrailer {
			out = append(out, k+": "+strings.Join(vs, ","))
		}
	}
	slices.Sort(out)
	return out
}

// TestDenial: real grpc-go clients and server over TCP on real Redis: the
// rate-limit fields as header metadata, then a denial with code 8 and the
// details a client parses, the pushback trailer; the key never shows.
func TestDenial(t *testing.T) {
	clock := &fixedClock{now: time.Now()}
	rec := &keyRecorder{}
	l := redisLimiter(t, redistest.New(t), core.WithClock(clock.Now), core.WithObserver(rec.Observe))
	cc, _ := serveRule(t, l, grpcmw.Rule{
		Name: "api", Limits: []core.Limit{core.PerMinute(2), core.PerHour(100)},
		Key: grpcmw.Metadata("x-api-key"), Headers: core.Both, Pushback: true,
	})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "secret-key-1")
	for i, want := range [][]string{
		{`ratelimit-policy: "2-per-1m";q=2;w=60, "100-per-1h";q=100;w=3600`, `ratelimit: "2-per-1m";r=1;t=60`, "x-ratelimit-limit: 2", "x-ratelimit-remaining: 1", "x-ratelimit-reset: 60"},
		{`ratelimit-policy: "2-per-1m";q=2;w=60, "100-per-1h";q=100;w=3600`, `ratelimit: "2-per-1m";r=0;t=60`, "x-ratelimit-limit: 2", "x-ratelimit-remaining: 0", "x-ratelimit-reset: 60"},
	} {
		var hdr metadata.MD
		if got, err := say(ctx, cc, "hi", grpc.Header(&hdr)); err != nil || got != "hi" {
			t.Fatalf("call %d: %q, %v", i+1, got, err)
		}
		if got := rateMD(hdr); !slices.Equal(got, want) {
			t.Errorf("call %d: header metadata\n%q\nwant\n%q", i+1, got, want)
		}
	}
	clock.Advance(20 * time.Second)
	var hdr, trl metadata.MD
	_, err := say(ctx, cc, "hi", grpc.Header(&hdr), grpc.Trailer(&trl))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded" {
		t.Fatalf("third call: %v, want ResourceExhausted", err)
	}
	wantDetails := []string{
		"RetryInfo 40s",
		"QuotaFailure subject=rule:api quota_id=2-per-1m quota_value=2",
		"ErrorInfo reason=RATE_LIMIT_EXCEEDED domain=ratewindow policy=2-per-1m rule=api",
	}
	if got := details(st); !slices.Equal(got, wantDetails) {
		t.Errorf("details\n%q\nwant\n%q", got, wantDetails)
	}
	wantHdr := []string{"grpc-retry-pushback-ms: 40000", `ratelimit-policy: "2-per-1m";q=2;w=60, "100-per-1h";q=100;w=3600`, `ratelimit: "2-per-1m";r=0;t=40`, "retry-after: 40", "x-ratelimit-limit: 2", "x-ratelimit-remaining: 0", "x-ratelimit-reset: 40"}
	if len(hdr) != 0 {
		t.Errorf("denial's header metadata %q, want none (trailers-only)", hdr)
	}
	if got := rateMD(trl); !slices.Equal(got, wantHdr) {
		t.Errorf("denial's trailer metadata\n%q\nwant\n%q", got, wantHdr)
	}
	if d, ok := grpcmw.RetryDelay(st, trl); !ok || d != 40*time.Second {
		t.Errorf("RetryDelay = %s, %t; want 40s", d, ok)
	}
	// what a grpc-go client prints, for the record
	t.Logf("status: %v", err)
	t.Logf("details: %s", prototext.Format(st.Proto()))
	t.Logf("header: %q", rateMD(hdr))
	t.Logf("trailer: %q", rateMD(trl))
	if strings.Contains(fmt.Sprint(st.Proto(), hdr, trl), "secret-key-1") {
		t.Error("the denial shows the client's key")
	}
	if got, want := rec.take(), []string{"api:md:x-api-key:secret-key-1", "api:md:x-api-key:secret-key-1", "api:md:x-api-key:secret-key-1"}; !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

// TestFallbackKeys: a call whose key cannot be computed (no metadata, an
// oversized value, a junk forwarded address from a trusted proxy) is
// limited under the fallback key, never passed uncounted, never a panic.
func TestFallbackKeys(t *testing.T) {
	rec := &keyRecorder{}
	var errs []error
	var mu sync.Mutex
	l := core.NewMemory(core.WithObserver(rec.Observe))
	loopback := grpcmw.PeerWith(keyfuncsTrustLoopback())
	cc, _ := serveRule(t, l, grpcmw.Rule{
		Name: "fb", Limits: []core.Limit{core.PerMinute(2)},
		Key:         grpcmw.Join(grpcmw.Metadata("x-api-key"), loopback),
		FallbackKey: loopback,
		OnError:     func(_ grpcmw.Call, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
	})
	long := strings.Repeat("k", grpcmw.MaxMetadataValue+1)
	for i, tc := range []struct {
		md       []string
		wantKey  string
		wantCode codes.Code
	}{
		{nil, "fb:nokey:ip:127.0.0.1", codes.OK},
		{[]string{"x-api-key", long}, "fb:nokey:ip:127.0.0.1", codes.OK},
		{[]string{"x-api-key", "k", "x-forwarded-for", "unknown"}, "fb:nokey", codes.OK},
		{[]string{"x-api-key", "k", "x-forwarded-for", "not-an-ip"}, "fb:nokey", codes.OK},
		{[]string{"x-api-key", "k", "x-forwarded-for", "198.51.100.4"}, `fb:md:x-api-key:k|ip:198.51.100.4`, codes.OK},
		{[]string{"x-api-key", "k", "x-forwarded-for", "203.0.113.9, 198.51.100.4"}, `fb:md:x-api-key:k|ip:198.51.100.4`, codes.OK},
		{[]string{"x-api-key", "k", "x-forwarded-for", "198.51.100.4"}, `fb:md:x-api-key:k|ip:198.51.100.4`, codes.ResourceExhausted},
		{[]string{"x-api-key", long}, "fb:nokey:ip:127.0.0.1", codes.ResourceExhausted},
		{[]string{"x-api-key", "k", "x-forwarded-for", ""}, `fb:md:x-api-key:k|ip:127.0.0.1`, codes.OK},
	} {
		ctx := context.Background()
		if tc.md != nil {
			ctx = metadata.AppendToOutgoingContext(ctx, tc.md...)
		}
		_, err := say(ctx, cc, "hi")
		if got := status.Code(err); got != tc.wantCode {
			t.Errorf("call %d: %v, want %s", i+1, err, tc.wantCode)
		}
		if got := rec.take(); !slices.Equal(got, []string{tc.wantKey}) {
			t.Errorf("call %d: keys %q, want %q", i+1, got, tc.wantKey)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 5 {
		t.Errorf("OnError saw %d errors, want 5: %v", len(errs), errs)
	}
	if !errors.Is(errs[1], grpcmw.ErrMetadataTooLong) {
		t.Errorf("the oversized value's error %v, want ErrMetadataTooLong", errs[1])
	}
}

// TestFailClosed: a Limiter that fails closed answers UNAVAILABLE with a
// RetryInfo of a second and retry-after: 1, never RESOURCE_EXHAUSTED.
func TestFailClosed(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Silent(t), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := core.New(rdb, core.WithFailureMode(core.FailClosed), core.WithTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cc, _ := serveRule(t, l, grpcmw.Rule{Name: "closed", Limits: []core.Limit{core.PerMinute(5)}, OnError: func(grpcmw.Call, error) {}})
	var hdr metadata.MD
	_, err = say(context.Background(), cc, "hi", grpc.Trailer(&hdr))
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("%v, want Unavailable", err)
	}
	want := []string{"RetryInfo 1s", "ErrorInfo reason=RATE_LIMITER_UNAVAILABLE domain=ratewindow rule=closed"}
	if got := details(st); !slices.Equal(got, want) {
		t.Errorf("details %q, want %q", got, want)
	}
	if got := rateMD(hdr); !slices.Equal(got, []string{"retry-after: 1"}) {
		t.Errorf("header metadata %q, want retry-after: 1", got)
	}
}

// TestRuleFeatures: Skip, DryRun, Cost, LimitsFor, CountIf and Penalty
// through a real server, each rule on its own memory Limiter.
func TestRuleFeatures(t *testing.T) {
	minute := func(n int64) []core.Limit { return []core.Limit{core.PerMinute(n)} }
	for _, tc := range []struct {
		name  string
		rule  grpcmw.Rule
		msgs  []string
		codes []codes.Code
	}{
		{"skip", grpcmw.Rule{Limits: minute(1), Skip: func(c grpcmw.Call) bool {
			return c.Message.(*wrapperspb.StringValue).GetValue() == "health"
		}}, []string{"health", "health", "a", "health", "a"}, []codes.Code{0, 0, 0, 0, 8}},
		{"dry run", grpcmw.Rule{Limits: minute(1), DryRun: true}, []string{"a", "a", "a"}, []codes.Code{0, 0, 0}},
		{"cost", grpcmw.Rule{Limits: minute(5), Cost: func(c grpcmw.Call) int64 {
			return int64(len(c.Message.(*wrapperspb.StringValue).GetValue()))
		}}, []string{"abc", "ab", "a", "abcdef"}, []codes.Code{0, 0, 8, 8}},
		{"limits for", grpcmw.Rule{Limits: minute(1), LimitsFor: func(c grpcmw.Call) ([]core.Limit, error) {
			if c.Message.(*wrapperspb.StringValue).GetValue() == "pro" {
				return []core.Limit{{Name: "pro", Count: 3, Window: time.Minute}}, nil
			}
			return nil, nil
		}}, []string{"pro", "pro", "pro", "pro"}, []codes.Code{0, 0, 0, 8}},
		{"count if", grpcmw.Rule{Limits: minute(2), CountIf: func(c codes.Code) bool { return c == codes.Unauthenticated }},
			[]string{"ok", "ok", "ok", "code:16", "code:16", "code:16", "ok"}, []codes.Code{0, 0, 0, 16, 16, 8, 8}},
		{"penalty", grpcmw.Rule{Limits: minute(1), Penalty: &core.Penalty{Denials: 1, Within: time.Minute, Ban: time.Hour}},
			[]string{"a", "a", "a"}, []codes.Code{0, 8, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rule.Name = "features"
			cc, _ := serveRule(t, core.NewMemory(), tc.rule)
			var got []codes.Code
			for _, m := range tc.msgs {
				_, err := say(context.Background(), cc, m)
				got = append(got, status.Code(err))
			}
			if !slices.Equal(got, tc.codes) {
				t.Errorf("codes %v, want %v", got, tc.codes)
			}
		})
	}
}

// TestBanDetails: the denial of a banned key says so and lists no policy.
func TestBanDetails(t *testing.T) {
	clock := &fixedClock{now: time.Now()}
	cc, _ := serveRule(t, core.NewMemory(core.WithClock(clock.Now)), grpcmw.Rule{Name: "ban", Limits: []core.Limit{core.PerMinute(1)},
		Penalty: &core.Penalty{Denials: 1, Within: time.Minute, Ban: time.Hour}})
	for range 2 {
		_, _ = say(context.Background(), cc, "a")
	}
	_, err := say(context.Background(), cc, "a")
	want := []string{"RetryInfo 1h0m0s", "ErrorInfo reason=KEY_BANNED domain=ratewindow rule=ban"}
	if got := details(status.Convert(err)); !slices.Equal(got, want) {
		t.Errorf("details %q, want %q", got, want)
	}
}

// TestStream: a stream is decided when it starts and, with PerMessage, on
// every message it receives: the denied message ends the stream with
// RESOURCE_EXHAUSTED and its RetryInfo.
func TestStream(t *testing.T) {
	clock := &fixedClock{now: time.Now()}
	l := redisLimiter(t, redistest.New(t), core.WithClock(clock.Now))
	cc, _ := serveRule(t, l, grpcmw.Rule{Name: "chat", Limits: []core.Limit{core.PerMinute(3)}, PerMessage: true})
	desc := &grpc.StreamDesc{StreamName: "Chat", ServerStreams: true, ClientStreams: true}
	cs, err := cc.NewStream(context.Background(), desc, chatMethod)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := range 3 {
		if err := cs.SendMsg(wrapperspb.String(fmt.Sprint(i))); err != nil {
			break
		}
		out := new(wrapperspb.StringValue)
		if err := cs.RecvMsg(out); err != nil {
			st := status.Convert(err)
			got = append(got, st.Code().String()+" "+strings.Join(details(st)[:1], ""))
			break
		}
		got = append(got, out.GetValue())
	}
	// the start took one unit, messages 0 and 1 the others
	want := []string{"0", "1", "ResourceExhausted RetryInfo 1m0s"}
	if !slices.Equal(got, want) {
		t.Errorf("stream %q, want %q", got, want)
	}
	// the next stream is denied when it starts
	cs, err = cc.NewStream(context.Background(), desc, chatMethod)
	if err == nil {
		err = cs.RecvMsg(new(wrapperspb.StringValue))
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second stream: %v, want ResourceExhausted", err)
	}
}

// TestNewRefusesInvalidRules: an invalid rule is refused when the
// interceptors are built.
func TestNewRefusesInvalidRules(t *testing.T) {
	l := core.NewMemory()
	for _, tc := range []struct {
		name string
		l    *core.Limiter
		rule grpcmw.Rule
	}{
		{"nil limiter", nil, grpcmw.Rule{Name: "a", Limits: []core.Limit{core.PerMinute(1)}}},
		{"no limits", l, grpcmw.Rule{Name: "a"}},
		{"bad name", l, grpcmw.Rule{Name: "a:b", Limits: []core.Limit{core.PerMinute(1)}}},
		{"bad limit", l, grpcmw.Rule{Name: "a", Limits: []core.Limit{{Count: 0, Window: time.Second}}}},
		// its messages' charges could never be given back by the stream's status
		{"PerMessage with CountIf", l, grpcmw.Rule{Name: "a", Limits: []core.Limit{core.PerMinute(1)}, PerMessage: true,
			CountIf: func(c codes.Code) bool { return c != codes.OK }}},
	} {
		if _, err := grpcmw.New(tc.l, tc.rule); !errors.Is(err, core.ErrInvalidRule) {
			t.Errorf("%s: New() = %v, want ErrInvalidRule", tc.name, err)
		}
		if tc.rule.PerMessage {
			continue // a client rule has no such field
		}
		if _, err := grpcmw.NewClient(tc.l, grpcmw.ClientRule{Name: tc.rule.Name, Limits: tc.rule.Limits}); !errors.Is(err, core.ErrInvalidRule) {
			t.Errorf("%s: NewClient() = %v, want ErrInvalidRule", tc.name, err)
		}
	}
}

// TestNewRefusesBadDomain: a Domain that is not UTF-8 (no ErrorInfo can
// carry it) is an invalid rule, not a panic.
func TestNewRefusesBadDomain(t *testing.T) {
	_, err := grpcmw.New(core.NewMemory(), grpcmw.Rule{Name: "a", Limits: []core.Limit{core.PerMinute(1)}, Domain: "\xff"})
	if !errors.Is(err, core.ErrInvalidRule) {
		t.Fatalf("New() = %v, want ErrInvalidRule", err)
	}
}

// TestCountIfContextError: CountIf sees the code grpc-go sends for a
// handler's context error (DeadlineExceeded, Canceled), not Unknown.
func TestCountIfContextError(t *testing.T) {
	l := core.NewMemory()
	var seen []codes.Code
	i := mustNew(t, l, grpcmw.Rule{Name: "slow", Limits: []core.Limit{core.PerMinute(5)},
		Key:     func(grpcmw.Call) (string, error) { return "k", nil },
		CountIf: func(c codes.Code) bool { seen = append(seen, c); return c != codes.DeadlineExceeded }})
	late := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, context.DeadlineExceeded
	}
	cc, _ := serve(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(i.Unary(), late)})
	if _, err := say(context.Background(), cc, "x"); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call: %v, want DeadlineExceeded", err)
	}
	if !slices.Equal(seen, []codes.Code{codes.DeadlineExceeded}) {
		t.Fatalf("CountIf saw %v, want [DeadlineExceeded]", seen)
	}
	if r, err := l.Peek(context.Background(), "slow:k", core.PerMinute(5)); err != nil || r.Remaining != 5 {
		t.Fatalf("the rule keeps %d of 5 (%v), want 5: the timed-out call was counted", r.Remaining, err)
	}
}

// peerAddr is a net.Addr of any string, such as a Unix socket's.
type peerAddr string

func (a peerAddr) Network() string { return "unix" }
func (a peerAddr) String() string  { return string(a) }

var _ net.Addr = peerAddr("")

// TestStackedRules: when an inner interceptor refuses a call, the outer
// ones that charged it keep their units (the call reached them), as with
// the HTTP rules; with RefundIfStopped they give them back.
func TestStackedRules(t *testing.T) {
	l := redisLimiter(t, redistest.New(t))
	for _, refund := range []bool{false, true} {
		outer := mustNew(t, l, grpcmw.Rule{Name: fmt.Sprint("outer-", refund), Limits: []core.Limit{core.PerMinute(3)}, RefundIfStopped: refund})
		inner := mustNew(t, l, grpcmw.Rule{Name: fmt.Sprint("inner-", refund), Limits: []core.Limit{core.PerMinute(1)},
			Skip: func(c grpcmw.Call) bool { return c.Message.(*wrapperspb.StringValue).GetValue() == "free" }})
		cc, _ := serve(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(outer.Unary(), inner.Unary())})
		var got []codes.Code
		for _, m := range []string{"x", "x", "x", "x", "free", "free", "free"} {
			_, err := say(context.Background(), cc, m)
			got = append(got, status.Code(err))
		}
		// outer counts x three times, then denies
		want := []codes.Code{0, 8, 8, 8, 8, 8, 8}
		if refund { // outer: x, then free twice; the fourth of its units is refused
			want = []codes.Code{0, 8, 8, 8, 0, 0, 8}
		}
		if !slices.Equal(got, want) {
			t.Errorf("RefundIfStopped %v: codes %v, want %v", refund, got, want)
		}
	}
}

// TestStackedRefusalTrailersOnly: a call that a later rule refuses after
// an earlier one passed it is still a trailers-only response (nothing in
// its header, the refusing rule's fields in its trailer), unary or stream,
// and the earlier rule keeps its units; a call both pass carries
// both rules' fields in its header.
func TestStackedRefusalTrailersOnly(t *testing.T) {
	l := core.NewMemory()
	peerLimit := core.PerMinute(100)
	a := mustNew(t, l, grpcmw.Rule{Name: "peer", Limits: []core.Limit{peerLimit}})
	b := mustNew(t, l, grpcmw.Rule{Name: "user", Limits: []core.Limit{core.PerMinute(1)}, Key: grpcmw.Metadata("x-user"), Pushback: true})
	cc, _ := serve(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(a.Unary(), b.Unary()), grpc.ChainStreamInterceptor(a.Stream(), b.Stream())})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "u1")
	var hdr metadata.MD
	if _, err := say(ctx, cc, "x", grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get("x-ratelimit-limit"); !slices.Equal(got, []string{"100", "1"}) {
		t.Fatalf("a call both rules passed: x-ratelimit-limit %v, want both rules' [100 1]", got)
	}
	var tr metadata.MD
	hdr = nil
	_, err := say(ctx, cc, "x", grpc.Header(&hdr), grpc.Trailer(&tr))
	if status.Code(err) != codes.ResourceExhausted || len(hdr) != 0 || !slices.Equal(tr.Get("x-ratelimit-limit"), []string{"1"}) {
		t.Fatalf("unary, refused by the second rule: %v, header %v, trailer %v; want RESOURCE_EXHAUSTED, no header, the refusing rule's fields", err, hdr, tr)
	}
	cs, err := cc.NewStream(ctx, &echoDesc.Streams[0], chatMethod)
	if err != nil {
		t.Fatal(err)
	}
	err = cs.RecvMsg(new(wrapperspb.StringValue))
	h, _ := cs.Header()
	if status.Code(err) != codes.ResourceExhausted || len(h) != 0 {
		t.Fatalf("stream, refused by the second rule: %v, header %v; want RESOURCE_EXHAUSTED and no header", err, h)
	}
	if r, err := l.Peek(context.Background(), "peer:ip:127.0.0.1", peerLimit); err != nil || r.Remaining != 97 {
		t.Fatalf("the first rule keeps %d of 100 (%v), want 97: every call reached it", r.Remaining, err)
	}
}

// chat sends up to n messages on a new Chat stream of cc, each echoed
// back, and returns the stream and the error that ended it (nil: none).
func chat(t *testing.T, cc *grpc.ClientConn, n int) (grpc.ClientStream, error) {
	t.Helper()
	cs, err := cc.NewStream(context.Background(), &echoDesc.Streams[0], chatMethod)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := cs.SendMsg(wrapperspb.String("m")); err != nil {
			break
		}
		if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
			return cs, err
		}
	}
	return cs, nil
}

// TestPerMessageStacked: with Rule.PerMessage on two chained rules, a
// message the second refuses stays counted by the first, and a stream's
// header carries its start's fields once, not a set a message.
func TestPerMessageStacked(t *testing.T) {
	l := core.NewMemory()
	limA, limB := core.PerMinute(100), core.PerMinute(3)
	a := mustNew(t, l, grpcmw.Rule{Name: "a", Limits: []core.Limit{limA}, Key: grpcmw.Method(), PerMessage: true})
	b := mustNew(t, l, grpcmw.Rule{Name: "b", Limits: []core.Limit{limB}, Key: grpcmw.Method(), PerMessage: true})
	cc, _ := serve(t, []grpc.ServerOption{grpc.ChainStreamInterceptor(a.Stream(), b.Stream())})
	cs, ended := chat(t, cc, 5)
	if status.Code(ended) != codes.ResourceExhausted {
		t.Fatalf("the stream ended with %v, want the third message refused", ended)
	}
	h, _ := cs.Header()
	if got := h.Get("x-ratelimit-remaining"); !slices.Equal(got, []string{"99", "2"}) {
		t.Fatalf("header x-ratelimit-remaining %v, want the start's of each rule [99 2]", got)
	}
	// b admitted the start and two messages; a the same three and the refused one
	if r, err := l.Peek(context.Background(), "a:method:"+chatMethod, limA); err != nil || r.Remaining != 96 {
		t.Fatalf("rule a keeps %d of 100 (%v), want 96", r.Remaining, err)
	}
}

// TestPerMessageAfterStreamRule: behind a rule that decides only a
// stream's start, a PerMessage rule's refused message gives back nothing
// of the messages before it (each message's charges are its own).
func TestPerMessageAfterStreamRule(t *testing.T) {
	l := core.NewMemory()
	limM := core.PerMinute(4)
	s := mustNew(t, l, grpcmw.Rule{Name: "s", Limits: []core.Limit{core.PerMinute(100)}, Key: grpcmw.Method()})
	m := mustNew(t, l, grpcmw.Rule{Name: "m", Limits: []core.Limit{limM}, Key: grpcmw.Method(), PerMessage: true})
	cc, _ := serve(t, []grpc.ServerOption{grpc.ChainStreamInterceptor(s.Stream(), m.Stream())})
	if _, ended := chat(t, cc, 10); status.Code(ended) != codes.ResourceExhausted {
		t.Fatalf("the stream ended with %v, want the fourth message refused", ended)
	}
	// m admitted the start and three messages: 4 of 4 used
	if r, err := l.Peek(context.Background(), "m:method:"+chatMethod, limM); err != nil || r.Remaining != 0 {
		t.Fatalf("rule m keeps %d of 4 (%v), want 0", r.Remaining, err)
	}
}

// TestStreamHeaderByContext: a stream handler that sends its header with
// grpc.SendHeader(stream.Context(), md) sends the rule's fields with it.
func TestStreamHeaderByContext(t *testing.T) {
	i := mustNew(t, core.NewMemory(), grpcmw.Rule{Name: "r", Limits: []core.Limit{core.PerMinute(10)}, Key: grpcmw.Method()})
	desc := grpc.ServiceDesc{ServiceName: "test.Hdr", HandlerType: (*echoService)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Chat", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				if err := grpc.SendHeader(stream.Context(), metadata.Pairs("x-app", "1")); err != nil {
					return err
				}
				in := new(wrapperspb.StringValue)
				if err := stream.RecvMsg(in); err != nil {
					return err
				}
				return stream.SendMsg(in)
			}}}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ChainStreamInterceptor(i.Stream()))
	s.RegisterService(&desc, struct{}{})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	cs, err := dial(t, lis.Addr().String()).NewStream(context.Background(), &desc.Streams[0], "/test.Hdr/Chat")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.String("m")); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
		t.Fatal(err)
	}
	h, _ := cs.Header()
	if !slices.Equal(h.Get("x-app"), []string{"1"}) || !slices.Equal(h.Get("x-ratelimit-limit"), []string{"10"}) {
		t.Fatalf("header %v, want the handler's x-app and the rule's fields", h)
	}
}

// TestRetryDelayPushback: the pushback trailer's delay without RetryInfo:
// whole milliseconds, at most core.MaxBlock (a value too large for an
// int64 too: an upstream asking for longer than any block gets the
// longest, not none); a negative or malformed one names no delay.
func TestRetryDelayPushback(t *testing.T) {
	st := status.New(codes.ResourceExhausted, "no")
	for _, c := range []struct {
		pushback string
		d        time.Duration
		ok       bool
	}{
		{"1500", 1500 * time.Millisecond, true},
		{"0", 0, true},
		{"99999999999", core.MaxBlock, true},
		{"99999999999999999999", core.MaxBlock, true},
		{"-1", 0, false},
		{"-99999999999999999999", 0, false},
		{"1.5", 0, false},
		{"", 0, false},
	} {
		d, ok := grpcmw.RetryDelay(st, metadata.Pairs(grpcmw.PushbackTrailer, c.pushback))
		if d != c.d || ok != c.ok {
			t.Errorf("pushback %q: %v %v, want %v %v", c.pushback, d, ok, c.d, c.ok)
		}
	}
}

// TestDenialNamesBindingPolicy: the details of a denial by several
// policies name the one that binds (ErrorInfo's policy, the violation with
// QuotaValue), also when the same policies denied earlier with another
// binding: the first a 12/h (59m30s), the second a 10/min (55s).
func TestDenialNamesBindingPolicy(t *testing.T) {
	clock := &fixedClock{now: time.Unix(1_800_000_000, 0)}
	l := core.NewMemory(core.WithClock(clock.Now))
	cc, _ := serveRule(t, l, grpcmw.Rule{Name: "b", Limits: []core.Limit{core.PerMinute(10), core.PerHour(12)},
		Key: func(grpcmw.Call) (string, error) { return "k", nil },
		Cost: func(c grpcmw.Call) int64 {
			n, _ := strconv.Atoi(c.Message.(*wrapperspb.StringValue).GetValue())
			return int64(n)
		}})
	for _, step := range []struct {
		after  time.Duration
		cost   int
		policy string // the binding policy of a denial; "": allowed
	}{
		{0, 10, ""},
		{30 * time.Second, 6, "12-per-1h"},
		{2 * time.Hour, 7, ""},
		{59*time.Minute + 50*time.Second, 5, ""},
		{5 * time.Second, 6, "10-per-1m"},
	} {
		clock.Advance(step.after)
		_, err := say(context.Background(), cc, strconv.Itoa(step.cost))
		if step.policy == "" {
			if err != nil {
				t.Fatalf("cost %d: %v, want allowed", step.cost, err)
			}
			continue
		}
		var policy string
		var quota []string
		for _, d := range status.Convert(err).Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				policy = d.GetMetadata()["policy"]
			case *errdetails.QuotaFailure:
				for _, v := range d.GetViolations() {
					if v.GetQuotaValue() != 0 {
						quota = append(quota, v.GetQuotaId())
					}
				}
			}
		}
		if policy != step.policy || len(quota) != 1 || quota[0] != step.policy {
			t.Errorf("cost %d: ErrorInfo policy %q, QuotaValue on %q; want %q on both (%v)", step.cost, policy, quota, step.policy, err)
		}
	}
}

// TestClientRetryWaitsWhenBlockFails: a RESOURCE_EXHAUSTED's block
// (DefaultBlock here) is waited out before the retry when the Block that
// tells every replica fails (Redis down, or its client closed at
// shutdown): the retries went at once, 4 calls in 2ms.
func TestClientRetryWaitsWhenBlockFails(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.New(t).Addr})
	l, err := core.New(rdb) // FailOpen: every Wait passes while Redis is gone
	if err != nil {
		t.Fatal(err)
	}
	rdb.Close()
	ci, err := grpcmw.NewClient(l, grpcmw.ClientRule{Name: "out", Limits: []core.Limit{core.PerSecond(100)},
		MaxRetries: 1, DefaultBlock: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cc, e := serve(t, nil, grpc.WithUnaryInterceptor(ci.Unary()))
	if _, err := say(context.Background(), cc, "code:8"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("%v, want the upstream's RESOURCE_EXHAUSTED", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.arrivals) != 2 {
		t.Fatalf("%d calls, want 2", len(e.arrivals))
	}
	if gap := e.arrivals[1].Sub(e.arrivals[0]); gap < 500*time.Millisecond {
		t.Fatalf("the retry went %s after the refusal, inside its 500ms block", gap)
	}
}

// TestClientTinyRetryInfo: an upstream's RetryInfo below 1µs (1ns) counts
// as none: the key is blocked for DefaultBlock and the call goes again
// after it (Block refused 1ns, and the call ended at once).
func TestClientTinyRetryInfo(t *testing.T) {
	var refusals []time.Duration
	l := core.NewMemory(core.WithObserver(func(ev core.Event) {
		if ev.Op == core.OpRefused {
			refusals = append(refusals, ev.Result.RetryAfter)
		}
	}))
	var calls atomic.Int64
	tiny := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if calls.Add(1) == 1 {
			st, _ := status.New(codes.ResourceExhausted, "slow down").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Nanosecond)})
			return nil, st.Err()
		}
		return handler(ctx, req)
	}
	ci, err := grpcmw.NewClient(l, grpcmw.ClientRule{Name: "out", Limits: []core.Limit{core.PerSecond(100)},
		MaxRetries: 1, DefaultBlock: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cc, _ := serve(t, []grpc.ServerOption{grpc.UnaryInterceptor(tiny)}, grpc.WithUnaryInterceptor(ci.Unary()))
	began := time.Now()
	if _, err := say(context.Background(), cc, "x"); err != nil {
		t.Fatalf("%v, want the retry to pass", err)
	}
	if calls.Load() != 2 || len(refusals) != 1 || refusals[0] != 200*time.Millisecond {
		t.Fatalf("%d calls, blocks %v; want 2 calls and one block of DefaultBlock (200ms)", calls.Load(), refusals)
	}
	if took := time.Since(began); took < 200*time.Millisecond {
		t.Fatalf("the retry went after %s, inside the 200ms block", took)
	}
}

// TestFailedLogins: a rule counting codes.Unauthenticated (3 a minute)
// admits exactly 3 failed logins of 20 from a grpc-go client; the calls
// that succeed are not counted.
func TestFailedLogins(t *testing.T) {
	l := redisLimiter(t, redistest.New(t))
	cc, e := serveRule(t, l, grpcmw.Rule{Name: "login", Limits: []core.Limit{core.PerMinute(3)},
		CountIf: func(c codes.Code) bool { return c == codes.Unauthenticated }})
	for i := range 5 {
		if _, err := say(context.Background(), cc, "right"); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	got := map[codes.Code]int{}
	for range 20 {
		_, err := say(context.Background(), cc, "code:16")
		got[status.Code(err)]++
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.arrivals) != 5+3 || got[codes.Unauthenticated] != 3 || got[codes.ResourceExhausted] != 17 {
		t.Fatalf("20 failed logins reached the handler %d times (codes %v), want 3", len(e.arrivals)-5, got)
	}
}
