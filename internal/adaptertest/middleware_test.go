package adaptertest_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/chimw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/echomw"
	"github.com/ratewindow/ratewindow/ginmw"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/keyfuncs"
	"github.com/ratewindow/ratewindow/nethttp"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode) // no debug output on stdout
	redistest.Main(m)
}

// okHandler is the handler behind every route, the same in every framework.
// It answers 200, or the status a request asks for in X-Status (such as a
// failed login's 401), for Rule.CountIf.
func okHandler(w http.ResponseWriter, r *http.Request) {
	status := http.StatusOK
	if s, err := strconv.Atoi(r.Header.Get("X-Status")); err == nil {
		status = s
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", "3")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "ok\n")
}

// route is a GET route with the rules installed on it, outermost first.
// path is written in chi's syntax ("/users/{id}").
type route struct {
	path  string
	rules []core.Rule
}

// app is what a scenario serves: rules installed router-wide (before
// routing, outermost first) and routes.
type app struct {
	global []core.Rule
	routes []route
	// handler serves every route; default okHandler
	handler http.HandlerFunc
	// handlerFor, when set, builds handler with the scenario's Limiter
	handlerFor func(l *core.Limiter) http.HandlerFunc
}

func (a app) h() http.HandlerFunc {
	if a.handler != nil {
		return a.handler
	}
	return okHandler
}

// adapter builds app with one framework.
type adapter struct {
	name  string
	build func(l *core.Limiter, a app) http.Handler
	// byIP serves GET / behind LimitByIP(l, 2, time.Minute) and
	// LimitByIP(l, 5, time.Hour).
	byIP func(l *core.Limiter) http.Handler
	// newErr is the adapter's New's error for rule; limit calls its Limit.
	newErr func(l *core.Limiter, rule core.Rule) error
	limit  func(l *core.Limiter, rule core.Rule)
}

var paramRE = regexp.MustCompile(`\{(\w+)\}`)

// colonPath turns "/users/{id}" into gin's and echo's "/users/:id".
func colonPath(p string) string { return paramRE.ReplaceAllString(p, ":$1") }

var adapters = []adapter{
	{"nethttp", func(l *core.Limiter, a app) http.Handler {
		mux := http.NewServeMux()
		for _, rt := range a.routes {
			var h http.Handler = a.h()
			for i := len(rt.rules) - 1; i >= 0; i-- {
				h = nethttp.Limit(l, rt.rules[i])(h)
			}
			mux.Handle("GET "+rt.path, h)
		}
		var h http.Handler = mux
		for i := len(a.global) - 1; i >= 0; i-- {
			h = nethttp.Limit(l, a.global[i], nethttp.WithMux(mux))(h)
		}
		return h
	},
		func(l *core.Limiter) http.Handler {
			h := http.HandlerFunc(okHandler)
			return nethttp.LimitByIP(l, 2, time.Minute)(nethttp.LimitByIP(l, 5, time.Hour)(h))
		},
		func(l *core.Limiter, rule core.Rule) error { _, err := nethttp.New(l, rule); return err },
		func(l *core.Limiter, rule core.Rule) { nethttp.Limit(l, rule) },
	},
	{"chi", func(l *core.Limiter, a app) http.Handler {
		r := chi.NewRouter()
		for _, rule := range a.global {
			r.Use(chimw.Limit(l, rule))
		}
		for _, rt := range a.routes {
			var mws []func(http.Handler) http.Handler
			for _, rule := range rt.rules {
				mws = append(mws, chimw.Limit(l, rule))
			}
			r.With(mws...).Get(rt.path, a.h())
		}
		return r
	},
		func(l *core.Limiter) http.Handler {
			r := chi.NewRouter()
			r.Use(chimw.LimitByIP(l, 2, time.Minute), chimw.LimitByIP(l, 5, time.Hour))
			r.Get("/", okHandler)
			return r
		},
		func(l *core.Limiter, rule core.Rule) error { _, err := chimw.New(l, rule); return err },
		func(l *core.Limiter, rule core.Rule) { chimw.Limit(l, rule) },
	},
	{"gin", func(l *core.Limiter, a app) http.Handler {
		e := gin.New()
		for _, rule := range a.global {
			e.Use(ginmw.Limit(l, rule))
		}
		for _, rt := range a.routes {
			var hs []gin.HandlerFunc
			for _, rule := range rt.rules {
				hs = append(hs, ginmw.Limit(l, rule))
			}
			e.GET(colonPath(rt.path), append(hs, gin.WrapF(a.h()))...)
		}
		return e
	},
		func(l *core.Limiter) http.Handler {
			e := gin.New()
			e.Use(ginmw.LimitByIP(l, 2, time.Minute), ginmw.LimitByIP(l, 5, time.Hour))
			e.GET("/", gin.WrapF(okHandler))
			return e
		},
		func(l *core.Limiter, rule core.Rule) error { _, err := ginmw.New(l, rule); return err },
		func(l *core.Limiter, rule core.Rule) { ginmw.Limit(l, rule) },
	},
	{"echo", func(l *core.Limiter, a app) http.Handler {
		e := echo.New()
		for _, rule := range a.global {
			e.Use(echomw.Limit(l, rule))
		}
		for _, rt := range a.routes {
			var mws []echo.MiddlewareFunc
			for _, rule := range rt.rules {
				mws = append(mws, echomw.Limit(l, rule))
			}
			e.GET(colonPath(rt.path), echo.WrapHandler(a.h()), mws...)
		}
		return e
	},
		func(l *core.Limiter) http.Handler {
			e := echo.New()
			e.Use(echomw.LimitByIP(l, 2, time.Minute), echomw.LimitByIP(l, 5, time.Hour))
			e.GET("/", echo.WrapHandler(http.HandlerFunc(okHandler)))
			return e
		},
		func(l *core.Limiter, rule core.Rule) error { _, err := echomw.New(l, rule); return err },
		func(l *core.Limiter, rule core.Rule) { echomw.Limit(l, rule) },
	},
}

// step is one request and the exact response expected.
type step struct {
	advance time.Duration // moves the Limiter's clock before the request
	path    string        // default "/users/1"
	remote  string        // RemoteAddr; default "192.0.2.1:4711"
	header  http.Header   // request header fields
	status  int
	want    map[string]string // every response header field, values joined by "\n"
	body    string
}

// backend selects the scenario's Redis.
type backend uint8

const (
	realRedis backend = iota
	silentRedis
)

type scenario struct {
	name    string
	backend backend
	opts    []core.Option
	app     app
	steps   []step
	// wantKeys, when set, are the keys the observer saw, in order.
	wantKeys []string
	// wantErrors is the number of OnError calls.
	wantErrors int
	// wantDenied, when set, lists Result.Allowed == false per observed event.
	wantAllowed []bool
	// wantBanned, when set, lists Event.Banned per observed event.
	wantBanned []bool
}

// Expected responses.

func fields(kv ...string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		m[http.CanonicalHeaderKey(kv[i])] = kv[i+1]
	}
	return m
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// xrl returns the X-RateLimit fields.
func xrl(limit, remaining, reset int) map[string]string {
	return fields("X-RateLimit-Limit", strconv.Itoa(limit), "X-RateLimit-Remaining", strconv.Itoa(remaining), "X-RateLimit-Reset", strconv.Itoa(reset))
}

// ietf returns the IETF fields.
func ietf(policy, rateLimit string) map[string]string {
	return fields("RateLimit-Policy", policy, "RateLimit", rateLimit)
}

// ok is a passed request.
func ok(rate map[string]string) step {
	return step{status: 200, body: "ok\n", want: merge(fields("Content-Type", "text/plain; charset=utf-8", "Content-Length", "3"), rate)}
}

// tooMany is a denial with the text body; retry 0 means no Retry-After.
func tooMany(retry int, rate map[string]string) step {
	s := step{status: 429, body: "Too Many Requests\n", want: merge(fields(
		"Content-Type", "text/plain; charset=utf-8",
		"Content-Length", "18",
		"X-Content-Type-Options", "nosniff",
	), rate)}
	if retry > 0 {
		s.want["Retry-After"] = strconv.Itoa(retry)
	}
	return s
}

// problem is a denial with the application/problem+json body, listing the
// policies that denied.
func problem(retry int, policy string, rate map[string]string, more ...string) step {
	body := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"violated-policies":["` +
		strings.Join(append([]string{policy}, more...), `","`) + `"]}`
	return step{status: 429, body: body, want: merge(fields(
		"Content-Type", "application/problem+json",
		"Content-Length", strconv.Itoa(len(body)),
		"Retry-After", strconv.Itoa(retry),
	), rate)}
}

// banned is the denial of a banned or blocked key with the
// application/problem+json body: abnormal-usage-detected, no policy.
func banned(retry int, rate map[string]string) step {
	body := `{"type":"https://iana.org/assignments/http-problem-types#abnormal-usage-detected","title":"Request not satisfied due to detection of abnormal request pattern","status":429}`
	return step{status: 429, body: body, want: merge(fields(
		"Content-Type", "application/problem+json",
		"Content-Length", strconv.Itoa(len(body)),
		"Retry-After", strconv.Itoa(retry),
	), rate)}
}

// answered is a request the handler answered with status (X-Status).
func answered(status int, rate map[string]string) step {
	s := ok(rate).with("X-Status", strconv.Itoa(status))
	s.status = status
	return s
}

// pk is the partition-key parameter of key: the structured-field byte
// sequence of the first 12 bytes of its SHA-256.
func pk(key string) string {
	sum := sha256.Sum256([]byte(key))
	return ";pk=:" + base64.StdEncoding.EncodeToString(sum[:12]) + ":"
}

// unavailableProblem is the problem+json 503 of a Limiter that fails
// closed, listing the rule's policies.
func unavailableProblem(policies ...string) step {
	body := `{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Request cannot be satisfied due to temporary server capacity constraints","status":503,"violated-policies":["` +
		strings.Join(policies, `","`) + `"]}`
	return step{status: 503, body: body, want: fields(
		"Content-Type", "application/problem+json",
		"Content-Length", strconv.Itoa(len(body)),
		"Retry-After", "1",
	)}
}

// unavailable is the 503 of a Limiter that fails closed.
func unavailable() step {
	return step{status: 503, body: "Service Unavailable\n", want: fields(
		"Content-Type", "text/plain; charset=utf-8",
		"Content-Length", "20",
		"X-Content-Type-Options", "nosniff",
		"Retry-After", "1",
	)}
}

// Request modifiers.

func (s step) at(path string) step        { s.path = path; return s }
func (s step) after(d time.Duration) step { s.advance = d; return s }
func (s step) from(remote string) step    { s.remote = remote; return s }
func (s step) with(kv ...string) step {
	h := http.Header{}
	for k, vs := range s.header {
		h[k] = slices.Clone(vs)
	}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	s.header = h
	return s
}

// repeat returns n copies of s.
func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func steps(groups ...any) []step {
	var out []step
	for _, g := range groups {
		switch g := g.(type) {
		case step:
			out = append(out, g)
		case []step:
			out = append(out, g...)
		}
	}
	return out
}

// on installs rules on the route /users/{id}.
func on(rules ...core.Rule) app {
	return app{routes: []route{{path: "/users/{id}", rules: rules}}}
}

func perMinute(name string, n int64) core.Rule {
	return core.Rule{Name: name, Limits: []core.Limit{core.PerMinute(n)}}
}

func with(r core.Rule, f func(*core.Rule)) core.Rule { f(&r); return r }

var (
	trustedProxies = keyfuncs.IP(netip.MustParsePrefix("10.0.0.0/8"))
	errNoTenant    = errors.New("no tenant")
)

func scenarios() []scenario {
	const (
		policy3 = `"3-per-1m";q=3;w=60`
	)
	trusted := func(name string) core.Rule {
		return with(perMinute(name, 1), func(r *core.Rule) { r.Key = trustedProxies })
	}
	return []scenario{
		{
			name: "headers count down, then 429",
			app:  on(perMinute("countdown", 3)),
			steps: steps(
				ok(xrl(3, 2, 60)), ok(xrl(3, 1, 60)), ok(xrl(3, 0, 60)),
				tooMany(60, xrl(3, 0, 60)), tooMany(60, xrl(3, 0, 60)),
			),
			wantKeys:    repeatString(5, "countdown:ip:192.0.2.1"),
			wantAllowed: []bool{true, true, true, false, false},
		},
		{
			name: "spoofed forwarding headers from an untrusted peer do not change the key",
			app:  on(perMinute("spoof", 2)),
			steps: steps(
				ok(xrl(2, 1, 60)).with("X-Forwarded-For", "198.51.100.1", "X-Real-IP", "198.51.100.2", "True-Client-IP", "198.51.100.3"),
				ok(xrl(2, 0, 60)).with("X-Forwarded-For", "198.51.100.4, 198.51.100.5", "X-Real-IP", "198.51.100.6", "True-Client-IP", "198.51.100.7"),
				tooMany(60, xrl(2, 0, 60)).with("X-Forwarded-For", "198.51.100.8", "X-Real-IP", "198.51.100.9", "True-Client-IP", "198.51.100.10"),
			),
			wantKeys: repeatString(3, "spoof:ip:192.0.2.1"),
		},
		{
			name: "trusted proxy: the rightmost untrusted address of X-Forwarded-For",
			app:  on(trusted("proxy")),
			steps: steps(
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "198.51.100.66, 203.0.113.5"),
				tooMany(60, xrl(1, 0, 60)).from("203.0.113.5:4711"),
			),
			wantKeys: repeatString(2, "proxy:ip:203.0.113.5"),
		},
		{
			name: "trusted proxy: two X-Forwarded-For lines are merged",
			app:  on(trusted("lines")),
			steps: steps(
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "198.51.100.66", "X-Forwarded-For", "203.0.113.5, 10.0.0.2"),
				tooMany(60, xrl(1, 0, 60)).from("10.9.9.9:4711").with("X-Forwarded-For", "203.0.113.5"),
			),
			wantKeys: repeatString(2, "lines:ip:203.0.113.5"),
		},
		{
			name: "trusted proxy: entries left of the client are never read, so a bad one cannot send it to the proxy's key",
			app:  on(trusted("left")),
			steps: steps(
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "x, 203.0.113.7"),
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", `"quoted", 198.51.100.8`),
				tooMany(60, xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "unknown, 203.0.113.7"),
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711"), // the load balancer's health check
			),
			wantKeys: []string{"left:ip:203.0.113.7", "left:ip:198.51.100.8", "left:ip:203.0.113.7", "left:ip:10.0.0.1"},
		},
		{
			name: "trusted proxy: a bad client entry is a key error (OnError), limited under the fallback key, never the proxy's own key",
			app:  on(trusted("malformed")),
			steps: steps(
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "203.0.113.5, unknown"),
				tooMany(60, xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "not-an-ip"),
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711"),
			),
			wantKeys:   []string{"malformed:nokey:ip:10.0.0.1", "malformed:nokey:ip:10.0.0.1", "malformed:ip:10.0.0.1"},
			wantErrors: 2,
		},
		{
			name: "trusted proxy: a bad client entry is limited under the fallback key, whatever the failure mode",
			opts: []core.Option{core.WithFailureMode(core.FailClosed)},
			app:  on(trusted("malformed-closed")),
			steps: steps(
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "203.0.113.5, 203.0.113.05"),
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711"),
			),
			wantKeys:   []string{"malformed-closed:nokey:ip:10.0.0.1", "malformed-closed:ip:10.0.0.1"},
			wantErrors: 1,
		},
		{
			name: "IPv6 clients are grouped by /64",
			app:  on(perMinute("v6", 1)),
			steps: steps(
				ok(xrl(1, 0, 60)).from("[2001:db8:1:2::5]:4711"),
				tooMany(60, xrl(1, 0, 60)).from("[2001:db8:1:2:ffff:ffff:ffff:ffff]:4711"),
				ok(xrl(1, 0, 60)).from("[2001:db8:1:3::5]:4711"),
			),
			wantKeys: []string{"v6:ip:2001:db8:1:2::/64", "v6:ip:2001:db8:1:2::/64", "v6:ip:2001:db8:1:3::/64"},
		},
		{
			name: "an IPv4-mapped IPv6 peer is its IPv4 address",
			app:  on(perMinute("mapped", 1)),
			steps: steps(
				ok(xrl(1, 0, 60)).from("[::ffff:192.0.2.7]:4711"),
				tooMany(60, xrl(1, 0, 60)).from("192.0.2.7:4711"),
			),
			wantKeys: repeatString(2, "mapped:ip:192.0.2.7"),
		},
		{
			name: "route pattern keys are shared across /users/1 and /users/2",
			app:  on(with(perMinute("route", 1), func(r *core.Rule) { r.Key = keyfuncs.Route() })),
			steps: steps(
				ok(xrl(1, 0, 60)).at("/users/1"),
				tooMany(60, xrl(1, 0, 60)).at("/users/2").from("198.51.100.9:1"),
			),
		},
		{
			name: "route pattern keys in router-wide middleware, installed before routing",
			app: app{
				global: []core.Rule{with(perMinute("route-global", 1), func(r *core.Rule) { r.Key = keyfuncs.Route() })},
				routes: []route{{path: "/users/{id}"}, {path: "/teams/{team}/members/{id}"}},
			},
			steps: steps(
				ok(xrl(1, 0, 60)).at("/users/1"),
				tooMany(60, xrl(1, 0, 60)).at("/users/2"),
				ok(xrl(1, 0, 60)).at("/teams/a/members/1"),
				tooMany(60, xrl(1, 0, 60)).at("/teams/b/members/2"),
			),
			wantAllowed: []bool{true, false, true, false},
		},
		{
			name: "Skip passes without counting",
			app: app{routes: []route{
				{path: "/health", rules: []core.Rule{with(perMinute("skip", 1), func(r *core.Rule) {
					r.Skip = func(r *http.Request) bool { return r.URL.Path == "/health" }
				})}},
				{path: "/users/{id}", rules: []core.Rule{with(perMinute("skip", 1), func(r *core.Rule) {
					r.Skip = func(r *http.Request) bool { return r.URL.Path == "/health" }
				})}},
			}},
			steps: steps(
				repeat(3, ok(nil).at("/health")),
				ok(xrl(1, 0, 60)),
				tooMany(60, xrl(1, 0, 60)),
			),
			wantKeys: repeatString(2, "skip:ip:192.0.2.1"),
		},
		{
			name: "Cost takes several units; a cost above the limit never passes",
			app: on(with(perMinute("cost", 5), func(r *core.Rule) {
				r.Cost = func(r *http.Request) int64 {
					n, err := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
					if err != nil {
						return 1
					}
					return n
				}
			})),
			steps: steps(
				ok(xrl(5, 3, 60)).with("X-Cost", "2"),
				ok(xrl(5, 1, 60)).with("X-Cost", "2"),
				tooMany(60, xrl(5, 1, 60)).with("X-Cost", "2"),
				ok(xrl(5, 0, 60)),
				tooMany(0, xrl(5, 0, 60)).with("X-Cost", "6"),
			),
			wantAllowed: []bool{true, true, false, true, false},
		},
		{
			name: "a cost below 1 is an error: OnError, and the request costs 1",
			app: on(with(perMinute("cost0", 2), func(r *core.Rule) {
				r.Cost = func(*http.Request) int64 { return 0 }
			})),
			steps:      steps(ok(xrl(2, 1, 60)), ok(xrl(2, 0, 60)), tooMany(60, xrl(2, 0, 60))),
			wantKeys:   repeatString(3, "cost0:ip:192.0.2.1"),
			wantErrors: 3,
		},
		{
			name: "DryRun counts and sets headers but never denies",
			app:  on(with(perMinute("dry", 1), func(r *core.Rule) { r.DryRun = true })),
			steps: steps(
				ok(xrl(1, 0, 60)),
				ok(xrl(1, 0, 60)),
			),
			wantKeys:    repeatString(2, "dry:ip:192.0.2.1"),
			wantAllowed: []bool{true, false},
		},
		{
			name: "IETF header fields",
			app:  on(with(perMinute("ietf", 3), func(r *core.Rule) { r.Headers = core.IETF })),
			steps: steps(
				ok(ietf(policy3, `"3-per-1m";r=2;t=60`)),
				ok(ietf(policy3, `"3-per-1m";r=1;t=60`)),
				ok(ietf(policy3, `"3-per-1m";r=0;t=60`)),
				tooMany(60, ietf(policy3, `"3-per-1m";r=0;t=60`)),
			),
		},
		{
			name: "both header styles, two limits: the policy lists both, the binding one shows",
			app: on(core.Rule{Name: "both", Headers: core.Both, Limits: []core.Limit{
				{Name: `burst "b"`, Count: 10, Window: time.Second},
				core.PerMinute(2),
			}}),
			steps: steps(
				ok(merge(xrl(2, 1, 60), ietf(`"burst \"b\"";q=10;w=1, "2-per-1m";q=2;w=60`, `"2-per-1m";r=1;t=60`))),
				ok(merge(xrl(2, 0, 60), ietf(`"burst \"b\"";q=10;w=1, "2-per-1m";q=2;w=60`, `"2-per-1m";r=0;t=60`))),
				tooMany(60, merge(xrl(2, 0, 60), ietf(`"burst \"b\"";q=10;w=1, "2-per-1m";q=2;w=60`, `"2-per-1m";r=0;t=60`))),
			),
		},
		{
			name: "header style None: only Retry-After on a denial",
			app:  on(with(perMinute("none", 1), func(r *core.Rule) { r.Headers = core.None })),
			steps: steps(
				ok(nil),
				tooMany(60, nil),
			),
		},
		{
			name: "problem+json when the client accepts it",
			app:  on(perMinute("problem", 1)),
			steps: steps(
				ok(xrl(1, 0, 60)),
				problem(60, "1-per-1m", xrl(1, 0, 60)).with("Accept", "text/html, application/problem+json;q=0.9"),
				tooMany(60, xrl(1, 0, 60)).with("Accept", "application/problem+json;q=0"),
				tooMany(60, xrl(1, 0, 60)).with("Accept", "application/json"),
			),
		},
		{
			name: "problem+json always when the rule says so",
			app:  on(with(perMinute("problem-rule", 1), func(r *core.Rule) { r.ProblemJSON = true; r.Headers = core.IETF })),
			steps: steps(
				ok(ietf(`"1-per-1m";q=1;w=60`, `"1-per-1m";r=0;t=60`)),
				problem(60, "1-per-1m", ietf(`"1-per-1m";q=1;w=60`, `"1-per-1m";r=0;t=60`)),
			),
		},
		{
			name: "two rules with different names keep separate counters",
			app: app{routes: []route{
				{path: "/a", rules: []core.Rule{perMinute("rule-a", 1)}},
				{path: "/b", rules: []core.Rule{perMinute("rule-b", 1)}},
			}},
			steps: steps(
				ok(xrl(1, 0, 60)).at("/a"),
				ok(xrl(1, 0, 60)).at("/b"),
				tooMany(60, xrl(1, 0, 60)).at("/a"),
				tooMany(60, xrl(1, 0, 60)).at("/b"),
			),
			wantKeys: []string{"rule-a:ip:192.0.2.1", "rule-b:ip:192.0.2.1", "rule-a:ip:192.0.2.1", "rule-b:ip:192.0.2.1"},
		},
		{
			name: "LimitsFor: two plans, and a plan change mid-window keeps the history",
			app:  on(plans("plans")),
			steps: steps(
				// the default limits when LimitsFor gives none
				ok(merge(xrl(1, 0, 60), ietf(`"1-per-1m";q=1;w=60`, `"1-per-1m";r=0;t=60`))).with("X-Api-Key", "k0"),
				ok(merge(xrl(2, 1, 60), ietf(`"free";q=2;w=60`, `"free";r=1;t=60`))).with("X-Api-Key", "k1", "X-Plan", "free"),
				ok(merge(xrl(4, 3, 60), ietf(`"pro";q=4;w=60`, `"pro";r=3;t=60`))).with("X-Api-Key", "k2", "X-Plan", "pro"),
				ok(merge(xrl(2, 0, 60), ietf(`"free";q=2;w=60`, `"free";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "free"),
				tooMany(60, merge(xrl(2, 0, 60), ietf(`"free";q=2;w=60`, `"free";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "free"),
				// k1 upgrades: its two units are still counted, under 4
				ok(merge(xrl(4, 1, 60), ietf(`"pro";q=4;w=60`, `"pro";r=1;t=60`))).with("X-Api-Key", "k1", "X-Plan", "pro"),
				ok(merge(xrl(4, 0, 60), ietf(`"pro";q=4;w=60`, `"pro";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "pro"),
				tooMany(60, merge(xrl(4, 0, 60), ietf(`"pro";q=4;w=60`, `"pro";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "pro"),
				// and back: over the free plan at once
				tooMany(60, merge(xrl(2, 0, 60), ietf(`"free";q=2;w=60`, `"free";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "free"),
			),
			wantKeys: []string{"plans:h:x-api-key:k0", "plans:h:x-api-key:k1", "plans:h:x-api-key:k2", "plans:h:x-api-key:k1", "plans:h:x-api-key:k1",
				"plans:h:x-api-key:k1", "plans:h:x-api-key:k1", "plans:h:x-api-key:k1", "plans:h:x-api-key:k1"},
		},
		{
			name: "LimitsFor: an error or invalid limits go to OnError, and the rule's limits decide",
			app:  on(plans("plans-bad")),
			steps: steps(
				ok(merge(xrl(1, 0, 60), ietf(`"1-per-1m";q=1;w=60`, `"1-per-1m";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "gold"),            // unknown plan: an error
				tooMany(60, merge(xrl(1, 0, 60), ietf(`"1-per-1m";q=1;w=60`, `"1-per-1m";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "broken"), // a limit of Count 0
				tooMany(60, merge(xrl(1, 0, 60), ietf(`"1-per-1m";q=1;w=60`, `"1-per-1m";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "twice"),  // two limits of one policy name
				// the same stored state (a sliding log of a minute): one unit is counted
				ok(merge(xrl(2, 0, 60), ietf(`"free";q=2;w=60`, `"free";r=0;t=60`))).with("X-Api-Key", "k1", "X-Plan", "free"),
			),
			wantKeys:   repeatString(4, "plans-bad:h:x-api-key:k1"),
			wantErrors: 3,
		},
		{
			name: "CountIf: 200s never exhaust the limit, 401s do; its numbers show only on its denial",
			app:  on(with(perMinute("failed-logins", 2), func(r *core.Rule) { r.CountIf = failedLogin })),
			steps: steps(
				repeat(4, answered(200, nil)),
				answered(401, nil),
				answered(200, nil), // charged, then given back
				answered(403, nil),
				tooMany(60, xrl(2, 0, 60)).with("X-Status", "200"),
			),
			wantAllowed: []bool{true, true, true, true, true, true, true, false},
		},
		{
			name: "CountIf: a 500 counts when CountIf says so, and a refund frees the slot at once",
			app: on(with(perMinute("errors", 1), func(r *core.Rule) {
				r.CountIf = func(status int) bool { return status >= 500 }
			})),
			steps: steps(
				answered(404, nil),
				answered(500, nil),
				tooMany(60, xrl(1, 0, 60)),
			),
		},
		{
			name: "CountIf beside a plan's rule: allowed requests show the plan's numbers, in the first rule's style",
			app: on(with(perMinute("logins", 1), func(r *core.Rule) { r.CountIf = failedLogin; r.Headers = core.Both }),
				with(perMinute("plan", 3), func(r *core.Rule) { r.Headers = core.IETF })),
			steps: steps(
				answered(200, merge(xrl(3, 2, 60), ietf(`"3-per-1m";q=3;w=60`, `"3-per-1m";r=2;t=60`))),
				answered(401, merge(xrl(3, 1, 60), ietf(`"3-per-1m";q=3;w=60`, `"3-per-1m";r=1;t=60`))),
				// the login rule denies: its numbers
				tooMany(60, merge(xrl(1, 0, 60), ietf(`"1-per-1m";q=1;w=60`, `"1-per-1m";r=0;t=60`))),
			),
		},
		{
			name: "Penalty: the second denial bans the client for an hour; bans are answered by the deny cache",
			app: on(with(perMinute("penalty", 1), func(r *core.Rule) {
				r.Penalty = &core.Penalty{Denials: 2, Within: time.Minute, Ban: time.Hour}
			})),
			steps: steps(
				ok(xrl(1, 0, 60)),
				tooMany(60, xrl(1, 0, 60)),
				tooMany(3600, xrl(1, 0, 3600)),
				tooMany(3600, xrl(1, 0, 3600)),
				// a client can tell a ban from a limit: abnormal-usage-detected
				banned(3600, xrl(1, 0, 3600)).with("Accept", "application/problem+json"),
				ok(xrl(1, 0, 60)).from("198.51.100.7:1"), // another client
				// whose denial is a limit's: quota-exceeded
				problem(60, "1-per-1m", xrl(1, 0, 60)).from("198.51.100.7:1").with("Accept", "application/problem+json"),
			),
			wantAllowed: []bool{true, false, false, false, false, true, false},
			wantBanned:  []bool{false, false, true, false, false, false, false},
		},
		{
			name: "Refund: Retry-After follows at once, never below empty",
			app: app{
				routes: []route{
					{path: "/users/{id}", rules: []core.Rule{perMinute("refund", 2)}},
					{path: "/refund/{n}"}, // gives back n units of the client's key
				},
				handlerFor: refundHandler("refund:ip:192.0.2.1", core.PerMinute(2)),
			},
			steps: steps(
				ok(xrl(2, 1, 60)),
				ok(xrl(2, 0, 60)).after(10*time.Second),
				tooMany(50, xrl(2, 0, 60)), // the unit of t0 leaves first
				ok(nil).at("/refund/1"),    // the newest, of t10, goes
				ok(xrl(2, 0, 60)),
				tooMany(50, xrl(2, 0, 60)),
				ok(nil).at("/refund/5"), // more than there is: empty, no less
				ok(xrl(2, 1, 60)),
				ok(xrl(2, 0, 60)),
				tooMany(60, xrl(2, 0, 60)),
			),
		},
		{
			name: "Penalty: the ban outlasts the window and ends on time",
			app: on(with(perMinute("penalty-ends", 1), func(r *core.Rule) {
				r.Penalty = &core.Penalty{Denials: 2, Within: time.Minute, Ban: 5 * time.Minute}
			})),
			steps: steps(
				ok(xrl(1, 0, 60)),
				tooMany(60, xrl(1, 0, 60)),
				tooMany(300, xrl(1, 0, 300)),
				tooMany(240, xrl(1, 0, 240)).after(time.Minute), // the window has passed; the ban has not
				tooMany(1, xrl(1, 0, 1)).after(239*time.Second),
				ok(xrl(1, 0, 60)).after(time.Second),
			),
			wantBanned: []bool{false, false, true, false, false, false},
		},
		{
			name: "draft-11: the partition key, a digest of the key, on both fields",
			app: on(with(perMinute("pk", 2), func(r *core.Rule) {
				r.Headers, r.PartitionKey = core.IETF, true
			})),
			steps: steps(
				ok(ietf(`"2-per-1m";q=2;w=60`+pk("pk:ip:192.0.2.1"), `"2-per-1m";r=1;t=60`+pk("pk:ip:192.0.2.1"))),
				ok(ietf(`"2-per-1m";q=2;w=60`+pk("pk:ip:198.51.100.7"), `"2-per-1m";r=1;t=60`+pk("pk:ip:198.51.100.7"))).from("198.51.100.7:1"),
			),
		},
		{
			name: "draft-11: problem+json lists every policy that denied",
			app: on(core.Rule{Name: "violated", Headers: core.IETF, ProblemJSON: true, Limits: []core.Limit{
				core.PerMinute(1), core.PerHour(1), core.PerSecond(5),
			}}),
			steps: steps(
				ok(ietf(`"1-per-1m";q=1;w=60, "1-per-1h";q=1;w=3600, "5-per-1s";q=5;w=1`, `"1-per-1h";r=0;t=3600`)),
				problem(3600, "1-per-1m", ietf(`"1-per-1m";q=1;w=60, "1-per-1h";q=1;w=3600, "5-per-1s";q=5;w=1`, `"1-per-1h";r=0;t=3600`), "1-per-1h"),
			),
		},
		stacked("stacked rules show the most restrictive (loose outside)", false),
		stacked("stacked rules show the most restrictive (strict outside)", true),
		{
			name: "stacked rules: an outer rule counts the requests an inner rule denies, then denies them and bans",
			app: app{
				global: []core.Rule{with(perMinute("ip", 10), func(r *core.Rule) {
					r.Penalty = &core.Penalty{Denials: 3, Within: time.Minute, Ban: time.Hour}
				})},
				routes: []route{{path: "/users/{id}", rules: []core.Rule{with(perMinute("account", 1), func(r *core.Rule) {
					r.Key = keyfuncs.Header("X-Account")
				})}}},
			},
			steps: steps(
				ok(xrl(1, 0, 60)).with("X-Account", "a"),
				repeat(9, tooMany(60, xrl(1, 0, 60)).with("X-Account", "a")),  // the inner rule's: the outer one counts them
				repeat(2, tooMany(60, xrl(10, 0, 60)).with("X-Account", "a")), // the outer rule's
				tooMany(3600, xrl(10, 0, 3600)).with("X-Account", "a"),        // its third denial bans
				banned(3600, xrl(10, 0, 3600)).with("X-Account", "a", "Accept", "application/problem+json"),
			),
			wantAllowed: slices.Concat([]bool{true, true}, slices.Repeat([]bool{true, false}, 9), slices.Repeat([]bool{false}, 4)),
			wantBanned:  slices.Concat(slices.Repeat([]bool{false}, 22), []bool{true, false}),
		},
		{
			name: "stacked rules: a request an inner rule denies gives an outer rule with RefundIfStopped its unit back",
			app: app{
				global: []core.Rule{with(perMinute("outer", 3), func(r *core.Rule) { r.RefundIfStopped = true })},
				routes: []route{{path: "/users/{id}", rules: []core.Rule{perMinute("inner", 1)}}, {path: "/b"}},
			},
			steps: steps(
				ok(xrl(1, 0, 60)),
				repeat(3, tooMany(60, xrl(1, 0, 60))),
				ok(xrl(3, 1, 60)).at("/b"),
				ok(xrl(3, 0, 60)).at("/b"),
				tooMany(60, xrl(3, 0, 60)).at("/b"),
			),
			wantKeys: slices.Concat(
				slices.Repeat([]string{"outer:ip:192.0.2.1", "inner:ip:192.0.2.1"}, 4),
				repeatString(3, "outer:ip:192.0.2.1")),
			wantAllowed: []bool{true, true, true, false, true, false, true, false, true, true, false},
		},
		{
			name: "stacked rules: a request an inner rule's OnError answers gives an outer rule with RefundIfStopped its unit back, and shows no fields",
			app: app{
				global: []core.Rule{with(perMinute("outer", 3), func(r *core.Rule) { r.RefundIfStopped = true })},
				routes: []route{{path: "/users/{id}", rules: []core.Rule{with(perMinute("inner", 1), func(r *core.Rule) {
					r.Key = keyfuncs.Header("X-Api-Key")
					r.OnError = func(w http.ResponseWriter, _ *http.Request, _ error) {
						http.Error(w, "an API key is required", http.StatusUnauthorized)
					}
				})}}, {path: "/b"}},
			},
			steps: steps(
				repeat(3, step{status: 401, body: "an API key is required\n", want: fields("Content-Type", "text/plain; charset=utf-8", "X-Content-Type-Options", "nosniff")}),
				ok(xrl(3, 2, 60)).at("/b"),
				ok(xrl(1, 0, 60)).with("X-Api-Key", "k1"),
			),
			wantKeys: slices.Concat(repeatString(5, "outer:ip:192.0.2.1"), []string{"inner:h:x-api-key:k1"}),
		},
		{
			name: "a key function's result never reaches the fallback keys, whatever it returns",
			app: on(with(perMinute("raw", 1), func(r *core.Rule) {
				r.Key = func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil }
			})),
			steps: steps(
				ok(xrl(1, 0, 60)).with("X-Key", "nokey:ip:198.51.100.7"),
				ok(xrl(1, 0, 60)).from("198.51.100.7:4711"), // keyless: its own fallback key
				ok(xrl(1, 0, 60)).with("X-Key", "~nokey:ip:198.51.100.7"),
				ok(xrl(1, 0, 60)).with("X-Key", "nokey"),
				ok(xrl(1, 0, 60)).from("198.51.100.8:4711"),
			),
			wantKeys:   []string{"raw:~nokey:ip:198.51.100.7", "raw:nokey:ip:198.51.100.7", "raw:~~nokey:ip:198.51.100.7", "raw:~nokey", "raw:nokey:ip:198.51.100.8"},
			wantErrors: 2,
		},
		{
			name: "a key function error: OnError, then limited under the client's IP (FallbackKey's default)",
			app: on(with(perMinute("tenant", 1), func(r *core.Rule) {
				r.Key = func(r *http.Request) (string, error) {
					if t := r.Header.Get("X-Tenant"); t != "" {
						return "tenant:" + t, nil
					}
					return "", errNoTenant
				}
			})),
			steps: steps(
				ok(xrl(1, 0, 60)),
				ok(xrl(1, 0, 60)).with("X-Tenant", "acme"),
				tooMany(60, xrl(1, 0, 60)),
				tooMany(60, xrl(1, 0, 60)).with("X-Tenant", "acme"),
				ok(xrl(1, 0, 60)).from("198.51.100.7:4711"), // another client without a key
			),
			wantKeys:   []string{"tenant:nokey:ip:192.0.2.1", "tenant:tenant:acme", "tenant:nokey:ip:192.0.2.1", "tenant:tenant:acme", "tenant:nokey:ip:198.51.100.7"},
			wantErrors: 3,
		},
		{
			name: "a missing header is limited under FallbackKey, whatever the failure mode",
			opts: []core.Option{core.WithFailureMode(core.FailClosed)},
			app: on(with(perMinute("closed-key", 1), func(r *core.Rule) {
				r.Key = keyfuncs.Header("X-Api-Key")
				r.FallbackKey = keyfuncs.IP(netip.MustParsePrefix("10.0.0.1/32"))
			})),
			steps: steps(
				ok(xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "203.0.113.9"),
				tooMany(60, xrl(1, 0, 60)).from("10.0.0.1:4711").with("X-Forwarded-For", "203.0.113.9"),
				ok(xrl(1, 0, 60)).with("X-Api-Key", "k1"),
			),
			wantKeys:   []string{"closed-key:nokey:ip:203.0.113.9", "closed-key:nokey:ip:203.0.113.9", "closed-key:h:x-api-key:k1"},
			wantErrors: 2,
		},
		{
			name: "a key error that OnError answers stops the request",
			app: on(with(perMinute("onerror-answers", 1), func(r *core.Rule) {
				r.Key = keyfuncs.Header("X-Api-Key")
				r.OnError = func(w http.ResponseWriter, _ *http.Request, _ error) {
					http.Error(w, "an API key is required", http.StatusUnauthorized)
				}
			})),
			steps: steps(
				step{status: 401, body: "an API key is required\n", want: fields("Content-Type", "text/plain; charset=utf-8", "X-Content-Type-Options", "nosniff")},
				ok(xrl(1, 0, 60)).with("X-Api-Key", "k1"),
			),
			wantKeys: []string{"onerror-answers:h:x-api-key:k1"},
		},
		{
			name:       "Redis does not answer: fail closed with 503",
			backend:    silentRedis,
			opts:       []core.Option{core.WithFailureMode(core.FailClosed)},
			app:        on(perMinute("closed", 5)),
			steps:      steps(unavailable(), unavailable()),
			wantErrors: 2,
		},
		{
			name:       "Redis does not answer: fail closed with the temporary-reduced-capacity problem",
			backend:    silentRedis,
			opts:       []core.Option{core.WithFailureMode(core.FailClosed)},
			app:        on(core.Rule{Name: "closed-problem", Limits: []core.Limit{core.PerMinute(5), core.PerHour(50)}}),
			steps:      steps(unavailableProblem("5-per-1m", "50-per-1h").with("Accept", "application/problem+json")),
			wantErrors: 1,
		},
		{
			name:       "Redis does not answer: fail open without headers",
			backend:    silentRedis,
			app:        on(perMinute("open", 5)),
			steps:      steps(ok(nil), ok(nil)),
			wantErrors: 2,
		},
		{
			name:       "Redis does not answer: fail local decides in memory",
			backend:    silentRedis,
			opts:       []core.Option{core.WithFailureMode(core.FailLocal), core.WithLocalShare(1)},
			app:        on(perMinute("local", 1)),
			steps:      steps(ok(xrl(1, 0, 60)), tooMany(60, xrl(1, 0, 60))),
			wantErrors: 2,
		},
		{
			name:    "Redis does not answer: fail local with this replica's share of the limit",
			backend: silentRedis,
			opts:    []core.Option{core.WithFailureMode(core.FailLocal), core.WithLocalShare(0.5)},
			app:     on(with(perMinute("share", 4), func(r *core.Rule) { r.Headers = core.Both })),
			// the rule's limit in both styles (one policy a response), this
			// replica's share's remaining: 2 of 4
			steps: steps(
				ok(merge(xrl(4, 1, 60), ietf(`"4-per-1m";q=4;w=60`, `"4-per-1m";r=1;t=60`))),
				ok(merge(xrl(4, 0, 60), ietf(`"4-per-1m";q=4;w=60`, `"4-per-1m";r=0;t=60`))),
				problem(60, "4-per-1m", merge(xrl(4, 0, 60), ietf(`"4-per-1m";q=4;w=60`, `"4-per-1m";r=0;t=60`))).with("Accept", "application/problem+json"),
			),
			wantErrors: 3,
		},
	}
}

// stacked installs a loose rule (5 per minute, IETF fields) and a strict one
// (2 per minute, X-RateLimit fields) on one route, in either order: the
// response must always show the strict one.
func stacked(name string, strictOutside bool) scenario {
	loose := with(perMinute("loose", 5), func(r *core.Rule) { r.Headers = core.IETF })
	strict := perMinute("strict", 2)
	rules := []core.Rule{loose, strict}
	if strictOutside {
		rules = []core.Rule{strict, loose}
	}
	// one style per response: the first rule's that shows fields
	fields := func(remaining int) map[string]string {
		if strictOutside {
			return xrl(2, remaining, 60)
		}
		return ietf(`"2-per-1m";q=2;w=60`, fmt.Sprintf(`"2-per-1m";r=%d;t=60`, remaining))
	}
	return scenario{
		name: name,
		app:  on(rules...),
		steps: steps(
			ok(fields(1)),
			ok(fields(0)),
			tooMany(60, fields(0)),
		),
	}
}

// plans returns a rule that limits each API key (X-Api-Key) by the plan the
// request names (X-Plan), both fields: free 2 a minute, pro 4; no plan
// gives the default, 1 a minute; other plans are errors or invalid.
func plans(name string) core.Rule {
	free := []core.Limit{{Name: "free", Count: 2, Window: time.Minute}}
	pro := []core.Limit{{Name: "pro", Count: 4, Window: time.Minute}}
	return core.Rule{
		Name:    name,
		Limits:  []core.Limit{core.PerMinute(1)},
		Key:     keyfuncs.Header("X-Api-Key"),
		Headers: core.Both,
		LimitsFor: func(r *http.Request) ([]core.Limit, error) {
			switch p := r.Header.Get("X-Plan"); p {
			case "":
				return nil, nil
			case "free":
				return free, nil
			case "pro":
				// a new slice every time, equal to the last one
				return []core.Limit{{Name: "pro", Count: 4, Window: time.Minute}}, nil
			case "broken":
				return []core.Limit{{Name: "broken", Count: 0, Window: time.Minute}}, nil
			case "twice":
				return []core.Limit{{Name: "x", Count: 1, Window: time.Minute}, {Name: "x", Count: 1, Window: time.Hour}}, nil
			default:
				_ = pro
				return nil, fmt.Errorf("unknown plan %q", p)
			}
		},
	}
}

// refundHandler answers /refund/{n} by giving back n units of key under
// limits (Limiter.Refund), and every other route with okHandler.
func refundHandler(key string, limits ...core.Limit) func(*core.Limiter) http.HandlerFunc {
	return func(l *core.Limiter) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if rest, found := strings.CutPrefix(r.URL.Path, "/refund/"); found {
				n, _ := strconv.ParseInt(rest, 10, 64)
				if err := l.Refund(r.Context(), key, n, limits...); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			okHandler(w, r)
		}
	}
}

// failedLogin counts failed logins only.
func failedLogin(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden
}

func repeatString(n int, s string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// recorder collects the observer's events and the OnError calls.
type recorder struct {
	mu      sync.Mutex
	keys    []string
	allowed []bool
	banned  []bool
	errs    []error
}

func (rec *recorder) observe(ev core.Event) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.keys = append(rec.keys, ev.Key)
	rec.allowed = append(rec.allowed, ev.Result.Allowed)
	rec.banned = append(rec.banned, ev.Banned)
}

func (rec *recorder) onError(_ http.ResponseWriter, _ *http.Request, err error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.errs = append(rec.errs, err)
}

// TestAdapters runs every scenario through every adapter, on a real Redis
// and on a real Redis Cluster.
func TestAdapters(t *testing.T) {
	t.Run("redis", func(t *testing.T) { testAdapters(t, redistest.New(t).Client(t), false) })
	t.Run("cluster", func(t *testing.T) { testAdapters(t, redistest.NewCluster(t).Client(t), true) })
}

func testAdapters(t *testing.T, rdb redis.Scripter, cluster bool) {
	run := time.Now().UnixNano()
	for i, sc := range scenarios() {
		if cluster && sc.backend == silentRedis {
			continue // no Redis at all: once is enough
		}
		t.Run(sc.name, func(t *testing.T) {
			for _, ad := range adapters {
				t.Run(ad.name, func(t *testing.T) {
					rec := &recorder{}
					var clock sync.Mutex
					now := time.Now()
					client := redis.Scripter(rdb)
					opts := []core.Option{
						core.WithPrefix(fmt.Sprintf("mwtest:%d:%d:%s:", run, i, ad.name)),
						core.WithObserver(rec.observe),
						// A frozen clock (passed to the scripts instead of
						// Redis TIME): the exact Retry-After and Reset values
						// do not depend on how fast the requests run.
						core.WithClock(func() time.Time { clock.Lock(); defer clock.Unlock(); return now }),
						// A generous timeout: scenarios that expect Redis
						// to answer must not fail open under a loaded CI.
						core.WithTimeout(5 * time.Second),
					}
					if sc.backend == silentRedis {
						c := redis.NewClient(&redis.Options{
							Addr:                  redistest.Silent(t),
							MaxRetries:            -1,
							ContextTimeoutEnabled: true, // reads end at the Limiter's timeout
							ReadTimeout:           time.Second,
						})
						t.Cleanup(func() { _ = c.Close() })
						client = c
						opts = append(opts, core.WithTimeout(20*time.Millisecond))
					}
					l, err := core.New(client, append(opts, sc.opts...)...)
					if err != nil {
						t.Fatal(err)
					}
					a := withOnError(sc.app, rec.onError)
					if a.handlerFor != nil {
						a.handler = a.handlerFor(l)
					}
					h := ad.build(l, a)
					for j, st := range sc.steps {
						clock.Lock()
						now = now.Add(st.advance)
						clock.Unlock()
						checkStep(t, h, j, st)
					}
					rec.mu.Lock()
					defer rec.mu.Unlock()
					if sc.wantKeys != nil && !slices.Equal(rec.keys, sc.wantKeys) {
						t.Errorf("observed keys %q, want %q", rec.keys, sc.wantKeys)
					}
					if sc.wantAllowed != nil && !slices.Equal(rec.allowed, sc.wantAllowed) {
						t.Errorf("observed Allowed %v, want %v", rec.allowed, sc.wantAllowed)
					}
					if sc.wantBanned != nil && !slices.Equal(rec.banned, sc.wantBanned) {
						t.Errorf("observed Banned %v, want %v", rec.banned, sc.wantBanned)
					}
					if len(rec.errs) != sc.wantErrors {
						t.Errorf("OnError called with %v, want %d calls", rec.errs, sc.wantErrors)
					}
				})
			}
		})
	}
}

// withOnError returns a with OnError set on every rule that has none.
func withOnError(a app, f func(http.ResponseWriter, *http.Request, error)) app {
	set := func(rules []core.Rule) []core.Rule {
		out := slices.Clone(rules)
		for i := range out {
			if out[i].OnError == nil {
				out[i].OnError = f
			}
		}
		return out
	}
	b := app{global: set(a.global), handler: a.handler, handlerFor: a.handlerFor}
	for _, rt := range a.routes {
		b.routes = append(b.routes, route{path: rt.path, rules: set(rt.rules)})
	}
	return b
}

func checkStep(t *testing.T, h http.Handler, i int, st step) {
	t.Helper()
	path := st.path
	if path == "" {
		path = "/users/1"
	}
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = "192.0.2.1:4711"
	if st.remote != "" {
		req.RemoteAddr = st.remote
	}
	for k, vs := range st.header {
		req.Header[k] = vs
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	got := map[string]string{}
	for k, vs := range rec.Header() {
		got[k] = strings.Join(vs, "\n")
	}
	want := st.want
	if want == nil {
		want = map[string]string{}
	}
	if rec.Code != st.status || rec.Body.String() != st.body || !maps.Equal(got, want) {
		t.Errorf("request %d (%s from %s, %v):\ngot  %d %q %v\nwant %d %q %v", i+1, path, req.RemoteAddr, st.header,
			rec.Code, rec.Body.String(), got, st.status, st.body, want)
	}
	checkStructuredFields(t, rec.Header())
}

// checkStructuredFields parses the IETF fields of a response as
// structured-field lists (RFC 8941, with github.com/dunglas/httpsfv) and
// checks them against draft-ietf-httpapi-ratelimit-headers-11: every item
// a String; RateLimit-Policy with an Integer q >= 0 and w >= 1, RateLimit
// with r >= 0 and an optional t >= 0; pk, when present, a Byte Sequence;
// no other parameter.
func checkStructuredFields(t *testing.T, h http.Header) {
	t.Helper()
	for field, params := range map[string]map[string]bool{ // parameter: required
		"Ratelimit-Policy": {"q": true, "w": true, "pk": false},
		"Ratelimit":        {"r": true, "t": false, "pk": false},
	} {
		vs, present := h[field]
		if !present {
			continue
		}
		list, err := httpsfv.UnmarshalList(vs)
		if err != nil || len(list) == 0 {
			t.Errorf("%s %q: not a structured-field list: %v", field, vs, err)
			continue
		}
		for _, m := range list {
			item, ok := m.(httpsfv.Item)
			if _, isString := item.Value.(string); !ok || !isString {
				t.Errorf("%s %q: an item is not a String: %#v", field, vs, m)
				continue
			}
			for _, name := range item.Params.Names() {
				if _, known := params[name]; !known {
					t.Errorf("%s %q: unknown parameter %s", field, vs, name)
				}
			}
			for name, required := range params {
				v, ok := item.Params.Get(name)
				switch {
				case !ok:
					if required {
						t.Errorf("%s %q: no %s", field, vs, name)
					}
				case name == "pk":
					if b, isBytes := v.([]byte); !isBytes || len(b) != 12 {
						t.Errorf("%s %q: pk is %#v, want 12 bytes", field, vs, v)
					}
				default:
					n, isInt := v.(int64)
					if !isInt || n < 0 || (name == "w" && n < 1) {
						t.Errorf("%s %q: %s is %#v", field, vs, name, v)
					}
				}
			}
		}
	}
}

// TestLimitByIP: every adapter's one-liner limits each client IP, and two
// of them with different limits keep their own counters.
func TestLimitByIP(t *testing.T) {
	for _, ad := range adapters {
		t.Run(ad.name, func(t *testing.T) {
			h := ad.byIP(core.NewMemory())
			var codes []int
			for _, ip := range []string{"203.0.113.9", "203.0.113.9", "203.0.113.9", "198.51.100.1"} {
				rec, req := httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil)
				req.RemoteAddr = ip + ":4000"
				h.ServeHTTP(rec, req)
				codes = append(codes, rec.Code)
			}
			if !slices.Equal(codes, []int{200, 200, 429, 200}) {
				t.Fatalf("codes %v, want [200 200 429 200]", codes)
			}
		})
	}
}

// TestInvalidRule: New returns a bad rule's error; Limit panics with it at
// start-up, naming itself.
func TestInvalidRule(t *testing.T) {
	for _, ad := range adapters {
		t.Run(ad.name, func(t *testing.T) {
			if err := ad.newErr(core.NewMemory(), core.Rule{Name: "x"}); !errors.Is(err, core.ErrNoLimits) {
				t.Errorf("New() = %v, want ErrNoLimits", err)
			}
			defer func() {
				err, _ := recover().(error)
				pkg := map[string]string{"chi": "chimw", "gin": "ginmw", "echo": "echomw"}[ad.name]
				if pkg == "" {
					pkg = ad.name
				}
				if !errors.Is(err, core.ErrInvalidRule) || !strings.Contains(err.Error(), "("+pkg+".Limit)") {
					t.Errorf("Limit panicked with %v, want an ErrInvalidRule naming %s.Limit", err, pkg)
				}
			}()
			ad.limit(core.NewMemory(), core.Rule{Limits: []core.Limit{core.PerMinute(1)}})
		})
	}
}

// TestLimitByIPMessages: LimitByIP panics at start-up with what is wrong,
// named after the call the user wrote, not after the rule it builds.
func TestLimitByIPMessages(t *testing.T) {
	byIP := map[string]func(l *core.Limiter, n int64, window time.Duration){
		"nethttp": func(l *core.Limiter, n int64, w time.Duration) { nethttp.LimitByIP(l, n, w) },
		"chimw":   func(l *core.Limiter, n int64, w time.Duration) { chimw.LimitByIP(l, n, w) },
		"ginmw":   func(l *core.Limiter, n int64, w time.Duration) { ginmw.LimitByIP(l, n, w) },
		"echomw":  func(l *core.Limiter, n int64, w time.Duration) { echomw.LimitByIP(l, n, w) },
	}
	for pkg, limitByIP := range byIP {
		for _, tc := range []struct {
			l      *core.Limiter
			n      int64
			window time.Duration
			want   string
			is     error
		}{
			{core.NewMemory(), 0, time.Minute, "ratewindow: invalid limit: count 0 must be > 0 (" + pkg + ".LimitByIP(l, 0, 1m0s))", core.ErrInvalidLimit},
			{core.NewMemory(), 5, 0, "ratewindow: invalid limit: window 0s must be from 1ms to MaxWindow (8784h0m0s) (" + pkg + ".LimitByIP(l, 5, 0s))", core.ErrInvalidLimit},
			{nil, 5, time.Minute, "ratewindow: nil Limiter (" + pkg + ".LimitByIP(l, 5, 1m0s))", nil},
		} {
			func() {
				defer func() {
					err, _ := recover().(error)
					if err == nil || err.Error() != tc.want || (tc.is != nil && !errors.Is(err, tc.is)) {
						t.Errorf("%s.LimitByIP(l, %d, %s) panicked with %v, want %q", pkg, tc.n, tc.window, err, tc.want)
					}
				}()
				limitByIP(tc.l, tc.n, tc.window)
			}()
		}
	}
}

// TestFrameworkKey: ginmw.Key and echomw.Key read what earlier middleware
// stored in the framework's context; a request without it is a key error,
// limited under the fallback key.
func TestFrameworkKey(t *testing.T) {
	rule := func(key keyfuncs.Func, errs *[]error) core.Rule {
		return core.Rule{Name: "orders", Limits: []core.Limit{core.PerMinute(1)}, Key: key,
			OnError: func(_ http.ResponseWriter, _ *http.Request, err error) { *errs = append(*errs, err) }}
	}
	apps := map[string]func(l *core.Limiter, errs *[]error) http.Handler{
		"gin": func(l *core.Limiter, errs *[]error) http.Handler {
			e := gin.New()
			auth := func(c *gin.Context) {
				if u := c.GetHeader("X-User"); u != "" {
					c.Set("user", u)
				}
			}
			e.GET("/", auth, ginmw.Limit(l, rule(ginmw.Key("user"), errs)), gin.WrapF(okHandler))
			return e
		},
		"echo": func(l *core.Limiter, errs *[]error) http.Handler {
			e := echo.New()
			auth := func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(c echo.Context) error {
					if u := c.Request().Header.Get("X-User"); u != "" {
						c.Set("user", u)
					}
					return next(c)
				}
			}
			e.GET("/", echo.WrapHandler(http.HandlerFunc(okHandler)), auth, echomw.Limit(l, rule(echomw.Key("user"), errs)))
			return e
		},
	}
	for name, build := range apps {
		t.Run(name, func(t *testing.T) {
			var errs []error
			var keys []string
			l := core.NewMemory(core.WithObserver(func(ev core.Event) { keys = append(keys, ev.Key) }))
			h := build(l, &errs)
			var codes []int
			for _, user := range []string{"ann", "ann", "bob", ""} {
				rec, req := httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil)
				if user != "" {
					req.Header.Set("X-User", user)
				}
				h.ServeHTTP(rec, req)
				codes = append(codes, rec.Code)
			}
			if !slices.Equal(codes, []int{200, 429, 200, 200}) || !slices.Equal(keys, []string{"orders:user:ann", "orders:user:ann", "orders:user:bob", "orders:nokey:ip:192.0.2.1"}) {
				t.Fatalf("codes %v, keys %q", codes, keys)
			}
			if len(errs) != 1 || !errors.Is(errs[0], keyfuncs.ErrNoKey) {
				t.Fatalf("OnError got %v, want one ErrNoKey", errs)
			}
		})
	}
}

// TestCountIfInFlight: under CountIf, requests in flight stay counted, so
// no more than Count run at once; once they answer with a status CountIf
// rejects, their units are back and as many run again. On real Redis, in
// every adapter.
func TestCountIfInFlight(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	for _, ad := range adapters {
		t.Run(ad.name, func(t *testing.T) {
			l, err := core.New(rdb, core.WithPrefix(fmt.Sprintf("inflight:%d:%s:", time.Now().UnixNano(), ad.name)), core.WithTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var inHandler atomic.Int32
			release := make(chan struct{})
			a := on(with(perMinute("in-flight", 3), func(r *core.Rule) { r.CountIf = failedLogin }))
			a.handler = func(w http.ResponseWriter, r *http.Request) {
				inHandler.Add(1)
				<-release
				okHandler(w, r)
			}
			h := ad.build(l, a)
			for round := 1; round <= 2; round++ {
				inHandler.Store(0)
				release = make(chan struct{})
				var denied, done atomic.Int32
				var wg sync.WaitGroup
				for range 10 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer done.Add(1)
						rec := httptest.NewRecorder()
						req := httptest.NewRequest(http.MethodGet, "/users/1", nil)
						req.RemoteAddr = "192.0.2.1:4711"
						h.ServeHTTP(rec, req)
						if rec.Code == http.StatusTooManyRequests {
							denied.Add(1)
						}
					}()
				}
				// every request is answered (429) or in its handler
				deadline := time.Now().Add(20 * time.Second)
				for done.Load()+inHandler.Load() < 10 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				running := inHandler.Load()
				close(release)
				wg.Wait()
				if running != 3 || denied.Load() != 7 {
					t.Fatalf("round %d: %d in their handlers at once and %d denied, want 3 and 7", round, running, denied.Load())
				}
			}
		})
	}
}

// TestCountIfPanic: a handler that panics counts as 500, and the panic
// goes on up, in every adapter.
func TestCountIfPanic(t *testing.T) {
	for _, ad := range adapters {
		for _, c := range []struct {
			name    string
			countIf func(int) bool
			after   int // the status of the next request
		}{
			{"counted as 500", func(s int) bool { return s >= 500 }, 429},
			{"not counted: refunded", failedLogin, 200},
		} {
			t.Run(ad.name+"/"+c.name, func(t *testing.T) {
				a := on(with(perMinute("panics", 1), func(r *core.Rule) { r.CountIf = c.countIf }))
				a.handler = func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("X-Panic") != "" {
						panic("boom")
					}
					okHandler(w, r)
				}
				h := ad.build(core.NewMemory(), a)
				func() {
					defer func() {
						if p := recover(); p != "boom" {
							t.Fatalf("recovered %v, want the handler's panic", p)
						}
					}()
					req := httptest.NewRequest(http.MethodGet, "/users/1", nil)
					req.Header.Set("X-Panic", "1")
					h.ServeHTTP(httptest.NewRecorder(), req)
				}()
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/users/1", nil))
				if rec.Code != c.after {
					t.Fatalf("after the panic: %d, want %d", rec.Code, c.after)
				}
			})
		}
	}
}

// TestClientGone: a client that closes its connection while its request is
// being decided never reaches the handler, in every adapter, over real TCP
// on a real Redis, with the default FailOpen and without a deny cache:
// the request's context ends, so no decision is made, and no decision is
// no pass.
func TestClientGone(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	run := time.Now().UnixNano()
	for _, ad := range adapters {
		t.Run(ad.name, func(t *testing.T) {
			l, err := core.New(rdb, core.WithPrefix(fmt.Sprintf("gone:%d:%s:", run, ad.name)), core.WithDenyCache(0))
			if err != nil {
				t.Fatal(err)
			}
			entered := make(chan struct{}, 1)
			rule := core.Rule{Name: "gone", Limits: []core.Limit{core.PerMinute(1)}, Key: func(r *http.Request) (string, error) {
				if r.Header.Get("X-Stay") == "" { // hold the request until its client has gone
					entered <- struct{}{}
					<-r.Context().Done()
				}
				return "client", nil
			}}
			var handled atomic.Int64
			h := ad.build(l, app{routes: []route{{path: "/gone", rules: []core.Rule{rule}}}, handler: func(w http.ResponseWriter, r *http.Request) {
				handled.Add(1)
				okHandler(w, r)
			}})
			served := make(chan struct{}, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { served <- struct{}{} }()
				h.ServeHTTP(w, r)
			}))
			defer srv.Close()

			// a request that stays takes the one unit
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/gone", nil)
			req.Header.Set("X-Stay", "1")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			<-served
			if resp.StatusCode != http.StatusOK || handled.Load() != 1 {
				t.Fatalf("first request: %d, handled %d times", resp.StatusCode, handled.Load())
			}
			for i := range 5 {
				conn, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.WriteString(conn, "GET /gone HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				<-entered
				_ = conn.Close()
				select {
				case <-served:
				case <-time.After(30 * time.Second):
					t.Fatalf("request %d: the server did not see its client go", i)
				}
			}
			if n := handled.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want 1: requests whose client left passed uncounted", n)
			}
		})
	}
}

// TestNestedMuxRoutes: a rule on a handler registered on an inner
// http.ServeMux keys by that handler's pattern, not by the route an outer
// router noted (a mux mounted under chi, or behind http.StripPrefix under
// an outer ServeMux with a rule of its own): two routes, two keys.
func TestNestedMuxRoutes(t *testing.T) {
	setups := map[string]func(l *core.Limiter, inner core.Rule) http.Handler{
		"ServeMux behind StripPrefix, outer rule WithMux": func(l *core.Limiter, inner core.Rule) http.Handler {
			mux := http.NewServeMux()
			perRoute := nethttp.Limit(l, inner)
			mux.Handle("GET /users/{id}", perRoute(http.HandlerFunc(okHandler)))
			mux.Handle("GET /orders/{id}", perRoute(http.HandlerFunc(okHandler)))
			outer := http.NewServeMux()
			outer.Handle("/api/", http.StripPrefix("/api", mux))
			return nethttp.Limit(l, core.Rule{Name: "global", Limits: []core.Limit{core.PerMinute(100)}}, nethttp.WithMux(outer))(outer)
		},
		"ServeMux mounted under chi, chi rule router-wide": func(l *core.Limiter, inner core.Rule) http.Handler {
			mux := http.NewServeMux()
			perRoute := nethttp.Limit(l, inner)
			mux.Handle("GET /api/users/{id}", perRoute(http.HandlerFunc(okHandler)))
			mux.Handle("GET /api/orders/{id}", perRoute(http.HandlerFunc(okHandler)))
			r := chi.NewRouter()
			r.Use(chimw.Limit(l, core.Rule{Name: "global", Limits: []core.Limit{core.PerMinute(100)}}))
			r.Mount("/api", mux)
			return r
		},
	}
	for name, build := range setups {
		t.Run(name, func(t *testing.T) {
			var keys []string
			l := core.NewMemory(core.WithObserver(func(ev core.Event) {
				if ev.Rule == "inner" {
					keys = append(keys, ev.Key)
				}
			}))
			h := build(l, core.Rule{Name: "inner", Limits: []core.Limit{core.PerMinute(1)}, Key: keyfuncs.Route()})
			for _, path := range []string{"/api/users/1", "/api/orders/1"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != http.StatusOK {
					t.Fatalf("%s: %d, want 200 (its route's first request)", path, rec.Code)
				}
			}
			want := []string{"inner:route:/users/{id}", "inner:route:/orders/{id}"}
			if strings.HasPrefix(name, "ServeMux mounted") {
				want = []string{"inner:route:/api/users/{id}", "inner:route:/api/orders/{id}"}
			}
			if !slices.Equal(keys, want) {
				t.Fatalf("keys %q, want %q", keys, want)
			}
		})
	}
}

// TestCountIfHijack: a handler that hijacks the connection (a WebSocket
// upgrade) before writing a status is settled as 101 by every adapter.
func TestCountIfHijack(t *testing.T) {
	for _, ad := range adapters {
		t.Run(ad.name, func(t *testing.T) {
			seen := make(chan int, 1)
			a := on(with(perMinute("upgrades", 5), func(r *core.Rule) { r.CountIf = func(s int) bool { seen <- s; return true } }))
			a.handler = func(w http.ResponseWriter, r *http.Request) {
				c, rw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					panic(err)
				}
				_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
				_ = rw.Flush()
				_ = c.Close()
			}
			srv := httptest.NewServer(ad.build(core.NewMemory(), a))
			defer srv.Close()
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, "GET /users/1 HTTP/1.1\r\nHost: example.com\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "HTTP/1.1 101") {
				t.Fatalf("response %q, %v; want the handler's 101", line, err)
			}
			select {
			case s := <-seen:
				if s != http.StatusSwitchingProtocols {
					t.Fatalf("CountIf saw %d, want 101", s)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("CountIf was not called")
			}
		})
	}
}

// TestCountIfResponseController: under a CountIf rule, a handler's
// http.ResponseController still reaches the connection (a write deadline),
// in every adapter.
func TestCountIfResponseController(t *testing.T) {
	for _, ad := range adapters {
		t.Run(ad.name, func(t *testing.T) {
			got := make(chan error, 1)
			a := on(with(perMinute("deadlines", 5), func(r *core.Rule) { r.CountIf = func(s int) bool { return s >= 500 } }))
			a.handler = func(w http.ResponseWriter, r *http.Request) {
				got <- http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute))
				okHandler(w, r)
			}
			srv := httptest.NewServer(ad.build(core.NewMemory(), a))
			defer srv.Close()
			resp, err := http.Get(srv.URL + "/users/1")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if err := <-got; err != nil {
				t.Fatalf("SetWriteDeadline under a CountIf rule: %v", err)
			}
		})
	}
}
