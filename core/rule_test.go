package core_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

func TestRuleValidate(t *testing.T) {
	minute := core.PerMinute(10)
	for _, tc := range []struct {
		name string
		rule core.Rule
		want []error // nil: valid
		msg  string
	}{
		{"valid", core.Rule{Name: "api/v1_login-2.x", Limits: []core.Limit{minute, core.PerSecond(2)}}, nil, ""},
		{"valid different algorithms", core.Rule{Name: "a", Limits: []core.Limit{minute, {Name: "m2", Count: 10, Window: time.Minute, Algorithm: core.SlidingCounter}}}, nil, ""},
		{"empty name", core.Rule{Limits: []core.Limit{minute}}, []error{core.ErrInvalidRule}, "empty Name"},
		{"long name", core.Rule{Name: strings.Repeat("n", 65), Limits: []core.Limit{minute}}, []error{core.ErrInvalidRule}, "longer than 64"},
		{"colon", core.Rule{Name: "a:b", Limits: []core.Limit{minute}}, []error{core.ErrInvalidRule}, "no space, ':'"},
		{"brace", core.Rule{Name: "a{b}", Limits: []core.Limit{minute}}, []error{core.ErrInvalidRule}, "no space, ':'"},
		{"space", core.Rule{Name: "a b", Limits: []core.Limit{minute}}, []error{core.ErrInvalidRule}, "no space, ':'"},
		{"non-ASCII", core.Rule{Name: "café", Limits: []core.Limit{minute}}, []error{core.ErrInvalidRule}, "printable ASCII"},
		{"no limits", core.Rule{Name: "a"}, []error{core.ErrInvalidRule, core.ErrNoLimits}, "no limits"},
		{"bad limit", core.Rule{Name: "a", Limits: []core.Limit{minute, {Count: 0, Window: time.Second}}}, []error{core.ErrInvalidRule, core.ErrInvalidLimit}, "invalid limit #1: count 0"},
		{"shared storage", core.Rule{Name: "a", Limits: []core.Limit{minute, {Name: "other", Count: 5, Window: time.Minute}}}, []error{core.ErrInvalidRule, core.ErrInvalidLimit}, "share storage"},
		{"same policy name", core.Rule{Name: "a", Limits: []core.Limit{{Name: "x", Count: 1, Window: time.Second}, {Name: "x", Count: 9, Window: time.Hour}}}, []error{core.ErrInvalidRule}, `policy name "x"`},
		{"policy name not printable", core.Rule{Name: "a", Limits: []core.Limit{{Name: "bad\nname", Count: 1, Window: time.Second}}}, []error{core.ErrInvalidRule}, "not printable ASCII"},
		{"unknown header style", core.Rule{Name: "a", Limits: []core.Limit{minute}, Headers: core.None + 1}, []error{core.ErrInvalidRule}, "header-style(4)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rule.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("Validate() = %v, does not match %v", err, w)
				}
			}
			if !strings.HasPrefix(err.Error(), "ratewindow: ") || strings.Count(err.Error(), "ratewindow: ") != 1 || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Validate() = %q, want it to start with \"ratewindow: \" (once) and say %q", err, tc.msg)
			}
			if _, nerr := core.NewEnforcer(core.NewMemory(), tc.rule); nerr == nil || nerr.Error() != err.Error() {
				t.Errorf("NewEnforcer() = %v, want %v", nerr, err)
			}
		})
	}
	if _, err := core.NewEnforcer(nil, core.Rule{Name: "a", Limits: []core.Limit{minute}}); !errors.Is(err, core.ErrInvalidRule) {
		t.Errorf("NewEnforcer(nil, ...) = %v, want ErrInvalidRule", err)
	}
}

func TestHeaderStyleString(t *testing.T) {
	for s, want := range map[core.HeaderStyle]string{core.XRateLimit: "x-ratelimit", core.IETF: "ietf", core.Both: "both", core.None: "none", 9: "header-style(9)"} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", s, got, want)
		}
	}
}

// serve runs the enforcers as middleware, outermost first, around a
// handler that answers 200 "ok", and returns the response.
func serve(req *http.Request, es ...*core.Enforcer) *httptest.ResponseRecorder {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	for i := len(es) - 1; i >= 0; i-- {
		e, next := es[i], h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r, ok := e.Handle(w, r, "/things/{id}"); ok {
				next.ServeHTTP(w, r)
			}
		})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func mustEnforcer(t *testing.T, l *core.Limiter, rule core.Rule) *core.Enforcer {
	t.Helper()
	e, err := core.NewEnforcer(l, rule)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// closedLimiter fails closed; its Redis is never dialed by these tests.
func closedLimiter(t *testing.T) *core.Limiter {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := core.New(rdb, core.WithFailureMode(core.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestHandleInputErrors: a request whose key, cost or limits cannot be
// computed is still limited, whatever the failure mode: under the rule's
// fallback key, a cost of 1 or the rule's limits, after OnError (which may
// answer instead). The error's text never reaches the client.
func TestHandleInputErrors(t *testing.T) {
	errKey := errors.New("no key here")
	failing := func(*http.Request) (string, error) { return "", errKey }
	empty := func(*http.Request) (string, error) { return "", nil }
	closedOnRedis, err := core.New(redistest.New(t).Client(t), core.WithFailureMode(core.FailClosed), core.WithPrefix(fmt.Sprintf("input-errors-%d:", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	memory := func() *core.Limiter { return core.NewMemory() }
	denied := "Too Many Requests\n"
	for _, tc := range []struct {
		name    string
		l       func() *core.Limiter
		rule    core.Rule
		header  http.Header
		wantErr error
		codes   []int    // of two requests
		bodies  []string // of two requests
		keys    []string // observed (memory Limiters only)
	}{
		{"key error: the peer address", memory, core.Rule{Key: failing}, nil, errKey,
			[]int{200, 429}, []string{"ok", denied}, []string{"k:nokey:ip:192.0.2.1", "k:nokey:ip:192.0.2.1"}},
		{"empty key", memory, core.Rule{Key: empty}, nil, keyfuncs.ErrNoKey,
			[]int{200, 429}, []string{"ok", denied}, []string{"k:nokey:ip:192.0.2.1", "k:nokey:ip:192.0.2.1"}},
		{"missing header", memory, core.Rule{Key: keyfuncs.Header("X-Api-Key")}, nil, keyfuncs.ErrNoKey,
			[]int{200, 429}, []string{"ok", denied}, []string{"k:nokey:ip:192.0.2.1", "k:nokey:ip:192.0.2.1"}},
		{"key error on a Limiter that fails closed, Redis up", func() *core.Limiter { return closedOnRedis }, core.Rule{Key: failing}, nil, errKey,
			[]int{200, 429}, []string{"ok", denied}, nil},
		{"FallbackKey", memory, core.Rule{Key: failing, FallbackKey: keyfuncs.Header("X-Client")}, http.Header{"X-Client": {"c1"}}, errKey,
			[]int{200, 429}, []string{"ok", denied}, []string{"k:nokey:h:x-client:c1", "k:nokey:h:x-client:c1"}},
		{"FallbackKey fails too: one key for the rule", memory, core.Rule{Key: failing, FallbackKey: failing}, nil, errKey,
			[]int{200, 429}, []string{"ok", denied}, []string{"k:nokey", "k:nokey"}},
		{"cost below 1 costs 1", memory, core.Rule{Cost: func(*http.Request) int64 { return -1 }}, nil, core.ErrInvalidCost,
			[]int{200, 429}, []string{"ok", denied}, []string{"k:ip:192.0.2.1", "k:ip:192.0.2.1"}},
		{"LimitsFor error: the rule's limits", memory, core.Rule{LimitsFor: func(*http.Request) ([]core.Limit, error) { return nil, errKey }}, nil, errKey,
			[]int{200, 429}, []string{"ok", denied}, []string{"k:ip:192.0.2.1", "k:ip:192.0.2.1"}},
		{"OnError answers", func() *core.Limiter { return closedLimiter(t) }, core.Rule{Key: failing, OnError: func(w http.ResponseWriter, _ *http.Request, _ error) {
			http.Error(w, "who are you?", http.StatusUnauthorized)
		}}, nil, errKey, []int{401, 401}, []string{"who are you?\n", "who are you?\n"}, nil},
		{"OnError answers by a flush alone", memory, core.Rule{Key: failing, OnError: func(w http.ResponseWriter, _ *http.Request, _ error) {
			_ = http.NewResponseController(w).Flush() // net/http sends 200: the handler must not run
		}}, nil, errKey, []int{200, 200}, []string{"", ""}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []error
			var keys []string
			l := tc.l()
			if tc.keys != nil {
				l = core.NewMemory(core.WithObserver(func(ev core.Event) { keys = append(keys, ev.Key) }))
			}
			rule := tc.rule
			rule.Name, rule.Limits = "k", []core.Limit{core.PerMinute(1)}
			onError := rule.OnError
			rule.OnError = func(w http.ResponseWriter, r *http.Request, err error) {
				got = append(got, err)
				if onError != nil {
					onError(w, r, err)
				}
			}
			e := mustEnforcer(t, l, rule)
			for i := range 2 {
				req := httptest.NewRequest("GET", "/things/1", nil)
				for k, v := range tc.header {
					req.Header[k] = v
				}
				rec := serve(req, e)
				if rec.Code != tc.codes[i] || rec.Body.String() != tc.bodies[i] {
					t.Errorf("request %d: got %d %q, want %d %q", i, rec.Code, rec.Body, tc.codes[i], tc.bodies[i])
				}
				if strings.Contains(rec.Body.String(), "no key here") {
					t.Error("the error's text reached the client")
				}
			}
			if len(got) != 2 || !errors.Is(got[0], tc.wantErr) || !errors.Is(got[1], tc.wantErr) {
				t.Errorf("OnError got %v, want %v twice", got, tc.wantErr)
			} else if !strings.HasPrefix(got[0].Error(), "ratewindow: rule k: ") {
				t.Errorf("OnError's error %q does not name the rule", got[0])
			}
			if tc.keys != nil && !slices.Equal(keys, tc.keys) {
				t.Errorf("observed keys %q, want %q", keys, tc.keys)
			}
		})
	}
}

// TestStackedTies checks that stacked rules with equal counts show the same
// rule in either order.
func TestStackedTies(t *testing.T) {
	l := core.NewMemory()
	x := mustEnforcer(t, l, core.Rule{Name: "x", Headers: core.IETF, Limits: []core.Limit{{Name: "x", Count: 3, Window: time.Minute}}})
	y := mustEnforcer(t, l, core.Rule{Name: "y", Headers: core.IETF, Limits: []core.Limit{{Name: "y", Count: 3, Window: time.Minute}}})
	for i, order := range [][]*core.Enforcer{{x, y}, {y, x}} {
		req := httptest.NewRequest("GET", "/things/1", nil)
		req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1", i+1)
		rec := serve(req, order...)
		if got := rec.Header().Get("RateLimit"); got != `"x";r=2;t=60` {
			t.Errorf("order %d: RateLimit %q, want the rule x", i, got)
		}
		if got := rec.Header().Get("RateLimit-Policy"); got != `"x";q=3;w=60` {
			t.Errorf("order %d: RateLimit-Policy %q, want the rule x", i, got)
		}
	}
}

func TestHandleContext(t *testing.T) {
	l := core.NewMemory()
	var skipSaw, keySaw string
	e := mustEnforcer(t, l, core.Rule{
		Name:   "ctx",
		Limits: []core.Limit{core.PerMinute(5)},
		Skip: func(r *http.Request) bool {
			skipSaw, _ = keyfuncs.RouteFrom(r.Context())
			return false
		},
		Key: func(r *http.Request) (string, error) {
			keySaw, _ = keyfuncs.RouteFrom(r.Context())
			return keyfuncs.Route()(r)
		},
	})
	req := httptest.NewRequest("GET", "/things/1", nil)
	r, ok := e.Handle(httptest.NewRecorder(), req, "/things/{id}")
	if !ok || r == nil {
		t.Fatalf("Handle() = %v, %v; want a request and true", r, ok)
	}
	if p, _ := keyfuncs.RouteFrom(r.Context()); p != "/things/{id}" || skipSaw != p || keySaw != p {
		t.Errorf("route in the passed request %q, seen by Skip %q and Key %q; want /things/{id}", p, skipSaw, keySaw)
	}
	// A second rule on the same route reuses the request: nothing to add.
	e2 := mustEnforcer(t, l, core.Rule{Name: "ctx2", Limits: []core.Limit{core.PerMinute(5)}})
	if r2, ok := e2.Handle(httptest.NewRecorder(), r, "/things/{id}"); !ok || r2 != r {
		t.Errorf("second Handle() returned a new request (%v)", ok)
	}
}

func TestOnDeniedSeesHeaders(t *testing.T) {
	var saw http.Header
	var res core.Result
	e := mustEnforcer(t, core.NewMemory(), core.Rule{
		Name:   "custom",
		Limits: []core.Limit{core.PerMinute(1)},
		OnDenied: func(w http.ResponseWriter, _ *http.Request, r core.Result) {
			saw, res = w.Header().Clone(), r
			w.WriteHeader(http.StatusTeapot)
		},
	})
	serve(httptest.NewRequest("GET", "/", nil), e)
	rec := serve(httptest.NewRequest("GET", "/", nil), e)
	if rec.Code != http.StatusTeapot || rec.Body.Len() != 0 {
		t.Errorf("got %d %q, want OnDenied's 418", rec.Code, rec.Body)
	}
	if saw.Get("Retry-After") != "60" || saw.Get("X-RateLimit-Remaining") != "0" || res.Allowed || res.Limit.Count != 1 {
		t.Errorf("OnDenied saw %v and %+v", saw, res)
	}
}

// ExampleNewEnforcer shows the whole contract of an adapter: hand the
// request and the framework's route pattern to Handle, and call the next
// handler with the request it returns, unless it answered.
func ExampleNewEnforcer() {
	e, err := core.NewEnforcer(core.NewMemory(), core.Rule{
		Name:    "search",
		Limits:  []core.Limit{core.PerMinute(10)},
		Key:     keyfuncs.Join(keyfuncs.IP(), keyfuncs.Route()),
		Cost:    func(*http.Request) int64 { return 4 },
		Headers: core.IETF,
	})
	if err != nil {
		panic(err)
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "results") })
	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/search?q=go", nil)
		if r, ok := e.Handle(w, req, "/search"); ok {
			next.ServeHTTP(w, r)
		}
		fmt.Printf("%d %s retry-after=%q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 "10-per-1m";r=6;t=60 retry-after=""
	// 200 "10-per-1m";r=2;t=60 retry-after=""
	// 429 "10-per-1m";r=2;t=60 retry-after="60"
}

func TestByIP(t *testing.T) {
	r := core.ByIP(100, time.Minute)
	if r.Name != "ip-100-per-1m" || len(r.Limits) != 1 || r.Limits[0] != core.PerMinute(100) || r.Validate() != nil {
		t.Fatalf("core.ByIP(100, 1m) = %+v", r)
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "203.0.113.9:4000"
	if k, err := r.Key(req); k != "ip:203.0.113.9" || err != nil {
		t.Fatalf("key %q, %v", k, err)
	}
	if core.ByIP(5, time.Second).Name == r.Name {
		t.Fatal("two limits, one name: they would share counters")
	}
	if err := core.ByIP(0, time.Minute).Validate(); !errors.Is(err, core.ErrInvalidLimit) {
		t.Fatalf("core.ByIP(0): %v", err)
	}
}

// TestHandleContextEnded: a request whose own context ended before its
// decision never reaches the handler, whatever the failure mode: the
// failure mode is for Redis's failures only. Without a decision it is
// answered 503, by the memory Limiter too (it decided, needing no I/O, and
// admitted requests whose client had left). It is no error of the rule:
// OnError is not called.
func TestHandleContextEnded(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	run := time.Now().UnixNano()
	onRedis := func(opts ...core.Option) func(t *testing.T) *core.Limiter {
		return func(t *testing.T) *core.Limiter {
			// a long timeout: the first request's decision must be Redis's
			// on a loaded machine too (this test is about ended contexts)
			l, err := core.New(rdb, append([]core.Option{core.WithTimeout(10 * time.Second)}, append(opts, core.WithPrefix(fmt.Sprintf("ctx-ended-%d-%s:", run, t.Name())))...)...)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
	}
	unavailable := "Service Unavailable\n"
	for _, tc := range []struct {
		name string
		l    func(t *testing.T) *core.Limiter
		code int
		body string
	}{
		{"redis, fail open", onRedis(), 503, unavailable},
		{"redis, fail open, no deny cache", onRedis(core.WithDenyCache(0)), 503, unavailable},
		{"redis, fail local", onRedis(core.WithFailureMode(core.FailLocal), core.WithLocalShare(1)), 503, unavailable},
		{"redis, fail closed", onRedis(core.WithFailureMode(core.FailClosed)), 503, unavailable},
		{"memory", func(*testing.T) *core.Limiter { return core.NewMemory() }, 503, unavailable},
	} {
		for _, end := range []struct {
			name string
			ctx  func() context.Context
		}{
			{"cancelled", func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			}},
			{"deadline passed", func() context.Context {
				ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
				t.Cleanup(cancel)
				return ctx
			}},
		} {
			t.Run(tc.name+"/"+end.name, func(t *testing.T) {
				var errs []error
				handled := 0
				e := mustEnforcer(t, tc.l(t), core.Rule{Name: "ended", Limits: []core.Limit{core.PerMinute(1)},
					OnError: func(_ http.ResponseWriter, _ *http.Request, err error) { errs = append(errs, err) }})
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if _, ok := e.Handle(w, r, ""); ok {
						handled++
						_, _ = io.WriteString(w, "ok")
					}
				})
				// the first request, with a live context, takes the one unit;
				// the next ones are over the limit, and end before deciding
				for i, ctx := range []context.Context{context.Background(), end.ctx(), end.ctx()} {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
					code, body := tc.code, tc.body
					if i == 0 {
						code, body = http.StatusOK, "ok"
					}
					if rec.Code != code || rec.Body.String() != body {
						t.Errorf("request %d: %d %q, want %d %q", i, rec.Code, rec.Body, code, body)
					}
				}
				if handled != 1 || len(errs) != 0 {
					t.Errorf("the handler ran %d times (want 1), OnError got %v (want nothing)", handled, errs)
				}
			})
		}
	}
}

// TestKeySpaces: whatever the key function returns, its keys never equal a
// fallback key ("<name>:nokey..."), and two results never share a key.
func TestKeySpaces(t *testing.T) {
	e, err := core.NewDecider(core.NewMemory(), core.Policy[*http.Request]{Name: "r", Limits: []core.Limit{core.PerMinute(1)},
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, want string }{
		{"ip:192.0.2.1", "r:ip:192.0.2.1"},
		{"nokey:ip:192.0.2.1", "r:~nokey:ip:192.0.2.1"},
		{"nokey", "r:~nokey"},
		{"nokeyx", "r:~nokeyx"},
		{"~nokey", "r:~~nokey"},
		{"~", "r:~~"},
		{"a~", "r:a~"},
		{"no", "r:no"},
	} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Key", tc.key)
		if got, err := e.Key(req); got != tc.want || err != nil {
			t.Errorf("Key(%q) = %q, %v; want %q", tc.key, got, err, tc.want)
		}
	}
}

// TestStoppedRequestKeepsNothing: a request that an inner rule stops, by
// failing closed (503) or by its OnError's own answer, keeps no unit under
// an outer rule with RefundIfStopped nor under the inner one (FailLocal's,
// when its OnError answers a Redis failure), and its response shows no
// rate-limit fields.
func TestStoppedRequestKeepsNothing(t *testing.T) {
	outerLimiter := core.NewMemory()
	outerRule := core.Rule{Name: "outer", Limits: []core.Limit{core.PerMinute(3)}, Headers: core.Both, RefundIfStopped: true}
	outer := mustEnforcer(t, outerLimiter, outerRule)
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	local, err := core.New(down, core.WithFailureMode(core.FailLocal), core.WithLocalShare(1))
	if err != nil {
		t.Fatal(err)
	}
	innerLimit := core.PerMinute(3)
	unauthorized := func(w http.ResponseWriter, _ *http.Request, _ error) {
		http.Error(w, "no", http.StatusUnauthorized)
	}
	cases := []struct {
		name   string
		inner  *core.Enforcer
		status int
		local  bool // the inner rule's units are FailLocal's: they must come back too
	}{
		{"the inner rule fails closed", mustEnforcer(t, closedLimiter(t), core.Rule{Name: "closed", Limits: []core.Limit{innerLimit}}), 503, false},
		{"the inner rule's OnError answers a key error", mustEnforcer(t, core.NewMemory(), core.Rule{Name: "keyed", Limits: []core.Limit{innerLimit},
			Key: keyfuncs.Header("X-Api-Key"), OnError: unauthorized}), 401, false},
		{"the inner rule's OnError answers a Redis failure under FailLocal", mustEnforcer(t, local, core.Rule{Name: "local", Limits: []core.Limit{innerLimit},
			OnError: unauthorized}), 401, true},
	}
	ctx := context.Background()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ip := fmt.Sprintf("192.0.2.%d", i+1)
			for range 4 {
				req := httptest.NewRequest("GET", "/things/1", nil)
				req.RemoteAddr = ip + ":1"
				rec := serve(req, outer, c.inner)
				if rec.Code != c.status {
					t.Fatalf("status %d, want %d", rec.Code, c.status)
				}
				for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy"} {
					if v := rec.Header().Values(k); len(v) > 0 {
						t.Fatalf("the stopped request shows %s: %q", k, v)
					}
				}
			}
			if r, err := outerLimiter.Peek(ctx, "outer:ip:"+ip, outerRule.Limits...); err != nil || r.Remaining != 3 {
				t.Fatalf("the outer rule keeps %d of 3 (%v), want 3", r.Remaining, err)
			}
			if c.local {
				if r, err := local.Peek(ctx, "local:ip:"+ip, innerLimit); err != nil || r.Remaining != 3 || r.BackendErr == nil {
					t.Fatalf("FailLocal keeps %d of 3 (%v, %v), want 3, answered locally", r.Remaining, err, r.BackendErr)
				}
			}
		})
	}
}

// TestFrameworkContextKept: a rule handled without a framework context
// (nethttp's) inside one handled with it (an adapter's) keeps the outer
// framework's context for the handlers after both.
func TestFrameworkContextKept(t *testing.T) {
	l := core.NewMemory()
	outer := mustEnforcer(t, l, core.Rule{Name: "outer", Limits: []core.Limit{core.PerMinute(5)}})
	inner := mustEnforcer(t, l, core.Rule{Name: "inner", Limits: []core.Limit{core.PerMinute(5)}})
	type frameworkCtx struct{ name string }
	fc := &frameworkCtx{"gin"}
	r, ok := outer.HandleFrom(httptest.NewRecorder(), httptest.NewRequest("GET", "/things/1", nil), "/things/{id}", fc)
	if !ok {
		t.Fatal("outer rule stopped the request")
	}
	if r, ok = inner.Handle(httptest.NewRecorder(), r, ""); !ok {
		t.Fatal("inner rule stopped the request")
	}
	if got := core.FrameworkContext(r); got != fc {
		t.Fatalf("FrameworkContext %v, want the outer adapter's %v", got, fc)
	}
}

// TestFailLocalFields: under FailLocal the fields show one policy, the
// rule's: X-RateLimit-Limit and RateLimit-Policy's q both the rule's
// Count (4), with the local share's Remaining (2 of this replica's, then
// a 429): one response never names two counts for one limit.
func TestFailLocalFields(t *testing.T) {
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	l, err := core.New(down, core.WithFailureMode(core.FailLocal), core.WithLocalShare(0.5))
	if err != nil {
		t.Fatal(err)
	}
	e := mustEnforcer(t, l, core.Rule{Name: "local", Limits: []core.Limit{core.PerMinute(4)}, Headers: core.Both})
	for i, want := range []struct {
		code           int
		limit, rl, pol string
	}{
		{200, "4", `"4-per-1m";r=1;t=60`, `"4-per-1m";q=4;w=60`},
		{200, "4", `"4-per-1m";r=0;t=60`, `"4-per-1m";q=4;w=60`},
		{429, "4", `"4-per-1m";r=0;t=60`, `"4-per-1m";q=4;w=60`},
	} {
		rec := serve(httptest.NewRequest(http.MethodGet, "/", nil), e)
		h := rec.Header()
		if rec.Code != want.code || h.Get("X-RateLimit-Limit") != want.limit || h.Get("RateLimit") != want.rl || h.Get("RateLimit-Policy") != want.pol {
			t.Errorf("request %d: %d, X-RateLimit-Limit %q, RateLimit %q, RateLimit-Policy %q; want %d, %q, %q, %q",
				i, rec.Code, h.Get("X-RateLimit-Limit"), h.Get("RateLimit"), h.Get("RateLimit-Policy"), want.code, want.limit, want.rl, want.pol)
		}
	}
}
