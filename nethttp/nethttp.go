package nethttp

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/httpx"
	"github.com/ratewindow/ratewindow/internal/must"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

// Option configures the middleware of New and Limit. Build one with the
// With functions.
//
// Both options tell the middleware the route pattern of a request. They
// exist only here: http.ServeMux gives the pattern only to the handler it
// matched, whereas chimw, ginmw and echomw get it from their router, so
// their New and Limit, otherwise the same as these, take no options.
type Option struct{ apply func(*options) }

type options struct {
	route func(*http.Request) string
}

// WithMux makes the middleware find the route pattern of a request with
// mux.Handler when the request has none, so that keyfuncs.Route works in a
// middleware that wraps the whole mux:
//
//	mux := http.NewServeMux()
//	mux.HandleFunc("GET /users/{id}", user)
//	handler := nethttp.Limit(l, rule, nethttp.WithMux(mux))(mux)
//
// The method of the pattern is dropped, as keyfuncs.Route does with
// Request.Pattern: "GET /users/{id}" becomes "/users/{id}". The lookup
// matches the request a second time, before the mux does.
//
// Without WithMux, such a middleware sees no pattern at all: a rule keyed
// by keyfuncs.Route fails on every request, with an error that names
// WithMux. With it, a request that
// matches no pattern (the mux's 404) still has no route. Either way the
// failure is a key error (keyfuncs.ErrNoRoute): the rule's OnError is
// called and the request is counted under the rule's FallbackKey (see
// core.Rule.Key). keyfuncs.Or gives such requests a key of their own.
func WithMux(mux *http.ServeMux) Option {
	return WithRouteFunc(func(r *http.Request) string {
		_, pattern := mux.Handler(r)
		return httpx.StripMethod(pattern)
	})
}

// WithRouteFunc makes the middleware ask fn for the route pattern of a
// request when the request has none (Request.Pattern is empty), for a
// router other than http.ServeMux. fn returns "" when there is no route.
func WithRouteFunc(fn func(*http.Request) string) Option {
	return Option{func(o *options) { o.route = fn }}
}

// New returns middleware that limits requests by rule on l, or an error
// when the rule is invalid (see core.Rule.Validate).
//
// Requests pass to the next handler, with the rate-limit header fields of
// the rule, until a limit denies them: then the middleware answers 429 Too
// Many Requests with Retry-After (see core.Rule for every choice). The
// route pattern of a request is Request.Pattern, which http.ServeMux sets
// on the request it passes to a handler registered on it: wrap those
// handlers, or use WithMux when wrapping the mux itself.
func New(l *core.Limiter, rule core.Rule, opts ...Option) (func(http.Handler) http.Handler, error) {
	var o options
	for _, opt := range opts {
		if opt.apply != nil {
			opt.apply(&o)
		}
	}
	if o.route == nil && rule.Key != nil {
		rule.Key = hintMux(rule.Key)
	}
	e, err := core.NewEnforcer(l, rule)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic(fmt.Sprintf("ratewindow: nethttp: rule %q: nil next handler", rule.Name))
		}
		if o.route != nil {
			return routed{e: e, next: next, route: o.route}
		}
		return plain{e: e, next: next}
	}, nil
}

// Limit is New for use at start-up: it panics with the error of an invalid
// rule.
func Limit(l *core.Limiter, rule core.Rule, opts ...Option) func(http.Handler) http.Handler {
	return must.Build(New(l, rule, opts...))
}

// hintMux returns key, whose keyfuncs.ErrNoRoute on a request without a
// pattern (Request.Pattern is empty: the middleware wraps no handler
// registered on an http.ServeMux, such as the whole mux) names the fix,
// nethttp.WithMux, in the error that the rule's OnError and its log see.
// The error still matches keyfuncs.ErrNoRoute.
func hintMux(key keyfuncs.Func) keyfuncs.Func {
	return func(r *http.Request) (string, error) {
		k, err := key(r)
		if err != nil && r.Pattern == "" && errors.Is(err, keyfuncs.ErrNoRoute) {
			return "", fmt.Errorf("%w (the middleware wraps no handler registered on an http.ServeMux: around the whole mux, pass nethttp.WithMux(mux))", err)
		}
		return k, err
	}
}

// plain is the middleware with Request.Pattern as the route, which
// replaces an outer router's (a mux mounted under chi, or behind
// http.StripPrefix: its handlers' own patterns key them).
type plain struct {
	e    *core.Enforcer
	next http.Handler
}

func (h plain) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r, ok := h.e.HandleFrom(w, r, httpx.StripMethod(r.Pattern), nil); ok { // HandleFrom: a frame fewer than Handle
		h.e.ServeNext(w, r, h.next) // captures the status for Rule.CountIf
	}
}

// routed is the middleware with a route function (chimw's has the same
// name and shape).
type routed struct {
	e     *core.Enforcer
	next  http.Handler
	route func(*http.Request) string
}

func (h routed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route := ""
	if r.Pattern == "" {
		route = h.route(r)
	}
	if r, ok := h.e.HandleFrom(w, r, route, nil); ok {
		h.e.ServeNext(w, r, h.next)
	}
}

// LimitByIP returns middleware that admits n requests per window from each
// client IP (see core.ByIP): the shortest useful start. It panics at
// start-up when n < 1 or the window is invalid.
//
//	http.ListenAndServe(":8080", nethttp.LimitByIP(l, 100, time.Minute)(mux))
//
// The rule is named after the limit and the line that called LimitByIP
// ("ip-100-per-1m@api/routes.go#42"): two LimitByIP on two routes count
// apart, one around a whole router counts it all, and replicas built from
// the same code share the counter. A loop that builds several at one line
// builds one counter: use Limit with core.ByIP and a Name of your own.
func LimitByIP(l *core.Limiter, n int64, window time.Duration) func(http.Handler) http.Handler {
	return must.Build(New(l, must.ByIP(l, n, window)))
}
