// Package chimw rate-limits chi routers with a ratewindow Limiter.
//
// Limit (or New, which returns the error of an invalid rule instead of
// panicking) turns a core.Rule into chi middleware, for the whole router or
// for some routes:
//
//	r := chi.NewRouter()
//	r.Use(chimw.Limit(l, core.Rule{Name: "global", Limits: []core.Limit{core.PerMinute(600)}}))
//	r.With(chimw.Limit(l, login)).Post("/login", handleLogin)
//
// The answers (header fields, 429, Retry-After, bodies) are those of every
// ratewindow adapter, byte for byte: see core.Rule.
//
// # Route patterns
//
// keyfuncs.Route sees chi's route pattern ("/users/{id}", with the
// prefixes of mounted sub-routers), also in middleware installed with Use,
// which chi runs before it has routed the request: the middleware then
// finds the pattern the router will match, with the router's Find. A
// request that matches no route (chi's 404) has no pattern: a rule
// installed with Use and keyed by keyfuncs.Route fails with
// keyfuncs.ErrNoRoute for it, a key error: the rule's OnError is called
// and the request is counted under the rule's FallbackKey (see
// core.Rule.Key); keyfuncs.Or gives such requests a key of their own. The middleware must
// run inside a chi router (Use, With, Group or Route); wrapping a router
// from outside gives no pattern.
//
// # Options
//
// New and Limit have the signatures of nethttp's, less its options:
// nethttp.WithMux and nethttp.WithRouteFunc exist because http.ServeMux
// gives the pattern only to the handler it matched, whereas chi lets the
// middleware find it, so there is nothing to configure here.
package chimw

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/must"
)

// New returns chi middleware that limits requests by rule on l, or an
// error when the rule is invalid (see core.Rule.Validate).
//
// Requests pass to the next handler, with the rate-limit header fields of
// the rule, until a limit denies them: then the middleware answers 429 Too
// Many Requests with Retry-After (see core.Rule for every choice). The
// route pattern of a request is chi's, also before routing (see the
// package documentation).
func New(l *core.Limiter, rule core.Rule) (func(http.Handler) http.Handler, error) {
	e, err := core.NewEnforcer(l, rule)
	if err != nil {
		return nil, err
	}
	routes := &routeFinder{}
	routes.pool.New = func() any { return chi.NewRouteContext() }
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic(fmt.Sprintf("ratewindow: chimw: rule %q: nil next handler", rule.Name))
		}
		return routed{e: e, next: next, routes: routes}
	}, nil
}

// Limit is New for use at start-up: it panics with the error of an invalid
// rule.
func Limit(l *core.Limiter, rule core.Rule) func(http.Handler) http.Handler {
	return must.Build(New(l, rule))
}

// routed is the middleware, with chi's route pattern as the route, as
// nethttp's middleware of the same name has its route function.
type routed struct {
	e      *core.Enforcer
	next   http.Handler
	routes *routeFinder
}

func (h routed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r, ok := h.e.HandleFrom(w, r, h.routes.route(r), nil); ok {
		h.e.ServeNext(w, r, h.next) // captures the status for Rule.CountIf
	}
}

// routeFinder finds chi's route pattern of a request, also before routing.
type routeFinder struct {
	pool sync.Pool // of *chi.Context for Find
}

// route returns the route pattern of r, as chi's RoutePattern gives it in
// the handler, or "" when r matches no route or is not inside a chi router.
func (f *routeFinder) route(r *http.Request) string {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil {
		return ""
	}
	// Once chi has matched the endpoint, the last pattern is the endpoint's.
	// Before routing there is none; inside a mounted sub-router's Use, the
	// last one is the mount's, which ends in "*" (as does a catch-all
	// endpoint, which Find gives back unchanged).
	if n := len(rctx.RoutePatterns); n > 0 && !strings.HasSuffix(rctx.RoutePatterns[n-1], "*") {
		return rctx.RoutePattern()
	}
	if rctx.Routes == nil {
		return ""
	}
	method := rctx.RouteMethod
	if method == "" {
		method = r.Method
	}
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	if path == "" {
		path = "/"
	}
	c := f.pool.Get().(*chi.Context)
	c.Reset()
	p := rctx.Routes.Find(c, method, path)
	c.Reset()
	f.pool.Put(c)
	return normalize(p)
}

// normalize gives a pattern from Find the form of chi's RoutePattern:
// "/*/" joints collapsed, no trailing slash but for "/".
func normalize(p string) string {
	for strings.Contains(p, "/*/") {
		p = strings.ReplaceAll(p, "/*/", "/")
	}
	if p != "/" {
		p = strings.TrimSuffix(p, "//")
		p = strings.TrimSuffix(p, "/")
	}
	return p
}

// LimitByIP returns chi middleware that admits n requests per window from
// each client IP (see core.ByIP). It panics at start-up when n < 1 or the
// window is invalid.
//
//	r.Use(chimw.LimitByIP(l, 100, time.Minute))
//
// The rule is named after the limit and the line that called LimitByIP
// ("ip-100-per-1m@api/routes.go#42"): two LimitByIP on two routes count
// apart, one around a whole router counts it all, and replicas built from
// the same code share the counter. A loop that builds several at one line
// builds one counter: use Limit with core.ByIP and a Name of your own.
func LimitByIP(l *core.Limiter, n int64, window time.Duration) func(http.Handler) http.Handler {
	return must.Build(New(l, must.ByIP(l, n, window)))
}
