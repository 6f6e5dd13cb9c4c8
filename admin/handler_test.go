package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/admin"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// app is a service with the rule "api" (5/m per client IP, its denied keys
// recorded) and "login" (3/m), published under a prefix of the test's own,
// and the admin handler on its Limiter, mounted at /ops/ of srv.
type app struct {
	l   *core.Limiter
	api *core.Enforcer
	srv *httptest.Server

	mu     sync.Mutex
	allow  func(admin.Access) bool // what authorize lets through
	asked  []admin.Access          // what authorize was asked
	header string                  // authorize also wants this Authorization header, when set
}

// backends runs f against a single Redis and a three-master Cluster.
func backends(t *testing.T, f func(t *testing.T, a *app)) {
	t.Run("single", func(t *testing.T) {
		srv := redistest.New(t)
		if !srv.Real {
			t.Skip("no redis-server: the handler's tests need a real Redis")
		}
		f(t, newApp(t, srv.Client(t)))
	})
	t.Run("cluster", func(t *testing.T) {
		f(t, newApp(t, redistest.NewCluster(t).Client(t)))
	})
}

func newApp(t *testing.T, rdb redis.Scripter) *app {
	t.Helper()
	prefix := "rwadmin:" + strings.ReplaceAll(t.Name(), "/", ":") + ":"
	l, err := core.New(rdb, core.WithPrefix(prefix), core.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	api := core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(5)}, TrackDenied: true}
	login := core.Rule{Name: "login", Limits: []core.Limit{core.PerMinute(3)}}
	if err := l.Publish(context.Background(), api.Info(), login.Info()); err != nil {
		t.Fatal(err)
	}
	a := &app{l: l, allow: func(admin.Access) bool { return true }}
	if a.api, err = core.NewEnforcer(l, api); err != nil {
		t.Fatal(err)
	}
	// The handler runs on a Limiter of its own, as in a process of its own.
	ops, err := core.New(rdb, core.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	h, err := admin.New(ops, a.authorize)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", h))
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) authorize(r *http.Request, access admin.Access) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, access)
	if a.header != "" && r.Header.Get("Authorization") != a.header {
		return false
	}
	return a.allow(access)
}

// hit sends n requests from ip through the rule "api".
func (a *app) hit(t *testing.T, ip string, n int) {
	t.Helper()
	for range n {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = net.JoinHostPort(ip, "4000")
		a.api.Handle(httptest.NewRecorder(), r, "/")
	}
}

// used returns the units key holds under the rule "api".
func (a *app) used(t *testing.T, key string) int64 {
	t.Helper()
	u, err := a.l.Usage(context.Background(), core.RuleKey("api", key), core.PerMinute(5))
	if err != nil {
		t.Fatal(err)
	}
	return u.Limits[0].Used
}

// call sends a request to the handler and returns its status and body.
func (a *app) call(t *testing.T, method, path string, form url.Values, header ...string) (int, string) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost || method == http.MethodPut {
		body = strings.NewReader(form.Encode())
	} else if form != nil {
		path += "?" + form.Encode()
	}
	req, err := http.NewRequest(method, a.srv.URL+"/ops"+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := a.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// expect sends a request and fails t unless it gets code; it returns the body.
func (a *app) expect(t *testing.T, code int, method, path string, form url.Values, header ...string) string {
	t.Helper()
	got, body := a.call(t, method, path, form, header...)
	if got != code {
		t.Fatalf("%s %s %v: %d %s, want %d", method, path, form, got, body, code)
	}
	return body
}

func decode[T any](t *testing.T, body string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
	return v
}

func q(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

func TestNewRefusesWithoutAuthorization(t *testing.T) {
	l := core.NewMemory()
	if h, err := admin.New(l, nil); !errors.Is(err, admin.ErrNoAuthorization) || h != nil {
		t.Errorf("New without authorize: %v, %v", h, err)
	}
	if _, err := admin.New(nil, func(*http.Request, admin.Access) bool { return true }); err == nil {
		t.Error("New without a Limiter: no error")
	}
}

// every is a request to each route, the page, its files and a path that is
// none of them.
func every(key string) []struct {
	method, path string
	form         url.Values
} {
	rk := q("rule", "api", "key", key)
	return []struct {
		method, path string
		form         url.Values
	}{
		{"GET", "/", nil}, {"GET", "/app.js", nil}, {"GET", "/nothing", nil},
		{"GET", "/api/rules", nil}, {"GET", "/api/usage", rk}, {"GET", "/api/override", rk},
		{"GET", "/api/top", q("rule", "api")}, {"HEAD", "/api/top", q("rule", "api")},
		{"POST", "/api/reset", rk}, {"POST", "/api/block", q("rule", "api", "key", key, "for", "1m")},
		{"POST", "/api/unblock", rk}, {"PUT", "/api/override", q("rule", "api", "key", key, "limits", "50/m")},
		{"DELETE", "/api/override", rk}, {"POST", "/api/nothing", rk}, {"OPTIONS", "/api/rules", nil},
	}
}

func TestUnauthorizedSeesNothing(t *testing.T) {
	backends(t, func(t *testing.T, a *app) {
		const ip = "10.0.0.1"
		key := "ip:" + ip
		a.hit(t, ip, 8) // 5 counted, 3 denied and recorded
		waitTop(t, a, key)

		a.allow = func(admin.Access) bool { return false }
		for _, c := range every(key) {
			code, body := a.call(t, c.method, c.path, c.form)
			if code != http.StatusForbidden {
				t.Errorf("%s %s: %d, want 403", c.method, c.path, code)
			}
			if c.method != "HEAD" && body != `{"error":"forbidden"}`+"\n" {
				t.Errorf("%s %s: body %q", c.method, c.path, body)
			}
		}
		// Nothing changed.
		if n := a.used(t, key); n != 5 {
			t.Errorf("after refused writes, %d used, want 5", n)
		}
		if _, err := a.l.Override(context.Background(), core.RuleKey("api", key)); !errors.Is(err, core.ErrNoOverride) {
			t.Errorf("after a refused override: %v", err)
		}
		if u, _ := a.l.Usage(context.Background(), core.RuleKey("api", key), core.PerMinute(5)); u.Blocked != 0 {
			t.Errorf("after a refused block: blocked %s", u.Blocked)
		}

		// A request that authorize refuses for lack of credentials gets
		// nothing either, whatever it asks.
		a.allow = func(admin.Access) bool { return true }
		a.header = "Bearer right"
		for _, c := range every(key) {
			if code, _ := a.call(t, c.method, c.path, c.form, "Authorization", "Bearer wrong"); code != http.StatusForbidden {
				t.Errorf("%s %s with a wrong token: %d", c.method, c.path, code)
			}
		}
		body := a.expect(t, http.StatusOK, "GET", "/api/top", q("rule", "api"), "Authorization", "Bearer right")
		if !strings.Contains(body, key) {
			t.Errorf("top with the right token: %s", body)
		}
	})
}

func TestAccessByMethod(t *testing.T) {
	backends(t, func(t *testing.T, a *app) {
		a.hit(t, "10.0.0.2", 2)
		key := "ip:10.0.0.2"
		a.allow = func(x admin.Access) bool { return x == admin.Read }
		a.asked = nil
		a.expect(t, http.StatusOK, "GET", "/api/usage", q("rule", "api", "key", key))
		a.expect(t, http.StatusForbidden, "POST", "/api/reset", q("rule", "api", "key", key))
		a.expect(t, http.StatusForbidden, "PUT", "/api/override", q("rule", "api", "key", key, "limits", "50/m"))
		a.expect(t, http.StatusForbidden, "DELETE", "/api/override", q("rule", "api", "key", key))
		if n := a.used(t, key); n != 2 {
			t.Errorf("a read-only caller reset the key: %d used", n)
		}
		want := []admin.Access{admin.Read, admin.Write, admin.Write, admin.Write}
		if len(a.asked) != len(want) {
			t.Fatalf("authorize asked %v, want %v", a.asked, want)
		}
		for i := range want {
			if a.asked[i] != want[i] {
				t.Errorf("authorize asked %v, want %v", a.asked, want)
			}
		}
	})
}

func TestCrossOriginWritesRefused(t *testing.T) {
	backends(t, func(t *testing.T, a *app) {
		a.hit(t, "10.0.0.3", 2)
		key := "ip:10.0.0.3"
		a.expect(t, http.StatusForbidden, "POST", "/api/reset", q("rule", "api", "key", key), "Sec-Fetch-Site", "cross-site")
		a.expect(t, http.StatusForbidden, "POST", "/api/reset", q("rule", "api", "key", key), "Origin", "https://elsewhere.example")
		if n := a.used(t, key); n != 2 {
			t.Errorf("a cross-origin reset went through: %d used", n)
		}
		a.expect(t, http.StatusNoContent, "POST", "/api/reset", q("rule", "api", "key", key), "Sec-Fetch-Site", "same-origin")
		if n := a.used(t, key); n != 0 {
			t.Errorf("a same-origin reset did not: %d used", n)
		}
	})
}

func TestRoutes(t *testing.T) {
	backends(t, func(t *testing.T, a *app) {
		const ip = "10.0.0.4"
		key := "ip:" + ip
		a.hit(t, ip, 3)

		rules := decode[[]admin.Rule](t, a.expect(t, 200, "GET", "/api/rules", nil))
		if len(rules) != 2 || rules[0].Name != "api" || !rules[0].TrackDenied || rules[0].Limits[0].String() != "5/1m" {
			t.Errorf("rules: %+v", rules)
		}
		u := decode[admin.Usage](t, a.expect(t, 200, "GET", "/api/usage", q("rule", "api", "key", key)))
		if u.Key != key || u.Limits[0].Used != 3 || u.Limits[0].Remaining != 2 || u.Override != nil || u.Blocked != 0 {
			t.Errorf("usage: %+v", u)
		}

		ov := decode[admin.Override](t, a.expect(t, 200, "PUT", "/api/override", q("rule", "api", "key", key, "limits", "50/m", "for", "1h")))
		if len(ov.Limits) != 1 || ov.Limits[0].Count != 50 || time.Duration(ov.TTL) != time.Hour {
			t.Errorf("override set: %+v", ov)
		}
		ov = decode[admin.Override](t, a.expect(t, 200, "GET", "/api/override", q("rule", "api", "key", key)))
		if len(ov.Limits) != 1 || ov.Limits[0].Count != 50 || ov.TTL <= 0 || time.Duration(ov.TTL) > time.Hour {
			t.Errorf("override get: %+v", ov)
		}
		u = decode[admin.Usage](t, a.expect(t, 200, "GET", "/api/usage", q("rule", "api", "key", key)))
		if u.Override == nil || u.Limits[0].Limit.Count != 50 || u.Limits[0].Remaining != 47 {
			t.Errorf("usage under the override: %+v", u)
		}
		a.expect(t, 204, "DELETE", "/api/override", q("rule", "api", "key", key))
		a.expect(t, 404, "GET", "/api/override", q("rule", "api", "key", key))

		a.expect(t, 204, "POST", "/api/block", q("rule", "api", "key", key, "for", "10m"))
		u = decode[admin.Usage](t, a.expect(t, 200, "GET", "/api/usage", q("rule", "api", "key", key)))
		if d := time.Duration(u.Blocked); d < 9*time.Minute || d > 10*time.Minute {
			t.Errorf("blocked for %s, want about 10m", d)
		}
		a.expect(t, 204, "POST", "/api/unblock", q("rule", "api", "key", key))
		a.expect(t, 409, "POST", "/api/unblock", q("rule", "api", "key", key))
		a.expect(t, 204, "POST", "/api/reset", q("rule", "api", "key", key))
		a.expect(t, 404, "GET", "/api/usage", q("rule", "api", "key", key))

		a.hit(t, ip, 7)
		top := waitTop(t, a, key)
		if top.Rule != "api" || time.Duration(top.Since) != 5*time.Minute {
			t.Errorf("top: %+v", top)
		}

		// Bad input: a clear error, nothing written.
		for _, c := range []struct {
			code         int
			method, path string
			form         url.Values
			want         string
		}{
			{404, "GET", "/api/usage", q("rule", "nope", "key", key), `unknown rule \"nope\" (published: api, login)`},
			{400, "GET", "/api/usage", q("key", key), "a rule name is needed"},
			{404, "GET", "/api/usage", q("rule", "api", "key", "10.9.9.9"), `keyfuncs.IP writes a client's key as \"ip:\"`},
			{400, "GET", "/api/usage", q("rule", "api"), "invalid key"},
			{400, "GET", "/api/usage", q("rule", "api", "key", strings.Repeat("k", core.MaxKeyLen+1)), "invalid key"},
			{400, "PUT", "/api/override", q("rule", "api", "key", key, "limits", "0/m"), "invalid limit"},
			{400, "PUT", "/api/override", q("rule", "api", "key", key, "limits", "9/7m"), "no limit of window 7m"},
			{400, "PUT", "/api/override", q("rule", "api", "key", key, "limits", "9/m", "for", "-1m"), "invalid duration"},
			{400, "PUT", "/api/override", q("rule", "api", "key", key, "limits", "9/m", "for", "soon"), "not a duration"},
			{400, "POST", "/api/block", q("rule", "api", "key", key), "invalid duration"},
			{400, "GET", "/api/top", q("rule", "api", "n", "x"), "not a whole number"},
			{400, "GET", "/api/top", q("rule", "api", "n", "0"), "ask for 1 or more"},
			{400, "GET", "/api/top", q("rule", "api", "since", "-5m"), "invalid duration"},
			{409, "GET", "/api/top", q("rule", "login"), "does not record its denied keys"},
			{405, "GET", "/api/reset", q("rule", "api", "key", key), ""},
		} {
			body := a.expect(t, c.code, c.method, c.path, c.form)
			if !strings.Contains(body, c.want) {
				t.Errorf("%s %s %v: %s, want %q", c.method, c.path, c.form, body, c.want)
			}
		}
		if _, err := a.l.Override(context.Background(), core.RuleKey("api", key)); !errors.Is(err, core.ErrNoOverride) {
			t.Errorf("a refused override was written: %v", err)
		}
	})
}

// waitTop waits until key shows first in the top of the rule "api".
func waitTop(t *testing.T, a *app, key string) admin.Top {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		top := decode[admin.Top](t, a.expect(t, 200, "GET", "/api/top", q("rule", "api")))
		if len(top.Keys) > 0 && top.Keys[0].Key == key {
			return top
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not first in the top: %+v", key, top)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
