package grpcmw

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/margin"
)

// OutboundCall is an outgoing call as a client rule's functions read it.
type OutboundCall struct {
	// Context is the call's context.
	Context context.Context
	// Method is the full method, "/package.Service/Method".
	Method string
	// Target is the target of the connection (grpc.ClientConn.Target).
	Target string
}

// ClientRule describes the quota that outbound calls share across every
// replica, and how to obey an upstream's refusals.
type ClientRule struct {
	// Name is the rule's namespace (see Rule.Name). Required.
	Name string
	// Limits must all admit a call before it is sent (at least one).
	Limits []core.Limit
	// Key returns the quota a call takes from. Default: the connection's
	// target, "target:" + Target, so every upstream has its own quota.
	Key func(OutboundCall) (string, error)
	// Cost returns the units a call takes. Default 1.
	Cost func(OutboundCall) int64
	// Skip reports calls sent without waiting or counting.
	Skip func(OutboundCall) bool
	// OnWait, when set, is called with each counted call and the time it
	// waited for the Limiter, just before it is sent.
	OnWait func(OutboundCall, time.Duration)
	// MaxRetries is how many times a unary call refused with
	// RESOURCE_EXHAUSTED is sent again. Zero means DefaultMaxRetries; a
	// negative value turns retrying off.
	MaxRetries int
	// MaxBlock caps the time an upstream's refusal blocks the key. Zero
	// means DefaultMaxBlock.
	MaxBlock time.Duration
	// DefaultBlock is how long a refusal without RetryInfo or pushback
	// blocks the key. Zero means DefaultRefusalBlock.
	DefaultBlock time.Duration
	// Margin widens each limit's Window, so that calls sent a window
	// apart still arrive a window apart (see nethttp.Transport). Zero
	// means 1% of each window, at least 50ms but at most a tenth of it;
	// a negative value, none.
	Margin time.Duration
}

// Defaults of ClientRule's fields: core.Outbound's, as nethttp.Transport's.
const (
	DefaultMaxRetries   = core.DefaultMaxRetries
	DefaultMaxBlock     = core.DefaultMaxBlock
	DefaultRefusalBlock = core.DefaultRefusalBlock
)

// ClientInterceptors throttles outbound calls: each waits for its slot
// under the rule's limits (core.Limiter.Wait: one round trip reserves the
// earliest slot across all replicas, then the call sleeps until then) and
// is never dropped: it fails without being sent only when its context
// ends first (CANCELED or DEADLINE_EXCEEDED), or when the slot lies past
// its deadline (DEADLINE_EXCEEDED wrapping core.ErrWaitExceedsDeadline, at
// once, nothing counted); a cost above a limit's Count fails with
// RESOURCE_EXHAUSTED wrapping core.ErrNeverFits, and a Limiter that fails
// closed while Redis is down with UNAVAILABLE. When the
// upstream refuses a call (RESOURCE_EXHAUSTED), the key is blocked on every
// replica for the delay the upstream asked for (RetryInfo, else the
// grpc-retry-pushback-ms trailer, else DefaultBlock; at most MaxBlock; an
// UNAVAILABLE with RetryInfo or pushback too, as a 503 with Retry-After is
// for nethttp.Transport), and a unary call goes again, up to MaxRetries times, waiting for its slot
// like any other; when the next slot lies past the caller's deadline, the
// caller gets the upstream's refusal. A refusal that names no delay and
// asks not to be retried (a negative pushback, grpcmw's answer to a call
// that can never pass) goes to the caller at once and blocks nothing.
// When Redis fails, the Limiter's failure mode decides (see
// nethttp.Transport).
type ClientInterceptors struct {
	rule ClientRule
	d    *core.Decider[OutboundCall]
}

// NewClient returns the client interceptors of rule, or the error of an
// invalid rule or a nil Limiter.
func NewClient(l *core.Limiter, rule ClientRule) (*ClientInterceptors, error) {
	if rule.Key == nil {
		rule.Key = func(c OutboundCall) (string, error) { return "target:" + c.Target, nil }
	}
	p := core.Policy[OutboundCall]{Name: rule.Name, Limits: margin.Widen(rule.Limits, rule.Margin), Key: rule.Key, Cost: rule.Cost}
	d, err := core.NewDecider(l, p)
	if err != nil {
		return nil, fmt.Errorf("%w (grpcmw client)", err)
	}
	return &ClientInterceptors{rule: rule, d: d}, nil
}

// prepare returns c's key and cost, or the error that stops the call.
func (ci *ClientInterceptors) prepare(c OutboundCall) (key string, n int64, err error) {
	if key, err = ci.d.Key(c); err != nil {
		return "", 0, ci.failed(c, fmt.Errorf("key: %w", err), codes.Unknown)
	}
	if n, err = ci.d.Cost(c); err != nil {
		return "", 0, ci.failed(c, err, codes.Unknown)
	}
	return key, n, nil
}

// failed returns the error of call c that the interceptors stopped unsent:
// err, named after the rule, with the gRPC status code of its cause (the
// call's context ending, ...), else code.
func (ci *ClientInterceptors) failed(c OutboundCall, err error, code codes.Code) error {
	err = fmt.Errorf("ratewindow: grpcmw client rule %q: %w", ci.rule.Name, err)
	switch {
	case c.Context.Err() != nil: // not a Redis timeout's DeadlineExceeded
		code = status.FromContextError(c.Context.Err()).Code()
	case errors.Is(err, core.ErrWaitExceedsDeadline):
		code = codes.DeadlineExceeded
	case errors.Is(err, core.ErrNeverFits):
		code = codes.ResourceExhausted
	case errors.Is(err, core.ErrInvalidCost):
		code = codes.InvalidArgument
	}
	return callError{err, code}
}

// callError is an error of the client interceptors with its gRPC status
// code (status.Code reads it, as it reads grpc-go's own errors), wrapping
// the cause (errors.Is finds core.ErrWaitExceedsDeadline, a context's
// error, ...).
type callError struct {
	err  error
	code codes.Code
}

func (e callError) Error() string              { return e.err.Error() }
func (e callError) Unwrap() error              { return e.err }
func (e callError) GRPCStatus() *status.Status { return status.New(e.code, e.err.Error()) }

// Unary returns the unary client interceptor.
func (ci *ClientInterceptors) Unary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		c := OutboundCall{Context: ctx, Method: method, Target: cc.Target()}
		if ci.rule.Skip != nil && ci.rule.Skip(c) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		key, n, err := ci.prepare(c)
		if err != nil {
			return err
		}
		var trailer metadata.MD
		opts = append(opts[:len(opts):len(opts)], grpc.Trailer(&trailer))
		var last error // the call's answer: the next attempt replaces a refusal
		err = ci.d.Throttle(ctx, key, n, ci.outbound(), func(_ int, waited time.Duration) (core.Upstream, error) {
			if ci.rule.OnWait != nil {
				ci.rule.OnWait(c, waited)
			}
			trailer = nil
			last = invoker(ctx, method, req, reply, cc, opts...)
			return refusal(last, trailer), nil
		})
		if err != nil {
			return ci.failed(c, err, codes.Unavailable) // else: the Limiter failed
		}
		return last
	}
}

// Stream returns the stream client interceptor: a stream waits for its
// slot before it starts; a stream the upstream refuses (RESOURCE_EXHAUSTED
// when it starts or on a message) blocks the key, and is not sent again.
func (ci *ClientInterceptors) Stream() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		c := OutboundCall{Context: ctx, Method: method, Target: cc.Target()}
		if ci.rule.Skip != nil && ci.rule.Skip(c) {
			return streamer(ctx, desc, cc, method, opts...)
		}
		key, n, err := ci.prepare(c)
		if err != nil {
			return nil, err
		}
		var cs grpc.ClientStream
		var serr error // the stream's
		o := ci.outbound()
		o.MaxRetries = -1 // a stream is not sent again
		err = ci.d.Throttle(ctx, key, n, o, func(_ int, waited time.Duration) (core.Upstream, error) {
			if ci.rule.OnWait != nil {
				ci.rule.OnWait(c, waited)
			}
			cs, serr = streamer(ctx, desc, cc, method, opts...)
			return refusal(serr, nil), nil
		})
		switch {
		case err != nil:
			return nil, ci.failed(c, err, codes.Unavailable) // else: the Limiter failed
		case serr != nil:
			return nil, serr
		}
		return &obeyingStream{ClientStream: cs, ci: ci, key: key}, nil
	}
}

// outbound returns the rule's core.Outbound.
func (ci *ClientInterceptors) outbound() core.Outbound {
	return core.Outbound{MaxRetries: ci.rule.MaxRetries, MaxBlock: ci.rule.MaxBlock, DefaultBlock: ci.rule.DefaultBlock}
}

// obeyingStream blocks its key when the upstream ends it with
// RESOURCE_EXHAUSTED.
type obeyingStream struct {
	grpc.ClientStream
	ci  *ClientInterceptors
	key string
}

// RecvMsg receives m; a refusal blocks the stream's key.
func (s *obeyingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if up := refusal(err, s.Trailer()); up.Refused {
		_ = s.ci.d.Refused(context.WithoutCancel(s.Context()), s.key, s.ci.outbound().Block(up.Delay), false)
	}
	return err
}

// refusal reads a call's error: refused for RESOURCE_EXHAUSTED, or
// UNAVAILABLE with a delay (as nethttp.Transport reads a 503 with
// Retry-After: an upstream's limiter that could not decide), with the
// delay of its RetryInfo, else of the pushback trailer (core.Outbound
// applies DefaultBlock and MaxBlock). grpc-go's own RESOURCE_EXHAUSTED (a
// message larger than a side allows: its message starts "grpc: ") is no
// refusal: the call may have run; nor is one that names no delay and asks
// not to be retried (a negative pushback, as grpcmw's for a call whose
// cost exceeds a limit).
func refusal(err error, trailer metadata.MD) core.Upstream {
	st, ok := status.FromError(err)
	if err == nil || !ok || strings.HasPrefix(st.Message(), "grpc: ") {
		return core.Upstream{}
	}
	d, found := RetryDelay(st, trailer)
	switch st.Code() {
	case codes.ResourceExhausted:
		if !found && noRetry(trailer) { // this call can never pass: the quota is not spent
			return core.Upstream{}
		}
	case codes.Unavailable:
		if !found {
			return core.Upstream{}
		}
	default:
		return core.Upstream{}
	}
	return core.Upstream{Refused: true, Delay: d, Final: noRetry(trailer)}
}

// noRetry reports a negative pushback: the upstream asks not to retry.
func noRetry(trailer metadata.MD) bool {
	vs := trailer.Get(PushbackTrailer)
	return len(vs) > 0 && strings.HasPrefix(vs[0], "-")
}

// RetryDelay returns the delay a status asks a client to wait: its
// google.rpc.RetryInfo, else the grpc-retry-pushback-ms trailer (a negative
// pushback means "do not retry": no delay found).
func RetryDelay(st *status.Status, trailer metadata.MD) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if err := ri.GetRetryDelay().CheckValid(); err == nil {
				return max(ri.GetRetryDelay().AsDuration(), 0), true
			}
		}
	}
	if vs := trailer.Get(PushbackTrailer); len(vs) > 0 {
		ms, err := strconv.ParseInt(vs[0], 10, 64)
		if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(vs[0], "-") {
			ms, err = math.MaxInt64, nil // more than any block: the longest
		}
		if err == nil && ms >= 0 {
			return time.Duration(min(ms, int64(core.MaxBlock/time.Millisecond))) * time.Millisecond, true
		}
	}
	return 0, false
}
