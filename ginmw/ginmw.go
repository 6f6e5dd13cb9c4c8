// Package ginmw rate-limits gin engines with a ratewindow Limiter.
//
// Limit (or New, which returns the error of an invalid rule instead of
// panicking) turns a core.Rule into a gin.HandlerFunc, for the whole engine
// or for a group or a route:
//
//	r := gin.New()
//	r.Use(ginmw.Limit(l, core.Rule{Name: "global", Limits: []core.Limit{core.PerMinute(600)}}))
//	r.POST("/login", ginmw.Limit(l, login), handleLogin)
//
// A denied request is answered (429 with Retry-After and the rate-limit
// header fields) and the handler chain is aborted. The answers are those of
// every ratewindow adapter, byte for byte: see core.Rule.
//
// keyfuncs.Route sees gin's route pattern, c.FullPath() ("/users/:id"). A
// request that matches no route has none.
package ginmw

import (
	"bufio"
	"net"
	"net/http"
	"time"

	"github.com/ratewindow/ratewindow/keyfuncs"

	"github.com/gin-gonic/gin"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/must"
)

// New returns a gin.HandlerFunc that limits requests by rule on l, or an
// error when the rule is invalid (see core.Rule.Validate).
func New(l *core.Limiter, rule core.Rule) (gin.HandlerFunc, error) {
	e, err := core.NewEnforcer(l, rule)
	if err != nil {
		return nil, err
	}
	return func(c *gin.Context) {
		r, ok := e.HandleFrom(c.Writer, c.Request, c.FullPath(), c)
		if !ok {
			c.Abort()
			return
		}
		c.Request = r
		if !e.Settles() {
			c.Next()
			return
		}
		// Rule.CountIf: settle by the status the handlers wrote (101 for
		// a hijack before any); a panic (on its way to gin's Recovery)
		// counts as 500
		hw := &hijackWatch{ResponseWriter: c.Writer}
		c.Writer = hw
		e.SettleAfter(r, func() int {
			c.Next()
			c.Writer = hw.ResponseWriter
			if hw.upgraded {
				return http.StatusSwitchingProtocols
			}
			return hw.Status()
		})
	}, nil
}

// hijackWatch notes a hijack before any status was written: the
// connection was upgraded (101), which gin's Status does not say.
type hijackWatch struct {
	gin.ResponseWriter
	upgraded bool
}

// Hijack hands the connection over (http.Hijacker).
func (w *hijackWatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	written := w.Written()
	c, rw, err := w.ResponseWriter.Hijack()
	w.upgraded = err == nil && !written
	return c, rw, err
}

// Unwrap returns the writer it watches, for http.ResponseController.
func (w *hijackWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Limit is New for use at start-up: it panics with the error of an invalid
// rule.
func Limit(l *core.Limiter, rule core.Rule) gin.HandlerFunc {
	return must.Build(New(l, rule))
}

// LimitByIP returns a gin.HandlerFunc that admits n requests per window
// from each client IP (see core.ByIP). It panics at start-up when n < 1 or
// the window is invalid.
//
//	r.Use(ginmw.LimitByIP(l, 100, time.Minute))
//
// The rule is named after the limit and the line that called LimitByIP
// ("ip-100-per-1m@api/routes.go#42"): two LimitByIP on two routes count
// apart, one around a whole router counts it all, and replicas built from
// the same code share the counter. A loop that builds several at one line
// builds one counter: use Limit with core.ByIP and a Name of your own.
func LimitByIP(l *core.Limiter, n int64, window time.Duration) gin.HandlerFunc {
	return must.Build(New(l, must.ByIP(l, n, window)))
}

// Key keys a request by a value that earlier gin middleware stored with
// c.Set(name, value), such as the user an authentication middleware found:
// name + ":" + the value (see keyfuncs.Value). A request without it is a
// key error (keyfuncs.ErrNoKey): OnError is called, and the request is
// counted under the rule's FallbackKey (see core.Rule.Key).
// It works in the middleware of this package, which hands the
// *gin.Context to the rule.
//
//	auth := func(c *gin.Context) { c.Set("user", userID(c)) }
//	r.POST("/orders", auth, ginmw.Limit(l, core.Rule{Name: "orders", Limits: limits, Key: ginmw.Key("user")}), order)
func Key(name string) keyfuncs.Func {
	return keyfuncs.Value(name, func(r *http.Request) (any, bool) {
		c, ok := core.FrameworkContext(r).(*gin.Context)
		if !ok {
			return nil, false
		}
		return c.Get(name)
	})
}
