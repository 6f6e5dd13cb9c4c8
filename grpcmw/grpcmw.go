package grpcmw

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratewindow/ratewindow/core"
)

// Call is an incoming call as a rule's functions read it.
type Call struct {
	// Context is the call's context: peer.FromContext,
	// metadata.FromIncomingContext and what authentication stored.
	Context context.Context
	// Method is the full method, "/package.Service/Method".
	Method string
	// Stream reports a streaming call.
	Stream bool
	// Message is the unary call's request; for a stream charged per
	// message (Rule.PerMessage), the message just received; else nil.
	Message any
}

// KeyFunc returns the key a call is counted under: a non-empty key, or an
// error. It must be safe for concurrent use.
type KeyFunc func(Call) (string, error)

// Rule describes which calls to limit and how to answer them. Its fields
// mean what core.Rule's fields of the same names mean for HTTP requests:
// the decision is the same code (core.Decider).
type Rule struct {
	// Name is the rule's namespace: printable ASCII without spaces, ':',
	// '{' or '}', at most 64 bytes. Required.
	Name string
	// Limits must all admit a call for it to pass (at least one).
	Limits []core.Limit
	// Key returns the key a call is counted under. When it fails, the
	// error goes to OnError and the call is counted under FallbackKey.
	// Default Peer(): the peer address, trusting no proxy.
	Key KeyFunc
	// FallbackKey keys a call whose Key failed (see core.Rule.FallbackKey).
	// Default Peer().
	FallbackKey KeyFunc
	// Cost returns the units a call (or, with PerMessage, a message)
	// takes. A cost below 1 goes to OnError and the call costs 1.
	// Default 1.
	Cost func(Call) int64
	// Skip reports calls that pass uncounted, such as health checks.
	Skip func(Call) bool
	// LimitsFor chooses the limits of each call (see core.Rule.LimitsFor).
	LimitsFor func(Call) ([]core.Limit, error)
	// Headers selects the rate-limit fields, in lower case:
	// x-ratelimit-limit, x-ratelimit-remaining and x-ratelimit-reset (the
	// default), or IETF's ratelimit and ratelimit-policy, both or none. A
	// passed call carries them as header metadata; a refused one as
	// trailer metadata, with retry-after (whole seconds) whatever the
	// style, and nothing in its header: a trailers-only response, which a
	// client's retry policy may retry.
	Headers core.HeaderStyle
	// PartitionKey adds pk to the IETF fields (see core.Rule.PartitionKey).
	PartitionKey bool
	// DryRun decides and counts every call but never denies.
	DryRun bool
	// Penalty, when set, bans a key that keeps being denied.
	Penalty *core.Penalty
	// CountIf, when set, counts only the calls whose status code it
	// accepts: a call is charged before the handler, and its units are
	// given back after it when CountIf rejects the code. A handler that
	// panics counts as codes.Internal. Such a rule shows its rate-limit
	// fields only on its denials.
	CountIf func(codes.Code) bool
	// OnError is called with every error of the rule's functions and of
	// the backend; its text never reaches the client. The call is still
	// limited (fallback key, cost 1, the rule's limits, the failure
	// mode). Default: log/slog's default logger, at most one line a
	// second.
	OnError func(Call, error)
	// RefundIfStopped gives a call's units back when a later rule refuses
	// it (see core.Rule.RefundIfStopped); New refuses it with a Penalty.
	// Without it, a rule counts every call that reached it.
	RefundIfStopped bool
	// PerMessage, for streams: besides the decision when the stream
	// starts, every message received is decided as a call of its own
	// (Call.Message set, Cost sees it); a denied message ends RecvMsg
	// with the denial's status, which the handler returns. A rule with
	// CountIf cannot have it (New refuses the rule): a message is counted
	// when it arrives, before the stream's status is known.
	PerMessage bool
	// Pushback adds the grpc-retry-pushback-ms trailer to a denial (the
	// retry delay in milliseconds, gRPC A6), so that a grpc-go client's
	// retry policy waits exactly as long instead of its own backoff; -1,
	// "do not retry", when the call's cost exceeds a limit.
	Pushback bool
	// Domain is the domain of the google.rpc.ErrorInfo of a denial.
	// Default "ratewindow".
	Domain string
}

// Reasons of the google.rpc.ErrorInfo of a denial.
const (
	// ReasonRateLimited: a limit of the rule denied the call.
	ReasonRateLimited = "RATE_LIMIT_EXCEEDED"
	// ReasonBanned: the key is banned (Rule.Penalty) or blocked
	// (core.Limiter.Block).
	ReasonBanned = "KEY_BANNED"
	// ReasonUnavailable: the Limiter could not decide and fails closed,
	// or the decision was shed for overload.
	ReasonUnavailable = "RATE_LIMITER_UNAVAILABLE"
)

// PushbackTrailer is the trailer of gRPC A6 that tells a client's retry
// policy when to retry, in milliseconds.
const PushbackTrailer = "grpc-retry-pushback-ms"

// Interceptors holds a rule's server interceptors.
type Interceptors struct {
	rule   Rule
	d      *core.Decider[Call]
	parts  sync.Map // binding and denying policies → the QuotaFailure and ErrorInfo of their denial
	nparts atomic.Int64
	last   atomic.Pointer[lastDenial]
	banned *anypb.Any // the ErrorInfo of a ban
}

// New returns the interceptors of rule, or the error of an invalid rule
// (wrapping core.ErrInvalidRule) or a nil Limiter.
func New(l *core.Limiter, rule Rule) (*Interceptors, error) {
	if rule.Key == nil {
		rule.Key = Peer()
	}
	if rule.FallbackKey == nil {
		rule.FallbackKey = Peer()
	}
	switch {
	case rule.Domain == "":
		rule.Domain = "ratewindow"
	case !utf8.ValidString(rule.Domain):
		return nil, fmt.Errorf("%w %q: Domain %q is not UTF-8 (grpcmw)", core.ErrInvalidRule, rule.Name, rule.Domain)
	}
	if rule.Headers > core.None {
		return nil, fmt.Errorf("%w %q: unknown %s (grpcmw)", core.ErrInvalidRule, rule.Name, rule.Headers)
	}
	if rule.PerMessage && rule.CountIf != nil {
		return nil, fmt.Errorf("%w %q: PerMessage with CountIf: messages are counted as they arrive, before the stream's status is known; decide them in a rule without CountIf (grpcmw)", core.ErrInvalidRule, rule.Name)
	}
	rule.Limits = slices.Clone(rule.Limits)
	p := core.Policy[Call]{
		Name: rule.Name, Limits: rule.Limits, Key: rule.Key, FallbackKey: rule.FallbackKey,
		Cost: rule.Cost, Skip: rule.Skip, LimitsFor: rule.LimitsFor, Penalty: rule.Penalty,
		DryRun: rule.DryRun, PartitionKey: rule.PartitionKey, RefundIfStopped: rule.RefundIfStopped,
	}
	if countIf := rule.CountIf; countIf != nil {
		p.CountIf = func(code int) bool { return countIf(codes.Code(code)) }
	}
	if onError := rule.OnError; onError != nil {
		p.OnError = func(c Call, err error) bool { onError(c, err); return false }
	}
	d, err := core.NewDecider(l, p)
	if err != nil {
		return nil, fmt.Errorf("%w (grpcmw)", err)
	}
	i := &Interceptors{rule: rule, d: d}
	i.banned = mustAny(&errdetails.ErrorInfo{Reason: ReasonBanned, Domain: rule.Domain, Metadata: map[string]string{"rule": rule.Name}})[0]
	return i, nil
}

// Unary returns the unary server interceptor: it decides each call before
// the handler (see Rule).
func (i *Interceptors) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		call := Call{Context: ctx, Method: info.FullMethod, Message: req}
		dec := i.d.Decide(ctx, call)
		md, err := i.answer(ctx, dec, nil)
		if err != nil {
			stopEarlier(ctx, err)
			return nil, err
		}
		ctx, t := i.record(ctx, call, dec, md, false)
		if t != nil && t.Context == call.Context { // the first rule's trail: it sends the fields
			sts := grpc.ServerTransportStreamFromContext(ctx)
			if sts != nil {
				ctx = grpc.NewContextWithServerTransportStream(ctx, &headerStream{ServerTransportStream: sts, t: t})
				defer t.flush(sts.SetHeader)
			}
		}
		if i.rule.CountIf == nil {
			return handler(ctx, req)
		}
		defer i.settle(ctx, &err)
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor: it decides a stream when
// it starts, and with Rule.PerMessage each message it receives.
func (i *Interceptors) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		ctx := ss.Context()
		call := Call{Context: ctx, Method: info.FullMethod, Stream: true}
		dec := i.d.Decide(ctx, call)
		md, err := i.answer(ctx, dec, ss)
		if err != nil {
			stopEarlier(ctx, err)
			return err
		}
		ctx, t := i.record(ctx, call, dec, md, i.rule.PerMessage)
		if first := t != nil && t.Context == call.Context; first || i.rule.PerMessage {
			if sts := grpc.ServerTransportStreamFromContext(ctx); first && sts != nil { // grpc.SendHeader(ctx, md)
				ctx = grpc.NewContextWithServerTransportStream(ctx, &headerStream{ServerTransportStream: sts, t: t})
			}
			cs := &chargedStream{ServerStream: ss, ctx: ctx, t: t, first: first, i: i, method: info.FullMethod}
			if first {
				defer t.flush(ss.SetHeader)
			}
			ss = cs
		}
		if i.rule.CountIf == nil {
			return handler(srv, ss)
		}
		defer i.settle(ctx, &err)
		return handler(srv, ss)
	}
}

// trail is what the interceptors on a call's way share, in its context:
// their charges, settled as core.Rule's (core.Charges), and those of the
// message being received (Rule.PerMessage); the rate-limit fields of the rules that
// passed it, sent as header metadata once it passed them all (by the first
// rule, before the handler's header, or as it returns), so that a refused
// call's response stays trailers-only.
type trail struct {
	context.Context
	charges core.Charges[Call]
	msg     core.Charges[Call] // the charges of the message being received
	mu      sync.Mutex
	header  metadata.MD // the fields to send; nil once sent, or refused
}

// flush sends the trail's fields with set (a SetHeader), once.
func (t *trail) flush(set func(metadata.MD) error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.header != nil {
		_ = set(t.header) // fails only when the header went out
		t.header = nil
	}
}

// headerStream is a unary call's transport stream under the trail's first
// rule: a handler that sends its header sends the rules' fields with it.
type headerStream struct {
	grpc.ServerTransportStream
	t *trail
}

// SendHeader sends the trail's fields, then md.
func (s *headerStream) SendHeader(md metadata.MD) error {
	s.t.flush(s.ServerTransportStream.SetHeader)
	return s.ServerTransportStream.SendHeader(md)
}

type trailKey struct{}

// Value answers trailKey, else asks the parent.
func (t *trail) Value(key any) any {
	if key == (trailKey{}) {
		return t
	}
	return t.Context.Value(key)
}

// record adds a passed call's charge and fields md to its trail, made
// when the call needs one (a charge, fields, or always), and returns the
// context and the trail (nil: none).
func (i *Interceptors) record(ctx context.Context, call Call, dec core.Decision, md metadata.MD, always bool) (context.Context, *trail) {
	t, _ := ctx.Value(trailKey{}).(*trail)
	if t == nil && (dec.Charged() || md != nil || always) {
		t = &trail{Context: ctx}
		ctx = t
	}
	if md != nil {
		t.mu.Lock()
		t.header = metadata.Join(t.header, md)
		t.mu.Unlock()
	}
	if t != nil {
		t.charges.Add(i.d, call, dec)
	}
	return ctx, t
}

// stopEarlier settles the charges of the interceptors before this one,
// which refused the call with err (core.Charges.Stop), and drops their
// fields.
func stopEarlier(ctx context.Context, err error) {
	t, _ := ctx.Value(trailKey{}).(*trail)
	if t == nil {
		return
	}
	t.mu.Lock()
	t.header = nil
	t.mu.Unlock()
	t.charges.Stop(ctx, int(status.Code(err)))
}

// settle settles the rule's charge of the call by its code (CountIf); a
// handler that panics counts as codes.Internal, and the panic goes on.
func (i *Interceptors) settle(ctx context.Context, err *error) {
	code := codes.Internal
	if r := recover(); r != nil {
		defer panic(r)
	} else {
		code = statusCode(*err)
	}
	if t, _ := ctx.Value(trailKey{}).(*trail); t != nil {
		t.charges.Settle(ctx, i.d, int(code))
	}
}

// statusCode is the code a handler's error goes out with, as grpc-go
// sends it: a status's, a context error's (DeadlineExceeded, Canceled),
// else Unknown.
func statusCode(err error) codes.Code {
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return status.FromContextError(err).Code()
}

// chargedStream carries the call's trail in its context, and with
// Rule.PerMessage decides every message it receives.
type chargedStream struct {
	grpc.ServerStream
	ctx    context.Context // with the call's trail
	t      *trail          // nil: none
	first  bool            // the trail's first rule: it sends the fields
	i      *Interceptors
	method string
}

// Context returns the stream's context, with the call's trail.
func (s *chargedStream) Context() context.Context { return s.ctx }

// SendHeader sends the rules' fields (see trail) with md.
func (s *chargedStream) SendHeader(md metadata.MD) error {
	if s.first {
		s.t.flush(s.ServerStream.SetHeader)
	}
	return s.ServerStream.SendHeader(md)
}

// SendMsg sends m after the rules' fields, if not sent yet.
func (s *chargedStream) SendMsg(m any) error {
	if s.first {
		s.t.flush(s.ServerStream.SetHeader)
	}
	return s.ServerStream.SendMsg(m)
}

// RecvMsg receives m, then decides it with Rule.PerMessage: a refusal is
// returned as an error, and the rules before this one settle what they
// charged m (core.Charges.Stop). A message's fields are not sent: the header shows the
// stream's.
func (s *chargedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.first { // a new message: the first rule's stream receives it first
		s.t.msg = core.Charges[Call]{}
	}
	if !s.i.rule.PerMessage {
		return nil
	}
	ctx := s.Context()
	call := Call{Context: ctx, Method: s.method, Stream: true, Message: m}
	dec := s.i.d.Decide(ctx, call)
	if _, err := s.i.answer(ctx, dec, s.ServerStream); err != nil {
		s.t.msg.Stop(ctx, int(status.Code(err)))
		s.t.msg = core.Charges[Call]{}
		return err
	}
	s.t.msg.Add(s.i.d, call, dec)
	return nil
}

// answer returns a passed decision's rate-limit fields (nil: none), or
// sends a refused one's (on ss for a stream, else with grpc.SetTrailer)
// and returns the status error of a denial or of Unavailable. A refused
// call's fields go out as trailer metadata, with nothing in its header: a
// trailers-only response, the only kind a client's retry policy retries
// (gRPC A6).
func (i *Interceptors) answer(ctx context.Context, dec core.Decision, ss grpc.ServerStream) (metadata.MD, error) {
	refused := dec.Verdict == core.Denied || dec.Verdict == core.Unavailable
	show := dec.Shown && i.rule.Headers != core.None && (i.rule.CountIf == nil || refused)
	if !show && !refused {
		return nil, nil
	}
	style := i.rule.Headers
	if !show {
		style = core.None
	}
	md := make(metadata.MD, 7)
	i.d.SetFields(http.Header(md), style, dec)
	for k, v := range md {
		if lk := lowerField(k); lk != k {
			delete(md, k)
			md[lk] = v
		}
	}
	if dec.Verdict == core.Denied && i.rule.Pushback {
		ms := int64(-1) // "do not retry": the call can never pass
		if d := retryDelay(dec.Result); d >= 0 {
			ms = d.Milliseconds()
		}
		md[PushbackTrailer] = []string{strconv.FormatInt(ms, 10)}
	}
	switch {
	case !refused:
		return md, nil
	case ss != nil:
		ss.SetTrailer(md)
	default:
		_ = grpc.SetTrailer(ctx, md)
	}
	if dec.Verdict == core.Denied {
		return nil, i.denial(dec)
	}
	return nil, unavailable(i.rule.Domain, i.rule.Name)
}

// denial returns the RESOURCE_EXHAUSTED status of a denial, with its
// details: RetryInfo (none when the call can never pass), QuotaFailure
// (the rule and the policies that denied, never the key) and ErrorInfo.
// The details but RetryInfo are kept ready per policy, RetryInfo is in
// whole milliseconds, rounded up, as the pushback.
func (i *Interceptors) denial(dec core.Decision) error {
	res := dec.Result
	retry := retryDelay(res)
	key := ""
	if !dec.Banned() {
		switch policies := dec.Policies(); len(policies) {
		case 0:
		case 1:
			key = policies[0]
		default: // the details name the binding one
			key = res.Limit.PolicyName() + "\x00" + strings.Join(policies, "\n")
		}
	}
	// a flood of one key is refused many times a millisecond: with the
	// same delay, the same error
	if last := i.last.Load(); last != nil && last.key == key && last.retry == retry && last.banned == dec.Banned() {
		return last.err
	}
	sp := &spb.Status{Code: int32(codes.ResourceExhausted), Message: "rate limit exceeded", Details: make([]*anypb.Any, 0, 3)}
	if retry >= 0 {
		if a, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
			sp.Details = append(sp.Details, a)
		}
	}
	if dec.Banned() {
		sp.Message = "too many requests denied: banned"
		sp.Details = append(sp.Details, i.banned)
	} else {
		parts, ok := i.parts.Load(key)
		if !ok {
			parts = i.denialParts(res.Limit, dec.Policies())
			if i.nparts.Add(1) <= maxDenialParts {
				parts, _ = i.parts.LoadOrStore(key, parts)
			}
		}
		sp.Details = append(sp.Details, parts.([]*anypb.Any)...)
	}
	err := status.FromProto(sp).Err()
	i.last.Store(&lastDenial{key: key, retry: retry, banned: dec.Banned(), err: err})
	return err
}

// lastDenial is the status error of the last denial, answered again to a
// denial with the same policies and delay.
type lastDenial struct {
	key    string
	retry  time.Duration
	banned bool
	err    error
}

// retryDelay returns a denial's retry delay in whole milliseconds, rounded
// up (never sooner than it passes), or -1 when it can never pass.
func retryDelay(res core.Result) time.Duration {
	if res.Never() {
		return -1
	}
	return (res.RetryAfter + time.Millisecond - 1).Truncate(time.Millisecond)
}

// maxDenialParts bounds the details kept ready (one per set of policies
// denying together, LimitsFor's included); beyond, they are built anew.
const maxDenialParts = 1024

// denialParts returns the QuotaFailure and ErrorInfo of a denial by
// policies, binding the binding one.
func (i *Interceptors) denialParts(binding core.Limit, policies []string) []*anypb.Any {
	var q errdetails.QuotaFailure
	for _, p := range policies {
		v := &errdetails.QuotaFailure_Violation{Subject: "rule:" + i.rule.Name, QuotaId: p, Description: "policy " + p + " of rule " + i.rule.Name}
		if p == binding.PolicyName() {
			v.QuotaValue = binding.Count
		}
		q.Violations = append(q.Violations, v)
	}
	info := &errdetails.ErrorInfo{Reason: ReasonRateLimited, Domain: i.rule.Domain,
		Metadata: map[string]string{"rule": i.rule.Name, "policy": binding.PolicyName()}}
	return mustAny(&q, info)
}

// mustAny packs well-formed messages, which cannot fail.
func mustAny(ms ...proto.Message) []*anypb.Any {
	out := make([]*anypb.Any, 0, len(ms))
	for _, m := range ms {
		if a, err := anypb.New(m); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// unavailable returns the UNAVAILABLE status of a Limiter that could not
// decide, with a RetryInfo of a second.
func unavailable(domain, rule string) error {
	st := status.New(codes.Unavailable, "rate limiter unavailable")
	return withDetails(st, []protoadapt.MessageV1{
		&errdetails.RetryInfo{RetryDelay: durationpb.New(unavailableRetry)},
		&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: domain, Metadata: map[string]string{"rule": rule}},
	})
}

// unavailableRetry is the retry delay of UNAVAILABLE, as HTTP's
// Retry-After: 1.
const unavailableRetry = time.Second

// withDetails returns st with details as an error. The details are
// well-formed messages: WithDetails cannot fail on them.
func withDetails(st *status.Status, details []protoadapt.MessageV1) error {
	if s, err := st.WithDetails(details...); err == nil {
		st = s
	}
	return st.Err()
}

// lowerField returns the metadata key of a field SetFields writes: its
// name in lower case, without allocating for the known names.
func lowerField(k string) string {
	switch k {
	case "X-Ratelimit-Limit":
		return "x-ratelimit-limit"
	case "X-Ratelimit-Remaining":
		return "x-ratelimit-remaining"
	case "X-Ratelimit-Reset":
		return "x-ratelimit-reset"
	case "Ratelimit":
		return "ratelimit"
	case "Ratelimit-Policy":
		return "ratelimit-policy"
	case "Retry-After":
		return "retry-after"
	}
	return strings.ToLower(k)
}
