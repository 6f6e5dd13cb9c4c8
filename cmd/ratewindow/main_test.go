package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/admin"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// service is an application on one Redis, as the tool finds it: two
// replicas (Limiters with deny caches) of a service with two rules it
// published under a prefix of the test's own.
type service struct {
	url    string // REDIS_URL of its Redis
	rdb    redis.Scripter
	prefix string
	a, b   *core.Limiter
	api    [2]*core.Enforcer // the rule "api" on a and on b
	login  core.Rule
}

// apiLimits are the limits of the rule "api", per client IP.
func apiLimits() []core.Limit { return []core.Limit{core.PerMinute(5), core.PerHour(100)} }

// backends runs f against a single Redis and a three-master Cluster.
func backends(t *testing.T, f func(t *testing.T, s *service)) {
	t.Run("single", func(t *testing.T) {
		srv := redistest.New(t)
		if !srv.Real {
			t.Skip("no redis-server: the tool needs a real Redis (Redis functions, INFO)")
		}
		f(t, newService(t, "redis://"+srv.Addr, srv.Client(t)))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t)
		url := "redis://" + c.Addrs[0] + "?addr=" + strings.Join(c.Addrs[1:], "&addr=")
		f(t, newService(t, url, c.Client(t)))
	})
}

// newService publishes the rules "api" (5/m and 100/h per IP, tracked) and
// "login" (3/m with a ban) under a fresh prefix on rdb.
func newService(t *testing.T, url string, rdb redis.Scripter) *service {
	t.Helper()
	s := &service{url: url, rdb: rdb, prefix: "rwcli:" + strings.ReplaceAll(t.Name(), "/", ":") + ":"}
	s = s.replicas(t, core.DefaultDenyCacheSize)
	s.login = core.Rule{Name: "login", Limits: []core.Limit{core.PerMinute(3)}, Penalty: &core.Penalty{Denials: 2, Within: time.Minute, Ban: 15 * time.Minute}}
	if err := s.a.Publish(context.Background(), core.Rule{Name: "api", Limits: apiLimits(), TrackDenied: true}.Info(), s.login.Info()); err != nil {
		t.Fatal(err)
	}
	return s
}

// replicas returns s with two new replicas whose deny caches hold cache
// denials (0: none).
func (s *service) replicas(t *testing.T, cache int) *service {
	t.Helper()
	c := *s
	api := core.Rule{Name: "api", Limits: apiLimits(), TrackDenied: true}
	var err error
	for i, l := range []**core.Limiter{&c.a, &c.b} {
		if *l, err = core.New(s.rdb, core.WithPrefix(s.prefix), core.WithTimeout(5*time.Second), core.WithDenyCache(cache)); err != nil {
			t.Fatal(err)
		}
		if c.api[i], err = core.NewEnforcer(*l, api); err != nil {
			t.Fatal(err)
		}
	}
	return &c
}

// hit sends a request through replica i's rule "api" from the client
// whose key is key ("ip:" and its address, as keyfuncs.IP writes it), and
// returns its status.
func (s *service) hit(t *testing.T, i int, key string) int {
	t.Helper()
	ip, ok := strings.CutPrefix(key, "ip:")
	if !ok {
		t.Fatalf("key %q is not ip:<address>", key)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = net.JoinHostPort(ip, "4000")
	if _, ok := s.api[i].Handle(w, r, "/"); ok {
		return http.StatusOK
	}
	return w.Code
}

// cli runs the tool against s with args, the prefix and a short timeout
// added, and stdin as its standard input.
func (s *service) cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runTool(t, s.url, stdin, append([]string{"-prefix", s.prefix}, args...)...)
}

// runTool runs the tool with REDIS_URL url.
func runTool(t *testing.T, url, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(name string) string {
		if name == "REDIS_URL" {
			return url
		}
		return ""
	}
	code = run(args, getenv, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), code
}

// mustRun runs the tool and fails t unless it succeeds.
func (s *service) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := s.cli(t, "", args...)
	if code != exitOK {
		t.Fatalf("ratewindow %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// mustFail runs the tool, fails t unless it exits with code, and returns stderr.
func (s *service) mustFail(t *testing.T, code int, args ...string) string {
	t.Helper()
	out, errOut, got := s.cli(t, "", args...)
	if got != code {
		t.Fatalf("ratewindow %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), got, code, out, errOut)
	}
	if strings.Contains(errOut, "ratewindow: ratewindow:") {
		t.Errorf("ratewindow %s: the tool's name twice: %s", strings.Join(args, " "), errOut)
	}
	return errOut
}

// decode decodes the JSON out into v.
func decode(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
}

func contains(t *testing.T, what, s string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, s)
		}
	}
}

func TestRules(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		out := s.mustRun(t, "rules")
		contains(t, "rules", out, "RULE", "api", "5/1m, 100/1h", "login", "3/1m", "2 denials in 1m: ban 15m")
		var rules []admin.Rule
		decode(t, s.mustRun(t, "rules", "-json"), &rules)
		if len(rules) != 2 || rules[0].Name != "api" || !rules[0].TrackDenied || rules[1].Name != "login" || rules[1].Penalty == nil {
			t.Fatalf("rules -json: %+v", rules)
		}
		if got := rules[0].Limits[1]; got.Count != 100 || time.Duration(got.Window) != time.Hour || got.Algorithm != "sliding-log" {
			t.Errorf("api's second limit: %+v", got)
		}

		// Another prefix has no rule: said plainly, not an error.
		out, _, code := runTool(t, s.url, "", "-prefix", s.prefix+"other:", "rules")
		if code != exitOK || !strings.Contains(out, "no rule is published") {
			t.Errorf("rules under an empty prefix: exit %d, %q", code, out)
		}
	})
}

func TestUsageIsWhatPeekSays(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		for range 3 {
			s.hit(t, 0, "ip:10.0.0.1")
		}
		out := s.mustRun(t, "usage", "api", "ip:10.0.0.1")
		contains(t, "usage", out, "rule      api", "key       ip:10.0.0.1", "blocked   no", "override  none", "5/1m", "100/1h")

		var u admin.Usage
		decode(t, s.mustRun(t, "-json", "usage", "api", "ip:10.0.0.1"), &u)
		if u.Rule != "api" || u.Key != "ip:10.0.0.1" || len(u.Limits) != 2 || u.Blocked != 0 || u.Override != nil {
			t.Fatalf("usage -json: %+v", u)
		}
		for i, lim := range apiLimits() {
			r, err := s.b.Peek(context.Background(), core.RuleKey("api", "ip:10.0.0.1"), lim)
			if err != nil {
				t.Fatal(err)
			}
			lu := u.Limits[i]
			if lu.Used != 3 || lu.Remaining != r.Remaining || lu.Limit.Count != lim.Count {
				t.Errorf("limit %s: usage %+v, Peek's remaining %d, want 3 used", lim, lu, r.Remaining)
			}
			if lu.ResetAfter <= 0 || time.Duration(lu.ResetAfter) > lim.Window {
				t.Errorf("limit %s: reset after %s", lim, time.Duration(lu.ResetAfter))
			}
		}
		// Usage consumed nothing.
		if r, _ := s.a.Peek(context.Background(), core.RuleKey("api", "ip:10.0.0.1"), apiLimits()...); r.Remaining != 2 {
			t.Errorf("after usage, %d remaining, want 2", r.Remaining)
		}
	})
}

func TestBadInput(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		s.hit(t, 0, "ip:10.0.0.2")
		errOut := s.mustFail(t, exitFail, "usage", "nope", "ip:10.0.0.2")
		contains(t, "unknown rule", errOut, `unknown rule "nope"`, "published: api, login")
		errOut = s.mustFail(t, exitFail, "usage", "api", "ip:10.9.9.9")
		contains(t, "unknown key", errOut, `unknown key "ip:10.9.9.9" under rule "api"`)
		errOut = s.mustFail(t, exitFail, "reset", "api", "ip:10.9.9.9")
		contains(t, "reset of an unknown key", errOut, "unknown key")
		errOut = s.mustFail(t, exitFail, "usage", "api", strings.Repeat("k", core.MaxKeyLen+1))
		contains(t, "key too long", errOut, "invalid key")
		errOut = s.mustFail(t, exitFail, "top", "login")
		contains(t, "top of an untracked rule", errOut, "does not record its denied keys")
		errOut = s.mustFail(t, exitFail, "top", "-since", "-5m", "api")
		contains(t, "negative since", errOut, "invalid duration")
		errOut = s.mustFail(t, exitFail, "block", "-for", "-5m", "api", "ip:10.0.0.2")
		contains(t, "negative block", errOut, "invalid duration")

		// Bad command lines: exit 2 and the usage.
		for _, args := range [][]string{
			{}, {"frobnicate"}, {"usage", "api"}, {"reset", "-n", "3", "api", "k"},
			{"block", "api", "k"}, {"override"}, {"override", "list"}, {"-bogus", "rules"},
		} {
			errOut := s.mustFail(t, exitUsage, args...)
			contains(t, strings.Join(args, " "), errOut, "usage: ratewindow")
		}
		out, _, code := s.cli(t, "", "-h")
		if code != exitOK || !strings.Contains(out, "usage: ratewindow") {
			t.Errorf("-h: exit %d, %q", code, out)
		}
	})
}

func TestResetReachesEveryReplica(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		for range 5 {
			s.hit(t, 0, "ip:10.0.0.3")
		}
		if s.hit(t, 0, "ip:10.0.0.3") != http.StatusTooManyRequests || s.hit(t, 1, "ip:10.0.0.3") != http.StatusTooManyRequests {
			t.Fatal("a key at its limit passed")
		}
		out := s.mustRun(t, "reset", "api", "ip:10.0.0.3")
		done := time.Now()
		contains(t, "reset", out, `reset: "ip:10.0.0.3" under rule "api"`)
		// Each replica forgets its cached denial within the deny cache's second.
		for i := range 2 {
			waitFor(t, denyCacheBound-time.Since(done), func() bool { return s.hit(t, i, "ip:10.0.0.3") == http.StatusOK })
		}
	})
}

func TestBlockAndUnblock(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		s.hit(t, 0, "ip:10.0.0.4")
		s.mustRun(t, "block", "-for", "10m", "api", "ip:10.0.0.4")
		if s.hit(t, 1, "ip:10.0.0.4") != http.StatusTooManyRequests {
			t.Fatal("a blocked key passed")
		}
		var u admin.Usage
		decode(t, s.mustRun(t, "usage", "-json", "api", "ip:10.0.0.4"), &u)
		if d := time.Duration(u.Blocked); d < 9*time.Minute || d > 10*time.Minute {
			t.Errorf("blocked for %s, want about 10m", d)
		}
		contains(t, "usage of a blocked key", s.mustRun(t, "usage", "api", "ip:10.0.0.4"), "blocked   for ")

		s.mustRun(t, "unblock", "api", "ip:10.0.0.4")
		done := time.Now()
		for i := range 2 {
			waitFor(t, denyCacheBound-time.Since(done), func() bool { return s.hit(t, i, "ip:10.0.0.4") == http.StatusOK })
		}
		errOut := s.mustFail(t, exitFail, "unblock", "api", "ip:10.0.0.4")
		contains(t, "unblock of a key not blocked", errOut, "not blocked")
	})
}

// denyCacheBound is how long a replica may answer from its deny cache
// after another replica's change (WithDenyCache: a second), and the time
// of a few requests on a busy machine.
const denyCacheBound = time.Second + 250*time.Millisecond

// admits sends requests from key through both replicas in turn until n
// have passed, and fails t unless that happens within denyCacheBound; it
// then checks that neither replica admits one more for longer than the
// deny cache holds a denial.
func (s *service) admits(t *testing.T, key string, n int) {
	t.Helper()
	start, passed := time.Now(), 0
	for passed < n {
		if time.Since(start) > denyCacheBound {
			t.Fatalf("%s: %d of %d passed within %s", key, passed, n, denyCacheBound)
		}
		for i := range 2 {
			if passed < n && s.hit(t, i, key) == http.StatusOK {
				passed++
			}
		}
	}
	for end := time.Now().Add(denyCacheBound); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for i := range 2 {
			if code := s.hit(t, i, key); code != http.StatusTooManyRequests {
				t.Fatalf("%s: replica %d admitted one more than %d: %d", key, i, n, code)
			}
		}
	}
}

func TestOverride(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		for _, c := range []struct {
			name  string
			cache int
			key   string
		}{{"deny cache", core.DefaultDenyCacheSize, "ip:10.0.0.5"}, {"no deny cache", 0, "ip:10.0.0.15"}} {
			t.Run(c.name, func(t *testing.T) {
				s, key := s.replicas(t, c.cache), c.key
				// At its limit on both replicas, each holding the denial.
				s.admits(t, key, 5)

				// A raise: 3 more pass, on either replica, and no more.
				var ov admin.Override
				decode(t, s.mustRun(t, "override", "set", "-json", "api", key, "8/m"), &ov)
				if len(ov.Limits) != 1 || ov.Limits[0].Count != 8 || time.Duration(ov.Limits[0].Window) != time.Minute || ov.TTL != 0 {
					t.Fatalf("override set -json: %+v", ov)
				}
				s.admits(t, key, 3)
				contains(t, "override get", s.mustRun(t, "override", "get", "api", key), "8/1m until removed")
				var u admin.Usage
				decode(t, s.mustRun(t, "usage", "-json", "api", key), &u)
				if u.Override == nil || u.Limits[0].Limit.Count != 8 || u.Limits[0].Used != 8 || u.Limits[0].Remaining != 0 || u.Limits[1].Limit.Count != 100 {
					t.Errorf("usage under the override: %+v", u)
				}

				// A lower limit on a fresh key, then its removal restores the rule's 5.
				low := key + "1"
				s.mustRun(t, "override", "set", "api", low, "2/m")
				s.admits(t, low, 2)
				s.mustRun(t, "override", "rm", "api", low)
				s.admits(t, low, 3)
				errOut := s.mustFail(t, exitFail, "override", "get", "api", low)
				contains(t, "override get after rm", errOut, "no override")
				errOut = s.mustFail(t, exitFail, "override", "rm", "api", low)
				contains(t, "override rm twice", errOut, "no override")
			})
		}
		const ip = "ip:10.0.0.25"

		// A temporary override, and bad ones that write nothing.
		contains(t, "override set -for", s.mustRun(t, "override", "set", "-for", "1h", "api", ip, "50/m, 500/h"), "50/1m, 500/1h for 1h")
		s.mustRun(t, "override", "rm", "api", ip)
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"api", ip, "0/m"}, "not a whole number above 0"},
			{[]string{"api", ip, "10/7m"}, `no limit of window 7m (its limits: 5/1m, 100/1h)`},
			{[]string{"api", ip, "10"}, "has 2 limits"},
			{[]string{"api", ip, "10/m, 20/m"}, "twice"},
			{[]string{"api", ip, "99999/m"}, "MaxLogCount"},
			{[]string{"api", ip, "ten/m"}, "not a whole number"},
			{[]string{"-for", "-5m", "api", ip, "10/m"}, "invalid duration"},
			{[]string{"nope", ip, "10/m"}, "unknown rule"},
		} {
			errOut := s.mustFail(t, exitFail, append([]string{"override", "set"}, c.args...)...)
			contains(t, "override set "+strings.Join(c.args, " "), errOut, c.want)
			s.mustFail(t, exitFail, "override", "get", "api", ip)
		}
		// A rule of one limit takes a count alone.
		s.hit(t, 0, "ip:10.0.0.6")
		contains(t, "override of a one-limit rule", s.mustRun(t, "override", "set", "login", "ip:10.0.0.6", "7"), "7/1m until removed")
	})
}

func TestTopListsTheFloodedKeyFirst(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		const flooder = "ip:10.66.0.1"
		for i := range 1000 {
			ip := "ip:" + net.IPv4(10, 1, byte(i>>8), byte(i)).String()
			if code := s.hit(t, i%2, ip); code != http.StatusOK {
				t.Fatalf("%s: %d", ip, code)
			}
			if i%10 == 0 {
				s.hit(t, i%2, flooder)
			}
		}
		// The replicas' deny caches answer most of the flood: the keys are
		// recorded from the denials that reached Redis, within a second or so.
		var top admin.Top
		waitFor(t, 5*time.Second, func() bool {
			decode(t, s.mustRun(t, "top", "-json", "api"), &top)
			return len(top.Keys) > 0
		})
		if top.Keys[0].Key != flooder || len(top.Keys) != 1 {
			t.Errorf("top: %+v, want %s alone", top, flooder)
		}
		out := s.mustRun(t, "top", "-n", "3", "-since", "10m", "api")
		contains(t, "top", out, "KEY", "DENIALS", flooder)
		contains(t, "top of a quiet rule", s.mustRun(t, "top", "-since", "1m", "api", "-n", "1"), flooder)
	})
}

func TestConfirmBeforeManyKeys(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		keys := []string{"ip:10.0.1.1", "ip:10.0.1.2", "ip:10.0.1.3"}
		for _, k := range keys {
			s.hit(t, 0, k)
		}
		used := func(k string) int64 {
			lim := apiLimits()[0]
			r, err := s.a.Peek(context.Background(), core.RuleKey("api", k), lim)
			if err != nil {
				t.Fatal(err)
			}
			return lim.Count - r.Remaining
		}
		args := append([]string{"reset", "api"}, keys...)
		for _, answer := range []string{"", "n\n", "no\n", "maybe\n"} {
			_, errOut, code := s.cli(t, answer, args...)
			if code != exitFail || !strings.Contains(errOut, "Go on? [y/N]") || !strings.Contains(errOut, "nothing changed") {
				t.Errorf("answer %q: exit %d, %q", answer, code, errOut)
			}
			for _, k := range keys {
				if used(k) != 1 {
					t.Fatalf("answer %q reset %s", answer, k)
				}
			}
		}
		out, errOut, code := s.cli(t, "y\n", args...)
		if code != exitOK || strings.Count(out, "reset: ") != 3 || !strings.Contains(errOut, `reset 3 keys under rule "api": ip:10.0.1.1, ip:10.0.1.2, ip:10.0.1.3`) {
			t.Errorf("yes: exit %d\n%s\n%s", code, out, errOut)
		}
		for _, k := range keys {
			if used(k) != 0 {
				t.Errorf("%s not reset", k)
			}
			s.hit(t, 0, k)
		}
		// -yes asks nothing; one key fails, the others are done, and -json says which.
		var outcomes []struct {
			Key   string `json:"key"`
			Done  bool   `json:"done"`
			Error string `json:"error"`
		}
		out, errOut, code = s.cli(t, "", "-yes", "-json", "reset", "api", keys[0], "ip:10.0.9.9", keys[1])
		if code != exitFail || strings.Contains(errOut, "Go on?") || !strings.Contains(errOut, "failed on 1 of 3 keys") {
			t.Errorf("-yes with an unknown key: exit %d, %q", code, errOut)
		}
		decode(t, out, &outcomes)
		if len(outcomes) != 3 || !outcomes[0].Done || outcomes[1].Done || !strings.Contains(outcomes[1].Error, "unknown key") || !outcomes[2].Done {
			t.Errorf("outcomes: %+v", outcomes)
		}
		// One key: no question.
		if _, errOut, code := s.cli(t, "", "block", "-for", "1m", "api", keys[2]); code != exitOK || strings.Contains(errOut, "Go on?") {
			t.Errorf("block of one key: exit %d, %q", code, errOut)
		}
	})
}

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
