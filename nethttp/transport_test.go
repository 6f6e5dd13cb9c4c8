package nethttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
	"github.com/ratewindow/ratewindow/nethttp"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func ExampleTransport() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "quote for ", r.URL.Query().Get("item"))
	}))
	defer api.Close()

	l := core.NewMemory() // core.New(redisClient) shares the quota across replicas
	client := &http.Client{Transport: &nethttp.Transport{
		Limiter: l,
		Rule:    core.Rule{Name: "pricing", Limits: []core.Limit{core.Per(2, 100*time.Millisecond)}},
	}}
	start := time.Now()
	for _, item := range []string{"a", "b", "c"} {
		resp, err := client.Get(api.URL + "?item=" + item)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(string(body))
	}
	// two go at once; the third waits for the window to slide
	fmt.Println(time.Since(start) >= 100*time.Millisecond)
	// Output:
	// quote for a
	// quote for b
	// quote for c
	// true
}

// newLimiter returns a Limiter on the shared test Redis with a prefix of
// its own, failing closed so that a Redis error is never a silent pass.
func newLimiter(t *testing.T) *core.Limiter {
	t.Helper()
	srv := redistest.New(t)
	prefix := fmt.Sprintf("transport%d:", time.Now().UnixNano())
	l, err := core.New(srv.Client(t), core.WithPrefix(prefix), core.WithFailureMode(core.FailClosed), core.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// arrivals is a test server that records when each request arrives.
type arrivals struct {
	*httptest.Server
	mu    sync.Mutex
	times []int64 // µs
}

func newArrivals(t *testing.T) *arrivals {
	a := &arrivals{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UnixMicro()
		a.mu.Lock()
		a.times = append(a.times, now)
		a.mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *arrivals) sorted() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	ts := slices.Clone(a.times)
	slices.Sort(ts)
	return ts
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.times)
}

// maxInWindow returns the most of the sorted times ts (µs) that any
// half-open interval [t, t+w) holds.
func maxInWindow(ts []int64, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= w.Microseconds() {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// arrivalTolerance is how much later than its slot a request may arrive:
// the timer, a new connection, the scheduler of a busy test machine. Requests never leave before
// their slot, so a window of Window minus this over the arrivals lies
// inside a window of Window over the slots, which holds at most Count.
const arrivalTolerance = 50 * time.Millisecond

func get(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// 20 concurrent requests, 5 per 500ms: all arrive, in 4 groups, and no
// window holds more than 5. The hook sees each delay.
func TestTransportThrottles(t *testing.T) {
	srv := newArrivals(t)
	lim := core.Per(5, 500*time.Millisecond)
	var (
		mu     sync.Mutex
		delays []time.Duration
	)
	tr, err := nethttp.NewTransport(nil, newLimiter(t), core.Rule{Name: "api", Limits: []core.Limit{lim}})
	if err != nil {
		t.Fatal(err)
	}
	tr.OnWait = func(r *http.Request, d time.Duration) {
		mu.Lock()
		delays = append(delays, d)
		mu.Unlock()
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	stalls := stall.Start(t)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := get(context.Background(), client, srv.URL); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ts := srv.sorted()
	if len(ts) != 20 {
		t.Fatalf("%d of 20 requests arrived", len(ts))
	}
	stall := stalls.Finish()
	if got := maxInWindow(ts, lim.Window-arrivalTolerance); got > 5 {
		msg := fmt.Sprintf("a window of %s holds %d arrivals, limit 5", lim.Window-arrivalTolerance, got)
		if stall < arrivalTolerance/2 {
			t.Fatal(msg)
		}
		t.Logf("inconclusive, this process stalled for %s: %s", stall, msg)
	}
	// 4 groups of 5: the first goes at once, the others wait 500ms or more;
	// on a loaded machine a first-group caller whose reply was read late
	// moves to a later slot (never to an earlier one)
	slices.Sort(delays)
	if len(delays) != 20 || delays[0] >= 400*time.Millisecond || delays[5] < 400*time.Millisecond {
		t.Fatalf("delays seen by the hook: %v; want up to 5 short and the rest of 500ms or more", delays)
	}
	t.Logf("last arrival %s after the first; delays %s..%s; worst stall %s", time.Duration(ts[19]-ts[0])*time.Microsecond, delays[0], delays[19], stall)
}

// closeRecorder is a request body that records its Close.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (b *closeRecorder) Close() error { b.closed.Store(true); return nil }

// A request whose context ends while it waits returns at once with the
// context's error, is not sent, and gives its slot back; one whose slot
// lies past its deadline fails at once.
func TestTransportContext(t *testing.T) {
	srv := newArrivals(t)
	l := newLimiter(t)
	rule := core.Rule{Name: "api", Limits: []core.Limit{core.PerHour(1)}}
	// no margin: the test peeks at the rule's own limits
	client := &http.Client{Transport: &nethttp.Transport{Limiter: l, Rule: rule, Margin: -1}}
	defer client.CloseIdleConnections()
	ctx := context.Background()
	if err := get(ctx, client, srv.URL); err != nil {
		t.Fatal(err)
	}
	key := "api:host:" + strings.TrimPrefix(srv.URL, "http://")

	t.Run("cancelled while waiting", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		body := &closeRecorder{Reader: strings.NewReader("payload")}
		req, err := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		time.Sleep(100 * time.Millisecond) // it sleeps towards a slot an hour away
		stalls := stall.Start(t)
		cancel()
		cancelled := time.Now()
		select {
		case err = <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the cancelled request did not return")
		}
		beyond(t, stalls, time.Since(cancelled), 250*time.Millisecond, "the return after the cancel")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		if !body.closed.Load() {
			t.Error("the request body was not closed")
		}
		// its slot was given back: the hour still holds only the first
		// request (a reservation whose reply was still on its way when the
		// caller left is given back once the reply arrives)
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			r, err := l.Peek(ctx, key, rule.Limits...)
			if err == nil && !r.Allowed && r.ResetAfter <= time.Hour && r.ResetAfter >= 59*time.Minute {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("peek after the cancel: %+v %v", r, err)
			}
		}
	})
	t.Run("slot past the deadline", func(t *testing.T) {
		dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		stalls := stall.Start(t)
		start := time.Now()
		err := get(dctx, client, srv.URL)
		// it must not wait for a slot past the deadline
		beyond(t, stalls, time.Since(start), 250*time.Millisecond, "the return")
		if !errors.Is(err, core.ErrWaitExceedsDeadline) {
			t.Fatalf("got %v, want ErrWaitExceedsDeadline", err)
		}
	})
	if n := srv.count(); n != 1 {
		t.Fatalf("the server got %d requests, want 1", n)
	}
}

// roundTripFunc is a Base that answers without a network.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ok is a Base that answers 200 and counts the requests it sent.
func ok(sent *atomic.Int64) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent.Add(1)
		if r.Body != nil {
			r.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
}

// The key of a request under the rule: the host by default, or the rule's
// Key; the cost from Cost; Skip passes without counting.
func TestTransportRule(t *testing.T) {
	ctx := context.Background()
	hour := core.PerHour(2)
	errKey := errors.New("no tenant")
	type step struct {
		url  string
		hdr  string // X-Cost or X-Tenant value
		want error  // nil: sent
	}
	cases := []struct {
		name  string
		rule  core.Rule
		steps []step
	}{
		{"the default key is the host", core.Rule{Name: "h", Limits: []core.Limit{hour}}, []step{
			{"https://API.example.com/a", "", nil},
			{"https://api.example.com:443/b", "", nil},
			// the same host has the same quota, whatever the scheme
			{"http://api.example.com/c", "", core.ErrWaitExceedsDeadline},
			{"https://api.example.com:8443/d", "", nil}, // another port, another quota
			{"https://other.example.com/e", "", nil},
			{"http://[::1]:80/f", "", nil},
			{"http://[::1]/f", "", nil},
			{"http://[::1]/f", "", core.ErrWaitExceedsDeadline},
		}},
		{"a rule's Key shares a quota across hosts", core.Rule{Name: "k", Limits: []core.Limit{hour},
			Key: func(r *http.Request) (string, error) {
				if v := r.Header.Get("X-Tenant"); v != "" {
					return "tenant:" + v, nil
				}
				return "", errKey
			}}, []step{
			{"https://a.example.com/", "1", nil},
			{"https://b.example.com/", "1", nil},
			{"https://c.example.com/", "1", core.ErrWaitExceedsDeadline},
			{"https://c.example.com/", "2", nil},
			{"https://c.example.com/", "", errKey},
		}},
		{"Cost takes several units", core.Rule{Name: "c", Limits: []core.Limit{core.PerHour(3)},
			Cost: func(r *http.Request) int64 {
				var n int64
				fmt.Sscan(r.Header.Get("X-Cost"), &n)
				return n
			}}, []step{
			{"https://a.example.com/", "2", nil},
			{"https://a.example.com/", "2", core.ErrWaitExceedsDeadline},
			{"https://a.example.com/", "1", nil},
			{"https://b.example.com/", "4", core.ErrNeverFits},
			{"https://b.example.com/", "0", core.ErrInvalidCost},
		}},
		{"Skip passes without counting", core.Rule{Name: "s", Limits: []core.Limit{core.PerHour(1)},
			Skip: func(r *http.Request) bool { return r.URL.Path == "/health" }}, []step{
			{"https://a.example.com/health", "", nil},
			{"https://a.example.com/health", "", nil},
			{"https://a.example.com/", "", nil},
			{"https://a.example.com/health", "", nil},
			{"https://a.example.com/", "", core.ErrWaitExceedsDeadline},
		}},
	}
	l := newLimiter(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var sent atomic.Int64
			tr, err := nethttp.NewTransport(ok(&sent), l, c.rule)
			if err != nil {
				t.Fatal(err)
			}
			wantSent := int64(0)
			for i, s := range c.steps {
				dctx, cancel := context.WithTimeout(ctx, time.Second)
				body := &closeRecorder{Reader: strings.NewReader("x")}
				req, err := http.NewRequestWithContext(dctx, http.MethodPost, s.url, body)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("X-Cost", s.hdr)
				req.Header.Set("X-Tenant", s.hdr)
				resp, err := tr.RoundTrip(req)
				cancel()
				if s.want == nil && err == nil {
					wantSent++
					resp.Body.Close()
				} else if !errors.Is(err, s.want) {
					t.Fatalf("step %d (%s %q): got %v, want %v", i, s.url, s.hdr, err, s.want)
				}
				if !body.closed.Load() {
					t.Fatalf("step %d: the request body was not closed", i)
				}
				if sent.Load() != wantSent {
					t.Fatalf("step %d: %d requests sent, want %d", i, sent.Load(), wantSent)
				}
			}
		})
	}
}

// A bad rule or a missing Limiter is an error of NewTransport, and of
// every RoundTrip of a Transport built as a literal: nothing is sent.
func TestTransportInvalid(t *testing.T) {
	l := core.NewMemory()
	good := []core.Limit{core.PerSecond(1)}
	cases := []struct {
		name string
		l    *core.Limiter
		rule core.Rule
		want error
	}{
		{"no name", l, core.Rule{Limits: good}, core.ErrInvalidRule},
		{"no limits", l, core.Rule{Name: "x"}, core.ErrNoLimits},
		{"bad limit", l, core.Rule{Name: "x", Limits: []core.Limit{core.PerSecond(0)}}, core.ErrInvalidLimit},
		{"nil Limiter", nil, core.Rule{Name: "x", Limits: good}, core.ErrInvalidRule},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var sent atomic.Int64
			if tr, err := nethttp.NewTransport(ok(&sent), c.l, c.rule); !errors.Is(err, c.want) || tr != nil {
				t.Fatalf("NewTransport: %v, %v; want %v", tr, err, c.want)
			}
			tr := &nethttp.Transport{Base: ok(&sent), Limiter: c.l, Rule: c.rule}
			for range 2 {
				body := &closeRecorder{Reader: strings.NewReader("x")}
				req := httptest.NewRequest(http.MethodPost, "https://api.example.com/", body)
				if _, err := tr.RoundTrip(req); !errors.Is(err, c.want) {
					t.Fatalf("RoundTrip: %v, want %v", err, c.want)
				}
				if !body.closed.Load() {
					t.Fatal("the request body was not closed")
				}
			}
			if sent.Load() != 0 {
				t.Fatalf("%d requests sent", sent.Load())
			}
		})
	}
}

// Limits that a Rule takes are valid for the Transport too, widened by its
// margin: a window stops at core.MaxWindow, and sliding buckets keep their
// number of buckets (the client interceptors of grpcmw widen alike).
func TestTransportLongestWindow(t *testing.T) {
	var sent atomic.Int64
	rule := core.Rule{Name: "yearly", Limits: []core.Limit{core.Per(1000, core.MaxWindow)}}
	tr, err := nethttp.NewTransport(ok(&sent), core.NewMemory(), rule)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	// sliding buckets at MaxBuckets together keep as many buckets when widened
	buckets := core.Rule{Name: "buckets", Limits: []core.Limit{
		{Count: 10, Window: time.Minute, Algorithm: core.SlidingBuckets, Precision: 120 * time.Millisecond}, // 500
		{Count: 10, Window: time.Hour, Algorithm: core.SlidingBuckets, Precision: 6875 * time.Millisecond},  // 524
	}}
	if err := buckets.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := nethttp.NewTransport(ok(&sent), core.NewMemory(), buckets); err != nil {
		t.Fatalf("NewTransport of a rule Validate accepts: %v", err)
	}
	resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "https://api.example.com/", nil))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	resp.Body.Close()
	if sent.Load() != 1 {
		t.Fatalf("%d requests sent, want 1", sent.Load())
	}
}

// The observer sees the Transport's waits under the rule's name.
func TestTransportWaitEventsNameTheRule(t *testing.T) {
	var mu sync.Mutex
	var rules []string
	l := core.NewMemory(core.WithObserver(func(ev core.Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Op == core.OpWait {
			rules = append(rules, ev.Rule)
		}
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	tr, err := nethttp.NewTransport(nil, l, core.Rule{Name: "partner", Limits: []core.Limit{core.PerSecond(10)}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(rules) != 1 || rules[0] != "partner" {
		t.Fatalf("wait events' rules: %q, want [partner]", rules)
	}
}

// beyond fails t when d passed bound by more than the worst stall of this
// process that m has seen (a loaded machine delays every time the test
// records by as much; a hang of the code under test is no stall).
func beyond(t *testing.T, m *stall.Meter, d, bound time.Duration, what string) {
	t.Helper()
	if stalled := m.Worst(); d > bound+stalled {
		t.Errorf("%s took %v, want < %v (the worst stall of the process: %v)", what, d, bound, stalled)
	} else if d > bound {
		t.Logf("%s took %v, over %v, but this process stalled for %v: inconclusive", what, d, bound, stalled)
	}
}

// TestTransportRetryWaitsWhenBlockFails: an upstream refusal's Retry-After
// is waited out before the retry when the Block that tells every replica
// fails (Redis down, or its client closed at shutdown): the retries went
// at once, 4 requests in a millisecond to an upstream that asked for 1s.
func TestTransportRetryWaitsWhenBlockFails(t *testing.T) {
	var mu sync.Mutex
	var arrived []time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived = append(arrived, time.Now())
		mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(up.Close)
	rdb := redistest.New(t).Client(t)
	l, err := core.New(rdb) // FailOpen: every Wait passes while Redis is gone
	if err != nil {
		t.Fatal(err)
	}
	rdb.Close()
	tr := &nethttp.Transport{Limiter: l, MaxRetries: 1, Rule: core.Rule{Name: "api", Limits: []core.Limit{core.PerSecond(100)}}}
	req, _ := http.NewRequest(http.MethodGet, up.URL, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	got := slices.Clone(arrived)
	arrived = nil
	mu.Unlock()
	if resp.StatusCode != http.StatusTooManyRequests || len(got) != 2 {
		t.Fatalf("%d, %d requests; want the upstream's 429 after 2", resp.StatusCode, len(got))
	}
	if gap := got[1].Sub(got[0]); gap < time.Second {
		t.Fatalf("the retry went %s after the refusal, inside its Retry-After: 1", gap)
	}
	// a Retry-After that outlasts the request's deadline: no retry, the
	// upstream's answer at once
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
	resp, err = (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusTooManyRequests || len(arrived) != 1 {
		t.Fatalf("%d, %d requests; want the upstream's 429 after 1", resp.StatusCode, len(arrived))
	}
	resp.Body.Close()
}

// TestTransportFailClosedRefusalNoWait: under FailClosed, when the Block of
// a refusal fails the retry could only fail: the upstream's refusal comes
// back at once, with no wait for its Retry-After.
func TestTransportFailClosedRefusalNoWait(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	var once sync.Once
	var arrived atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		once.Do(func() { rdb.Close() }) // Redis gone after the first Wait
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(up.Close)
	l, err := core.New(rdb, core.WithFailureMode(core.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	tr := &nethttp.Transport{Limiter: l, MaxRetries: 1, Rule: core.Rule{Name: "api", Limits: []core.Limit{core.PerSecond(100)}}}
	req, _ := http.NewRequest(http.MethodGet, up.URL, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests || arrived.Load() != 1 {
		t.Fatalf("%v, %d requests; want the upstream's 429 after 1", err, arrived.Load())
	}
	resp.Body.Close()
}
