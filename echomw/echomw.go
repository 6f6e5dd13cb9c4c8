// Package echomw rate-limits echo servers with a ratewindow Limiter, in
// echo's own style: a Config with a Skipper, LimitWithConfig and
// Config.ToMiddleware.
//
//	e := echo.New()
//	e.Use(echomw.Limit(l, core.Rule{Name: "global", Limits: []core.Limit{core.PerMinute(600)}}))
//	e.POST("/login", handleLogin, echomw.LimitWithConfig(echomw.Config{
//		Skipper: func(c echo.Context) bool { return c.RealIP() == "127.0.0.1" },
//		Limiter: l,
//		Rule:    login,
//	}))
//
// A denied request is answered (429 with Retry-After and the rate-limit
// header fields) and the next handler is not called; the middleware returns
// nil, so the answer is the same, byte for byte, as in every ratewindow
// adapter (see core.Rule), not one made by echo's HTTPErrorHandler.
//
// keyfuncs.Route sees echo's route pattern, c.Path() ("/users/:id"), in
// middleware added with Use or on a route; middleware added with Pre runs
// before routing and sees none.
package echomw

import (
	"errors"
	"net/http"
	"time"

	"github.com/ratewindow/ratewindow/keyfuncs"

	"github.com/labstack/echo/v4"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/must"
)

// Config configures the middleware of LimitWithConfig.
type Config struct {
	// Skipper reports requests the middleware passes without looking at
	// them, as in echo's middleware.Skipper (whose values it accepts).
	// Default: none. Rule.Skip does the same with the *http.Request.
	Skipper func(c echo.Context) bool
	// Limiter decides. Required.
	Limiter *core.Limiter
	// Rule describes the limits, the key and the answers. Required: see
	// core.Rule.Validate.
	Rule core.Rule
}

// ToMiddleware returns the middleware of c, or an error when c is invalid.
func (c Config) ToMiddleware() (echo.MiddlewareFunc, error) {
	if c.Limiter == nil {
		return nil, errors.New("ratewindow: echomw: Config.Limiter is nil")
	}
	e, err := core.NewEnforcer(c.Limiter, c.Rule)
	if err != nil {
		return nil, err
	}
	skip := c.Skipper
	if skip == nil {
		skip = func(echo.Context) bool { return false }
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(ec echo.Context) error {
			if skip(ec) {
				return next(ec)
			}
			r, ok := e.HandleFrom(ec.Response(), ec.Request(), ec.Path(), ec)
			if !ok {
				return nil
			}
			ec.SetRequest(r)
			if !e.Settles() {
				return next(ec)
			}
			return serveCounted(e, r, ec, next)
		}
	}, nil
}

// serveCounted runs next for a rule with CountIf and settles by the
// response's status: the one written, or, when next returned an error
// before writing (echo's error handler writes it later), the error's: an
// *echo.HTTPError's code, else 500. A panic counts as 500.
func serveCounted(e *core.Enforcer, r *http.Request, ec echo.Context, next echo.HandlerFunc) error {
	var err error
	res := ec.Response()
	w := res.Writer
	sw, status := core.WatchStatus(w) // below echo's Response, which after a 1xx drops the final status
	res.Writer = sw
	e.SettleAfter(r, func() int {
		err = next(ec)
		res.Writer = w
		switch s := status(); {
		case s != 0:
			return s
		case err == nil || res.Committed:
			return res.Status
		}
		var he *echo.HTTPError
		if errors.As(err, &he) {
			return he.Code
		}
		return http.StatusInternalServerError
	})
	return err
}

// LimitWithConfig returns the middleware of c. It panics when c is invalid,
// at start-up, as echo's own WithConfig functions do.
func LimitWithConfig(c Config) echo.MiddlewareFunc {
	return must.Build(c.ToMiddleware())
}

// New returns middleware that limits requests by rule on l, or an error
// when the rule is invalid.
func New(l *core.Limiter, rule core.Rule) (echo.MiddlewareFunc, error) {
	return Config{Limiter: l, Rule: rule}.ToMiddleware()
}

// Limit returns middleware that limits requests by rule on l. It panics
// when the rule is invalid, at start-up.
func Limit(l *core.Limiter, rule core.Rule) echo.MiddlewareFunc {
	return must.Build(New(l, rule))
}

// LimitByIP returns echo middleware that admits n requests per window from
// each client IP (see core.ByIP). It panics at start-up when n < 1 or the
// window is invalid.
//
//	e.Use(echomw.LimitByIP(l, 100, time.Minute))
//
// The rule is named after the limit and the line that called LimitByIP
// ("ip-100-per-1m@api/routes.go#42"): two LimitByIP on two routes count
// apart, one around a whole router counts it all, and replicas built from
// the same code share the counter. A loop that builds several at one line
// builds one counter: use Limit with core.ByIP and a Name of your own.
func LimitByIP(l *core.Limiter, n int64, window time.Duration) echo.MiddlewareFunc {
	return must.Build(New(l, must.ByIP(l, n, window)))
}

// Key keys a request by a value that earlier echo middleware stored with
// c.Set(name, value), such as the user an authentication middleware found:
// name + ":" + the value (see keyfuncs.Value). A request without it is a
// key error (keyfuncs.ErrNoKey): OnError is called, and the request is
// counted under the rule's FallbackKey (see core.Rule.Key).
// It works in the middleware of this package, which hands the echo.Context
// to the rule.
func Key(name string) keyfuncs.Func {
	return keyfuncs.Value(name, func(r *http.Request) (any, bool) {
		c, ok := core.FrameworkContext(r).(echo.Context)
		if !ok {
			return nil, false
		}
		v := c.Get(name)
		return v, v != nil
	})
}
