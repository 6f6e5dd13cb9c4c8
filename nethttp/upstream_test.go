package nethttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/nethttp"
)

// strict is an upstream that admits at most limit requests in any window
// (an exact sliding window of the arrivals it admitted) and refuses the
// rest with 429 and refuse's headers.
type strict struct {
	*httptest.Server
	limit    int
	window   time.Duration
	refuse   func(h http.Header)
	mu       sync.Mutex
	admitted []time.Time
	refused  int
	arrived  []time.Time // every arrival
}

func newStrict(t *testing.T, limit int, window time.Duration, refuse func(http.Header)) *strict {
	s := &strict{limit: limit, window: window, refuse: refuse}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.arrived = append(s.arrived, now)
		in := 0
		for _, a := range s.admitted {
			if now.Sub(a) < s.window {
				in++
			}
		}
		ok := in < s.limit
		if ok {
			s.admitted = append(s.admitted, now)
		} else {
			s.refused++
		}
		s.mu.Unlock()
		if !ok {
			s.refuse(w.Header())
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, "slow down")
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(s.Close)
	return s
}

func retryAfter(v string) func(http.Header) { return func(h http.Header) { h.Set("Retry-After", v) } }

func (s *strict) counts() (admitted, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.admitted), s.refused
}

// replicas returns n Limiters on one Redis, each with a client of its
// own, sharing a prefix: n replicas of a service.
func replicas(t *testing.T, n int) []*core.Limiter {
	t.Helper()
	srv := redistest.New(t)
	prefix := fmt.Sprintf("upstream%d:", time.Now().UnixNano())
	var ls []*core.Limiter
	for range n {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		l, err := core.New(c, core.WithPrefix(prefix), core.WithFailureMode(core.FailClosed), core.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	return ls
}

// fleet sends each requests at once from every replica through its own
// Transport with limit, and returns the status codes the callers saw, the
// errors, and the time until the last answer.
func fleet(t *testing.T, up *strict, ls []*core.Limiter, each int, limit core.Limit) (codes map[int]int, errs []error, took time.Duration) {
	t.Helper()
	codes = map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range ls {
		client := &http.Client{Transport: &nethttp.Transport{Limiter: l, Rule: core.Rule{Name: "api", Limits: []core.Limit{limit}}}}
		t.Cleanup(client.CloseIdleConnections)
		for range each {
			wg.Go(func() {
				resp, err := client.Get(up.URL)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes[resp.StatusCode]++
			})
		}
	}
	wg.Wait()
	return codes, errs, time.Since(start)
}

// TestTransportStrictUpstream: 3 replicas call an upstream that refuses
// anything past its quota in an exact sliding window. At equal limits, and
// with the upstream 20% stricter, no caller sees a 429 and nothing is
// dropped; with the stricter one, the refusals block the key for the whole
// fleet and the requests go again.
func TestTransportStrictUpstream(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name           string
		upstream, each int
	}{
		{"equal limits", 10, 10},
		{"upstream 20% stricter", 8, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := newStrict(t, c.upstream, time.Second, retryAfter("1"))
			codes, errs, took := fleet(t, up, replicas(t, 3), c.each, core.PerSecond(10))
			admitted, refused := up.counts()
			if len(errs) != 0 || codes[http.StatusOK] != 3*c.each || admitted != 3*c.each {
				t.Fatalf("callers saw %v and errors %v; the upstream admitted %d of %d", codes, errs, admitted, 3*c.each)
			}
			t.Logf("%d requests, upstream %d/s, client 10/s: %d upstream 429s, none reached a caller; %s", 3*c.each, c.upstream, refused, took.Round(time.Millisecond))
		})
	}
}

// TestTransportTargets measures the scenarios at full size: 3
// replicas × 50 requests at 10/s against an upstream of 10/s and of 9/s.
// It takes about 35s: RATEWINDOW_TRANSPORT_TARGETS=1 runs it.
func TestTransportTargets(t *testing.T) {
	if os.Getenv("RATEWINDOW_TRANSPORT_TARGETS") != "1" {
		t.Skip("RATEWINDOW_TRANSPORT_TARGETS=1 runs the full-size scenarios")
	}
	for _, upstream := range []int{10, 9} {
		up := newStrict(t, upstream, time.Second, retryAfter("1"))
		codes, errs, took := fleet(t, up, replicas(t, 3), 50, core.PerSecond(10))
		_, refused := up.counts()
		ideal := time.Duration(float64(150-upstream) / float64(min(upstream, 10)) * float64(time.Second))
		t.Logf("upstream %d/s: callers saw %v, %d dropped, %d upstream 429s, %s (ideal %s, %+.1f%%)",
			upstream, codes, len(errs), refused, took.Round(time.Millisecond), ideal, 100*(took.Seconds()/ideal.Seconds()-1))
		if len(errs) != 0 || codes[http.StatusOK] != 150 {
			t.Errorf("upstream %d/s: callers saw %v, errors %v", upstream, codes, errs)
		}
	}
}

// TestTransportRefusals: the upstream's refusal blocks the key on every
// replica, for the time it asked (a huge one capped), is retried only when
// the request can be replayed, and within the caller's deadline.
func TestTransportRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim := core.PerSecond(100)
	send := func(tr *nethttp.Transport, req *http.Request) (*http.Response, string, error) {
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body), nil
	}
	newReq := func(ctx context.Context, url string) *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	keyOf := func(url string) string { return "api:host:" + strings.TrimPrefix(url, "http://") }

	t.Run("a block stops the other replicas", func(t *testing.T) {
		t.Parallel()
		up := newStrict(t, 0, time.Second, retryAfter("3"))
		ls := replicas(t, 2)
		a := &nethttp.Transport{Limiter: ls[0], Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}, MaxRetries: -1}
		resp, body, err := send(a, newReq(ctx, up.URL))
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || body != "slow down" {
			t.Fatalf("replica A: %v %q %v, want the 429 (no retries)", resp, body, err)
		}
		r, err := ls[1].Peek(ctx, keyOf(up.URL), core.PerMinute(1000))
		if err != nil || r.Allowed || r.RetryAfter < 2*time.Second || r.RetryAfter > 3*time.Second {
			t.Fatalf("replica B sees %+v %v, want blocked for about 3s", r, err)
		}
		b := &nethttp.Transport{Limiter: ls[1], Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}}
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, _, err := send(b, newReq(dctx, up.URL)); !errors.Is(err, core.ErrWaitExceedsDeadline) {
			t.Fatalf("replica B's request: %v, want ErrWaitExceedsDeadline", err)
		}
		if _, refused := up.counts(); refused != 1 {
			t.Fatalf("the upstream refused %d requests, want 1: B must not send into the refusal", refused)
		}
	})
	t.Run("a huge Retry-After is capped", func(t *testing.T) {
		t.Parallel()
		// too large for an int64 too: the longest, not none (DefaultBlock)
		for _, refuse := range []func(http.Header){retryAfter("86400"), retryAfter("99999999999999999999"),
			func(h http.Header) { h.Set("RateLimit", `"p";r=0;t=99999999999999999999`) }} {
			up := newStrict(t, 0, time.Second, refuse)
			ls := replicas(t, 1)
			tr := &nethttp.Transport{Limiter: ls[0], Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}, MaxRetries: -1, MaxBlock: 2 * time.Second}
			if resp, _, err := send(tr, newReq(ctx, up.URL)); err != nil || resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("%v %v", resp, err)
			}
			r, err := ls[0].Peek(ctx, keyOf(up.URL), lim)
			if err != nil || r.Allowed || r.RetryAfter > 2*time.Second || r.RetryAfter < 1500*time.Millisecond {
				t.Errorf("blocked %+v %v, want MaxBlock (2s)", r, err)
			}
		}
	})
	t.Run("a body that cannot be replayed is not retried", func(t *testing.T) {
		t.Parallel()
		up := newStrict(t, 0, time.Second, retryAfter("1"))
		tr := &nethttp.Transport{Limiter: replicas(t, 1)[0], Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, io.NopCloser(strings.NewReader("once")))
		if err != nil {
			t.Fatal(err)
		}
		resp, body, err := send(tr, req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || body != "slow down" {
			t.Fatalf("%v %q %v, want the 429", resp, body, err)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		if len(up.arrived) != 1 {
			t.Fatalf("the upstream saw %d requests, want 1", len(up.arrived))
		}
	})
	t.Run("an HTTP-date Retry-After is honoured", func(t *testing.T) {
		t.Parallel()
		var first atomic.Bool
		up := newStrict(t, 1, time.Millisecond, func(h http.Header) {})
		up.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			up.mu.Lock()
			up.arrived = append(up.arrived, time.Now())
			up.mu.Unlock()
			if first.CompareAndSwap(false, true) {
				w.Header().Set("Retry-After", time.Now().Add(2*time.Second).UTC().Format(http.TimeFormat))
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			fmt.Fprint(w, "ok")
		})
		tr := &nethttp.Transport{Limiter: replicas(t, 1)[0], Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, strings.NewReader("replayable"))
		if err != nil {
			t.Fatal(err)
		}
		resp, body, err := send(tr, req)
		if err != nil || resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("%v %q %v, want the retry's 200", resp, body, err)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		// an HTTP-date has whole seconds: the retry waits 1s to 2s
		if len(up.arrived) != 2 || up.arrived[1].Sub(up.arrived[0]) < time.Second {
			t.Fatalf("arrivals %v, want the retry at least 1s after the refusal", up.arrived)
		}
	})
	t.Run("the deadline gets the upstream's answer", func(t *testing.T) {
		t.Parallel()
		up := newStrict(t, 0, time.Second, retryAfter("5"))
		tr := &nethttp.Transport{Limiter: replicas(t, 1)[0], Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}}
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, body, err := send(tr, newReq(dctx, up.URL))
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || body != "slow down" {
			t.Fatalf("%v %q %v, want the upstream's 429 with its body", resp, body, err)
		}
	})
	t.Run("RateLimit policy names holding , and ; are read whole", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			field   string
			blocked bool // about 4s
		}{
			{`"x;r=0;t=60, y";r=5;t=1`, false},        // naively split: r=0, t=60
			{`"a,b";r=0;t=4`, true},                   // one item, spent
			{`"q\"r=0;t=60";r=1;t=1, "z";r=2`, false}, // an escaped quote in a name
		} {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("RateLimit", c.field)
				fmt.Fprint(w, "ok")
			}))
			t.Cleanup(up.Close)
			l := replicas(t, 1)[0]
			tr := &nethttp.Transport{Limiter: l, Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}}
			if resp, body, err := send(tr, newReq(ctx, up.URL)); err != nil || resp.StatusCode != http.StatusOK || body != "ok" {
				t.Fatalf("%s: %v %q %v", c.field, resp, body, err)
			}
			r, err := l.Peek(ctx, keyOf(up.URL), lim)
			switch {
			case err != nil:
				t.Fatal(err)
			case c.blocked && (r.Allowed || r.RetryAfter < 3*time.Second || r.RetryAfter > 4*time.Second):
				t.Errorf("%s: %+v, want blocked about 4s", c.field, r)
			case !c.blocked && !r.Allowed:
				t.Errorf("%s: %+v, want not blocked", c.field, r)
			}
		}
	})
	t.Run("RateLimit r=0 on a success blocks without a retry", func(t *testing.T) {
		t.Parallel()
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("RateLimit", `"default";r=0;t=4`)
			fmt.Fprint(w, "last one")
		}))
		t.Cleanup(up.Close)
		l := replicas(t, 1)[0]
		tr := &nethttp.Transport{Limiter: l, Rule: core.Rule{Name: "api", Limits: []core.Limit{lim}}}
		resp, body, err := send(tr, newReq(ctx, up.URL))
		if err != nil || resp.StatusCode != http.StatusOK || body != "last one" {
			t.Fatalf("%v %q %v", resp, body, err)
		}
		r, err := l.Peek(ctx, keyOf(up.URL), lim)
		if err != nil || r.Allowed || r.RetryAfter < 3*time.Second || r.RetryAfter > 4*time.Second {
			t.Fatalf("blocked %+v %v, want about 4s", r, err)
		}
	})
}
