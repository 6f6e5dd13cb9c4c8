package core_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

// TestStackedOuterCounts: an outer per-IP rule (10 a minute, a Penalty
// banning after 3 denials) in front of an inner per-account rule (1 a
// minute), one IP repeating one exhausted account: the outer rule counts
// every request the inner rule denies, denies from the 11th and bans at
// its 3rd denial; once the inner rule's denial is cached, a request costs
// Redis at most one script call (the outer rule's decision), and none
// once the ban is cached.
func TestStackedOuterCounts(t *testing.T) {
	proc := redistest.Start(t)
	rdb := proc.Client(t)
	var mu sync.Mutex
	var bans, outerDenials, retried int // retried: calls that went again, and may have counted twice
	l, err := core.New(rdb, core.WithObserver(func(ev core.Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Retried {
			retried++
		}
		if ev.Rule == "ip" && ev.Op == core.OpAllow && !ev.Result.Allowed {
			outerDenials++
		}
		if ev.Banned {
			bans++
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	outer := mustEnforcer(t, l, core.Rule{Name: "ip", Limits: []core.Limit{core.PerMinute(10)},
		Penalty: &core.Penalty{Denials: 3, Within: time.Minute, Ban: time.Hour}})
	inner := mustEnforcer(t, l, core.Rule{Name: "account", Limits: []core.Limit{core.PerMinute(1)}, Key: keyfuncs.Header("X-Account")})
	request := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/things/1", nil)
		req.RemoteAddr = "192.0.2.1:1"
		req.Header.Set("X-Account", "a")
		req.Header.Set("Accept", "application/problem+json")
		return serve(req, outer, inner)
	}
	const requests = 3000
	before := core.EvalCalls(t, rdb)
	began := time.Now()
	var calls []int64 // script calls of each of the first requests
	for i := range requests {
		c := core.EvalCalls(t, rdb)
		rec := request()
		if i < 20 {
			calls = append(calls, core.EvalCalls(t, rdb)-c) // INFO is no script call
		}
		body := rec.Body.String()
		mu.Lock()
		early := retried // a call that went again may have counted a request twice: the outer rule denies as much earlier
		mu.Unlock()
		switch {
		case i == 0 && rec.Code != 200:
			t.Fatalf("request 1: %d, want 200", rec.Code)
		case i > 0 && rec.Code != 429:
			t.Fatalf("request %d: %d, want 429", i+1, rec.Code)
		case i >= 1 && i < 10-early && !strings.Contains(body, `"1-per-1m"`):
			t.Fatalf("request %d: %s, want the inner rule's denial", i+1, body)
		case i >= 10 && i < 12-early && !strings.Contains(body, `"10-per-1m"`):
			t.Fatalf("request %d: %s, want the outer rule's denial", i+1, body)
		case i >= 12 && !strings.Contains(body, core.ProblemAbnormalUsage):
			t.Fatalf("request %d: %s, want the outer rule's ban", i+1, body)
		}
	}
	took := time.Since(began)
	total := core.EvalCalls(t, rdb) - before
	t.Logf("%d requests in %s (%.0f/s): %d script calls; per request of the first 20: %v",
		requests, took.Round(time.Millisecond), requests/took.Seconds(), total, calls)
	mu.Lock()
	defer mu.Unlock()
	if outerDenials < 3 || bans != 1 {
		t.Fatalf("the outer rule denied %d times and banned %d times, want at least 3 denials and 1 ban", outerDenials, bans)
	}
	for i, c := range calls {
		if i >= 2 && c > int64(1+retried) { // the first two: the inner rule's admission and first denial
			t.Fatalf("request %d cost %d script calls, want at most 1 (calls per request %v; %d went again)", i+1, c, calls, retried)
		}
	}
	// and a cached denial's recheck a second (a loaded machine's run is longer)
	if most := int64(20 + retried + int(took/time.Second)); total > most {
		t.Fatalf("%d requests in %s cost %d script calls, want at most %d (%d went again)", requests, took, total, most, retried)
	}
}

// TestRefundIfStopped: an outer rule with RefundIfStopped gives back the
// units of the requests an inner rule stops (a quota spent only by served
// requests); without it, the outer rule keeps them. A rule with a Penalty
// cannot have it.
func TestRefundIfStopped(t *testing.T) {
	ctx := context.Background()
	for _, refund := range []bool{false, true} {
		l := core.NewMemory()
		outerRule := core.Rule{Name: "quota", Limits: []core.Limit{core.PerMinute(100)}, RefundIfStopped: refund}
		outer := mustEnforcer(t, l, outerRule)
		inner := mustEnforcer(t, l, core.Rule{Name: "account", Limits: []core.Limit{core.PerMinute(1)}})
		for range 5 {
			serve(httptest.NewRequest(http.MethodGet, "/things/1", nil), outer, inner)
		}
		want := int64(95) // every request reached the outer rule
		if refund {
			want = 99 // only the one served
		}
		if r, err := l.Peek(ctx, "quota:ip:192.0.2.1", outerRule.Limits...); err != nil || r.Remaining != want {
			t.Errorf("RefundIfStopped %v: the outer rule keeps %d of 100 (%v), want %d", refund, r.Remaining, err, want)
		}
	}
	_, err := core.NewEnforcer(core.NewMemory(), core.Rule{Name: "r", Limits: []core.Limit{core.PerMinute(1)}, RefundIfStopped: true,
		Penalty: &core.Penalty{Denials: 1, Within: time.Minute, Ban: time.Minute}})
	if !errors.Is(err, core.ErrInvalidRule) || !strings.Contains(err.Error(), "Penalty with RefundIfStopped") {
		t.Fatalf("a rule with Penalty and RefundIfStopped: %v, want ErrInvalidRule", err)
	}
}

// TestCountIfJudgesStop: a rule with CountIf judges the status a later
// rule stopped the request with: a login rule counting 401s gives back
// the units of requests an inner rule denied (429), and one counting 429s
// keeps them.
func TestCountIfJudgesStop(t *testing.T) {
	for _, counted := range []int{401, 429} {
		l := core.NewMemory()
		outerRule := core.Rule{Name: "login", Limits: []core.Limit{core.PerMinute(100)},
			CountIf: func(status int) bool { return status == counted }}
		outer := mustEnforcer(t, l, outerRule)
		inner := mustEnforcer(t, l, core.Rule{Name: "account", Limits: []core.Limit{core.PerMinute(1)}})
		for range 5 {
			serveSettled(httptest.NewRequest(http.MethodPost, "/login", nil), outer, inner)
		}
		want := int64(100) // the served one answered 200
		if counted == 429 {
			want = 96
		}
		if r, err := l.Peek(context.Background(), "login:ip:192.0.2.1", outerRule.Limits...); err != nil || r.Remaining != want {
			t.Errorf("CountIf(%d): the outer rule keeps %d of 100 (%v), want %d", counted, r.Remaining, err, want)
		}
	}
}

// serveSettled is serve with each rule's ServeNext (CountIf settles).
func serveSettled(req *http.Request, es ...*core.Enforcer) *httptest.ResponseRecorder {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	for i := len(es) - 1; i >= 0; i-- {
		e, next := es[i], h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r, ok := e.Handle(w, r, "/login"); ok {
				e.ServeNext(w, r, next)
			}
		})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
