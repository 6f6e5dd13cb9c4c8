package connectmw

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/must"
)

// Option configures the middleware of New and Limit. Build one with the
// With functions.
type Option struct{ apply func(*options) }

type options struct {
	ew     *connect.ErrorWriter
	strict bool // ew is the default, which requires the Connect protocol version
}

// WithErrorWriter sets the ErrorWriter that tells Connect, gRPC and
// gRPC-Web requests from the others (ErrorWriter.IsSupported) and writes
// their errors. Build it with the HandlerOptions of the Connect handlers
// behind the middleware (their codecs).
//
// The default, connect.NewErrorWriter(connect.WithRequireConnectProtocolHeader()),
// takes a POST for a Connect request only with the Connect-Protocol-Version
// header and a GET only with the connect=v1 query parameter, which
// connect-go clients always send: without that option, every GET and every
// POST of an application/* body (a JSON API beside the Connect services)
// would be taken for a Connect call and denied with a Connect error
// instead of 429.
func WithErrorWriter(ew *connect.ErrorWriter) Option {
	return Option{func(o *options) { o.ew, o.strict = ew, false }}
}

// ErrNilErrorWriter is the error of New for WithErrorWriter(nil).
var ErrNilErrorWriter = errors.New("ratewindow: connectmw: nil ErrorWriter")

// New returns middleware that limits requests by rule on l, or an error
// when the rule is invalid (see core.Rule.Validate), l is nil or an option
// is.
//
// It wraps an http.Handler that serves Connect handlers (a mux, or one
// handler from a generated New...Handler), and answers as the client
// spoke:
//
//   - a Connect, gRPC or gRPC-Web call that a limit denies gets a
//     connect.Error of code CodeResourceExhausted with a
//     google.rpc.RetryInfo detail (the exact time until the call would
//     pass; none when it never can), written by connect's ErrorWriter
//     before the request body is read; the rate-limit header fields of the
//     rule and Retry-After go out as response headers, which a connect-go
//     client finds in the error's Meta;
//   - a call that the Limiter answers with the 503 of its failure mode
//     (FailClosed, or a decision shed for overload, core.ErrShed, which
//     is never admitted) gets CodeUnavailable with a RetryInfo of the
//     Retry-After (1 s);
//   - any other request (a plain HTTP caller of the same mux) gets what
//     nethttp gives it: 429 with Retry-After, or the 503.
//
// Both kinds of request count under the same keys: the rule's Key and
// every other function of it apply unchanged, Rule.OnDenied answers the
// plain callers only, and an OnError that writes a response answers every
// caller with it. A stream is decided once, when it starts. For a call,
// Rule.CountIf sees the HTTP status its code maps to under the Connect
// protocol (connect-go's mapping: Unauthenticated 401, ResourceExhausted
// 429, ...; 200 when it succeeded), whatever protocol the client spoke:
// the code is read from the grpc-status trailer (gRPC, gRPC-Web) or the
// Connect error. A handler that panics counts as 500.
func New(l *core.Limiter, rule core.Rule, opts ...Option) (func(http.Handler) http.Handler, error) {
	o := options{ew: connect.NewErrorWriter(connect.WithRequireConnectProtocolHeader()), strict: true}
	for _, opt := range opts {
		if opt.apply != nil {
			opt.apply(&o)
		}
	}
	if o.ew == nil {
		return nil, ErrNilErrorWriter
	}
	plain, err := core.NewEnforcer(l, rule)
	if err != nil {
		return nil, err
	}
	// The same rule with the Connect answers: its keys are Name + key, so
	// the two Enforcers share every counter, the deny cache and penalties.
	rpcRule := rule
	rpcRule.OnDenied = func(w http.ResponseWriter, r *http.Request, res core.Result) {
		writeDenied(o.ew, w, r, res)
	}
	if rule.OnError != nil {
		onError := rule.OnError
		rpcRule.OnError = func(w http.ResponseWriter, r *http.Request, err error) {
			sw := findStopWriter(w)
			if sw != nil {
				sw.through = true
				defer func() { sw.through = false }()
			}
			onError(w, r, err)
		}
	}
	rpc, err := core.NewEnforcer(l, rpcRule)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic(fmt.Sprintf("ratewindow: connectmw: rule %q: nil next handler", rule.Name))
		}
		return &handler{plain: plain, rpc: rpc, ew: o.ew, strict: o.strict, next: next}
	}, nil
}

// Limit is New for use at start-up: it panics with the error of an invalid
// rule or option.
func Limit(l *core.Limiter, rule core.Rule, opts ...Option) func(http.Handler) http.Handler {
	return must.Build(New(l, rule, opts...))
}

// handler is the middleware: one Enforcer per kind of caller, on the same
// rule.
type handler struct {
	plain *core.Enforcer // nethttp's answers
	rpc   *core.Enforcer // Connect's answers
	ew    *connect.ErrorWriter
	// strict: ew requires the Connect protocol version (the default)
	strict bool
	next   http.Handler
	pool   sync.Pool // *stopWriter
}

// isCall reports whether r is a Connect, gRPC or gRPC-Web call: what the
// ErrorWriter's IsSupported answers, which for a GET parses the query
// (four allocations). The default ErrorWriter takes a GET for a call only
// with a non-empty connect parameter: a query without "connect=" and
// without a '%' (an escaped name) has none.
func (h *handler) isCall(r *http.Request) bool {
	if h.strict && r.Method == http.MethodGet {
		if q := r.URL.RawQuery; !strings.Contains(q, "connect=") && !strings.Contains(q, "%") {
			return false
		}
	}
	return h.ew.IsSupported(r)
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.isCall(r) {
		if r, ok := h.plain.Handle(w, r, ""); ok {
			h.plain.ServeNext(w, r, h.next)
		}
		return
	}
	sw, _ := h.pool.Get().(*stopWriter)
	if sw == nil {
		sw = new(stopWriter)
	}
	*sw = stopWriter{ResponseWriter: w, ew: h.ew, r: r}
	next, ok := h.rpc.Handle(sw, r, "")
	*sw = stopWriter{}
	h.pool.Put(sw)
	switch {
	case !ok:
	case h.rpc.Settles(): // CountIf sees the call's code as Connect's HTTP status
		cw := &callWriter{ResponseWriter: w}
		h.rpc.SettleAfter(next, func() int {
			h.next.ServeHTTP(cw, next)
			return cw.httpStatus()
		})
	default:
		h.next.ServeHTTP(w, next)
	}
}

// stopWriter is the ResponseWriter of a Connect request's decision (only:
// the next handler gets the client's own). It turns the Enforcer's 503
// (the failure mode's, see core.Enforcer.Handle) into a Connect error of
// code CodeUnavailable, and lets the rule's OnDenied and OnError write
// through.
type stopWriter struct {
	http.ResponseWriter
	ew      *connect.ErrorWriter
	r       *http.Request
	through bool // OnError is writing: pass its response as it is
	done    bool // the 503 was answered as a Connect error: drop its body
}

func (w *stopWriter) WriteHeader(code int) {
	switch {
	case w.done:
		return
	case w.through || code != http.StatusServiceUnavailable:
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.done = true
	h := w.ResponseWriter.Header()
	delay := time.Second
	if v, err := strconv.Atoi(h.Get("Retry-After")); err == nil && v > 0 {
		delay = time.Duration(v) * time.Second
	}
	// the 503's own representation fields
	h.Del("Content-Length")
	h.Del("Content-Type")
	h.Del("X-Content-Type-Options")
	cerr := connect.NewError(connect.CodeUnavailable, errUnavailable)
	addRetryInfo(cerr, delay)
	_ = w.ew.Write(w.ResponseWriter, w.r, cerr) // a write error: the client is gone
}

func (w *stopWriter) Write(b []byte) (int, error) {
	if w.done {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the ResponseWriter, for http.ResponseController.
func (w *stopWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// findStopWriter returns the stopWriter under w, or nil.
func findStopWriter(w http.ResponseWriter) *stopWriter {
	for {
		if sw, ok := w.(*stopWriter); ok {
			return sw
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
}

// The messages of the Connect errors, grpcmw's: no key, no limit,
// nothing of the client's.
var (
	errDenied      = errors.New("rate limit exceeded")
	errUnavailable = errors.New("rate limiter unavailable")
)

// writeDenied answers a denial res of a Connect request: CodeResourceExhausted
// (CodeUnavailable for a shed decision) with RetryInfo, the rate-limit
// fields and Retry-After already in w's header.
func writeDenied(ew *connect.ErrorWriter, w http.ResponseWriter, r *http.Request, res core.Result) {
	if sw := findStopWriter(w); sw != nil {
		w = sw.ResponseWriter
	}
	code, msg := connect.CodeResourceExhausted, errDenied
	if errors.Is(res.BackendErr, core.ErrShed) {
		// a decision shed for overload, which the failure mode FailLocal
		// hands to OnDenied: no limit denied it, Redis was too slow
		code, msg = connect.CodeUnavailable, errUnavailable
	}
	cerr := connect.NewError(code, msg)
	if !res.Never() {
		addRetryInfo(cerr, res.RetryAfter)
	}
	_ = ew.Write(w, r, cerr) // a write error: the client is gone
}

// addRetryInfo adds a google.rpc.RetryInfo of delay to cerr.
func addRetryInfo(cerr *connect.Error, delay time.Duration) {
	d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	if err != nil { // no RetryInfo marshals wrong; the code alone still says it
		return
	}
	cerr.AddDetail(d)
}
