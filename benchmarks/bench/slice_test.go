package bench

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// requireRedis skips t when there is no redis-server on PATH (fails it
// with RATEWINDOW_REQUIRE_REDIS=1).
func requireRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("RATEWINDOW_REQUIRE_REDIS") == "1" {
			t.Fatalf("RATEWINDOW_REQUIRE_REDIS=1 and %v", err)
		}
		t.Skip(err)
	}
}

// testServer starts a redis-server of its own for t, or skips t when there
// is none (fails it with RATEWINDOW_REQUIRE_REDIS=1).
func testServer(t *testing.T) *Server {
	t.Helper()
	requireRedis(t)
	srv, err := StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// TestMeasureSlice measures a lone goroutine of two contenders and checks
// what INFO commandstats says of their calls: one call a decision, the
// script command named, the commands inside it apart.
func TestMeasureSlice(t *testing.T) {
	srv := testServer(t)
	cases := []struct {
		contender string
		call      string
		inside    []string // some of the commands inside the call
	}{
		{"ratewindow sliding-counter", "FCALL", nil},
		{"ulule/limiter v3", "EVALSHA", []string{"incrby"}},
		{"go-chi/httprate-redis", "MGET + MULTI/EXEC", []string{"incrby", "expire"}},
	}
	for _, c := range cases {
		s, err := MeasureSlice(context.Background(), SliceSpec{
			Addr: srv.Addr, Contender: c.contender, Goroutines: 1, Keys: 10, PoolSize: 4,
			Count: 1_000_000, Window: time.Second, Warm: 20 * time.Millisecond, For: 100 * time.Millisecond, ResetStat: true,
		})
		if err != nil {
			t.Fatalf("%s: %v", c.contender, err)
		}
		if s.Decisions == 0 || s.Call.Name != c.call {
			t.Errorf("%s: %d decisions, call %q; want some, call %q", c.contender, s.Decisions, s.Call.Name, c.call)
		}
		// a decision that timed out may still run on the server
		if s.Call.Calls < s.Decisions-s.Errors || s.Call.Calls > s.Decisions+s.Errors {
			t.Errorf("%s: %d calls for %d decisions (%d failed): want one a decision", c.contender, s.Call.Calls, s.Decisions, s.Errors)
		}
		if s.CallMicros() <= 0 || s.InsideMicros() <= 0 || s.InsideMicros() > s.CallMicros() {
			t.Errorf("%s: %.2f µs a call, %.2f of them inside: want 0 < inside <= call", c.contender, s.CallMicros(), s.InsideMicros())
		}
		var names []string
		for _, in := range s.Inside {
			names = append(names, in.Name)
			if slices.Contains(scriptCommands, in.Name) || slices.Contains(harnessCommands, in.Name) {
				t.Errorf("%s: %s counted inside the call", c.contender, in.Name)
			}
		}
		for _, want := range c.inside {
			if !slices.Contains(names, want) {
				t.Errorf("%s: inside the call %v, want %s among them", c.contender, names, want)
			}
		}
	}
	if _, err := MeasureSlice(context.Background(), SliceSpec{Addr: srv.Addr, Contender: "nobody", Goroutines: 1, Keys: 1, For: time.Millisecond}); err == nil {
		t.Error("an unknown contender: no error")
	}
}

// TestErrorsAreNoDecisions: a call that fails (for ratewindow, an answer
// of its failure mode) counts neither in the decisions per second nor in
// the latencies.
func TestErrorsAreNoDecisions(t *testing.T) {
	var n atomic.Int64
	failing := errors.New("failed")
	decide := func(context.Context, string) (bool, error) {
		if n.Add(1)%2 == 0 {
			return false, failing // at once, as the failure mode answers
		}
		time.Sleep(2 * time.Millisecond)
		return true, nil
	}
	s, h, err := runSlice(context.Background(), nil, []Decide{decide}, []string{"k"}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if s.Errors == 0 || s.Admitted+s.Errors != s.Decisions || s.FirstError != failing.Error() {
		t.Fatalf("%d decisions, %d admitted, %d failed, the first with %q", s.Decisions, s.Admitted, s.Errors, s.FirstError)
	}
	if want := float64(s.Admitted) / s.Elapsed.Seconds(); s.PerSecond() != want {
		t.Errorf("%v decisions/s, want %v (the failed ones left out)", s.PerSecond(), want)
	}
	if p50 := h.quantile(0.50); p50 < 2*time.Millisecond {
		t.Errorf("p50 %v, want at least the answered calls' 2ms", p50)
	}
}

// TestFailureModeIsAnError: ratewindow's contender reports an answer of
// its failure mode (no Redis at the address) as an error, not an admission.
func TestFailureModeIsAnError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a port nothing listens on: refused
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for _, c := range Contenders()[:3] {
		f, err := c.New(rdb, 10, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := f()(context.Background(), "k"); err == nil {
			t.Errorf("%s: admitted %v without Redis, and no error", c.Name, ok)
		}
	}
}
