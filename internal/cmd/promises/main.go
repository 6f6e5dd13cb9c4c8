// Command promises measures what a Limiter promises while this process is
// slow and Redis is healthy, and while Redis is down: the figures of
// docs/redis.md's "What you get when" table. It drives real processes:
//
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 flood    # wrk, 1,024 connections on one denied key, and an innocent client
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 burst    # fresh Limiters beside 6 CPU-bound processes
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 stopped  # a process stopped 120ms of every 220ms (SIGSTOP/SIGCONT)
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 paused   # Redis paused (CLIENT PAUSE), then killed (give it a server it may kill)
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 -busy 8 upstream  # two processes' Transports against a strict upstream (see upstream.go)
//
// Each prints one line a round, and exits 1 when a promise broke: the
// failure mode admitted anything while Redis answered, a strict 1s window
// by Redis's clock (its sliding log, read every 100ms) held more than the
// limit, the innocent client got anything but 200, fewer than 90% of the
// decisions made during the outage were the failure mode's, or the strict
// upstream refused a request. .ci/steps/45-promises.sh runs each once.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
	"github.com/ratewindow/ratewindow/nethttp"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "the Redis server (loopback only)")
	rounds := flag.Int("rounds", 3, "rounds of each scenario")
	busyN := flag.Int("busy", 0, "upstream: CPU-bound processes beside the clients")
	margin := flag.Duration("margin", 0, "upstream: the Transport's Margin (0: its default)")
	procs := flag.Int("procs", 2, "upstream: client processes")
	goroutines := flag.Int("goroutines", 8, "upstream: goroutines sending in each client process")
	seconds := flag.Duration("seconds", 10*time.Second, "upstream: how long each goroutine starts requests")
	grpcBin := flag.String("grpc", "", "upstream: the gRPC half's binary (grpcmw/internal/cmd/grpcupstream): gRPC clients and upstream instead of HTTP")
	flag.Parse()
	if host, _, err := net.SplitHostPort(*addr); err != nil || !net.ParseIP(host).IsLoopback() {
		fail("-redis must be a loopback address")
	}
	var err error
	switch flag.Arg(0) {
	case "flood":
		err = flood(*addr, *rounds)
	case "burst":
		err = burst(*addr, *rounds)
	case "stopped":
		err = stopped(*addr, *rounds)
	case "paused":
		err = paused(*addr)
	case "upstream":
		err = upstream(*addr, upConfig{rounds: *rounds, busy: *busyN, procs: *procs, goroutines: *goroutines, seconds: *seconds, margin: *margin, grpc: *grpcBin})
	case "upserve": // the upstream scenario's strict upstream
		err = upserve()
	case "upclient": // a client process of the upstream scenario
		err = upclient(*addr, *margin, flag.Arg(1), flag.Arg(2), flag.Arg(3), flag.Arg(4), flag.Arg(5))
	case "serve": // the flood's server
		err = serve(*addr, flag.Arg(1), flag.Arg(2))
	case "spin": // a CPU-bound process
		for {
		}
	case "decide": // the stopped scenario's process
		err = decide(*addr, flag.Arg(1))
	default:
		fail("usage: promises [-redis addr] [-rounds n] flood|burst|stopped|paused|upstream")
	}
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "promises:", msg)
	os.Exit(1)
}

// tally counts admissions by time and the failure mode's answers.
type tally struct {
	mu       sync.Mutex
	admitted []time.Time
	failOpen atomic.Int64 // admitted by the failure mode
	failed   atomic.Int64 // answered by the failure mode
	shed     atomic.Int64
	errs     sync.Map // the failure mode's errors → *atomic.Int64
}

func (t *tally) observe(e core.Event) {
	if e.Failed {
		msg := fmt.Sprint(e.Err)
		if len(msg) > 160 {
			msg = msg[:160]
		}
		n, _ := t.errs.LoadOrStore(msg, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		t.failed.Add(1)
		if e.Result.Allowed {
			t.failOpen.Add(1)
		}
	}
	if e.Shed {
		t.shed.Add(1)
	}
}

func (t *tally) admit() {
	t.mu.Lock()
	t.admitted = append(t.admitted, time.Now())
	t.mu.Unlock()
}

// worstWindow is the most admissions within any strict 1s window.
func worstWindow(ts []time.Time) int {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	worst, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		worst = max(worst, i-j+1)
	}
	return worst
}

func self(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Stderr = os.Stderr
	return cmd
}

// stats is what a child process reports on its stdout.
type stats struct {
	Admitted, Worst, FailOpen, Failed, Shed int64
	Errors                                  map[string]int64 `json:",omitempty"`
}

func (t *tally) errors() map[string]int64 {
	m := map[string]int64{}
	t.errs.Range(func(k, v any) bool {
		m[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return m
}

// flood: one route behind nethttp.Limit, 20 a second per X-Api-Key, the
// Limiter's defaults; wrk sends one already-denied key from 1,024
// connections for 9s while an innocent client sends 10 a second.
func flood(addr string, rounds int) error {
	if _, err := exec.LookPath("wrk"); err != nil {
		return errors.New("flood needs wrk (apt-get install -y wrk)")
	}
	bad := false
	for round := range rounds {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		prefix := fmt.Sprintf("promises-flood-%d:", time.Now().UnixNano())
		srv := self("-redis", addr, "serve", strconv.Itoa(port), prefix)
		out, _ := srv.StdoutPipe()
		if err := srv.Start(); err != nil {
			return err
		}
		base := fmt.Sprintf("http://127.0.0.1:%d/", port)
		for range 100 {
			if resp, err := http.Get(base); err == nil {
				resp.Body.Close()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		attack := func() { // the attacker's key, denied from its 21st request
			req, _ := http.NewRequest("GET", base, nil)
			req.Header.Set("X-Api-Key", "attacker")
			for range 25 {
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}
		attack()
		logged := pollLog(addr, prefix+"{api:h:x-api-key:attacker}:v2:r1s")
		var codes sync.Map
		var innocent sync.WaitGroup
		stop := make(chan struct{})
		innocent.Go(func() {
			client := &http.Client{Timeout: 30 * time.Second}
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				req, _ := http.NewRequest("GET", base, nil)
				req.Header.Set("X-Api-Key", "innocent")
				code := 0
				if resp, err := client.Do(req); err == nil {
					code = resp.StatusCode
					resp.Body.Close()
				}
				n, _ := codes.LoadOrStore(code, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
		})
		wrk := exec.Command("wrk", "-t2", "-c1024", "-d9s", "-H", "X-Api-Key: attacker", base)
		wrkOut, err := wrk.CombinedOutput()
		close(stop)
		innocent.Wait()
		if err != nil {
			return fmt.Errorf("wrk: %v: %s", err, wrkOut)
		}
		units := logged()
		_ = srv.Process.Signal(syscall.SIGTERM)
		var st stats
		if err := json.NewDecoder(out).Decode(&st); err != nil {
			return fmt.Errorf("the server's stats: %w", err)
		}
		_ = srv.Wait()
		var other []string
		codes.Range(func(k, v any) bool {
			other = append(other, fmt.Sprintf("%v:%d", k, v.(*atomic.Int64).Load()))
			return true
		})
		slices.Sort(other)
		var requests string
		for _, line := range splitLines(string(wrkOut)) {
			if len(line) > 0 && (strings.Contains(line, "requests in") || strings.Contains(line, "Requests/sec")) {
				requests += line + "; "
			}
		}
		fmt.Printf("flood round %d: Redis's log: %d units, worst 1s window by Redis's clock %d; attacker admitted %d (worst 1s window by the handler's clock %d, limit 20), failure-mode answers %d (admitted %d), shed %d; innocent client's statuses %v; wrk: %s%v\n",
			round+1, len(units), worstWindow(units), st.Admitted, st.Worst, st.Failed, st.FailOpen, st.Shed, other, requests, st.Errors)
		if st.FailOpen > 0 || worstWindow(units) > 20 {
			bad = true
		}
		for _, o := range other {
			if o[:3] != "200" {
				bad = true
			}
		}
	}
	if bad {
		return errors.New("a promise broke")
	}
	return nil
}

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		out = append(out, s[:i])
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return out
}

// serve is the flood's server: it prints its stats as JSON on SIGTERM.
func serve(addr, port, prefix string) error {
	var t tally
	l, err := core.New(redis.NewClient(&redis.Options{Addr: addr}), core.WithPrefix(prefix), core.WithObserver(t.observe))
	if err != nil {
		return err
	}
	limit := nethttp.Limit(l, core.Rule{Name: "api", Limits: []core.Limit{core.PerSecond(20)}, Key: keyfuncs.Header("X-Api-Key")})
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") == "attacker" {
			t.admit()
		}
		io.WriteString(w, "ok\n")
	}))
	srv := &http.Server{Addr: "127.0.0.1:" + port, Handler: h}
	sig := make(chan os.Signal, 1)
	signalNotify(sig)
	go func() {
		<-sig
		srv.Close()
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// the 20 admitted before the flood stand in the first window too
	return json.NewEncoder(os.Stdout).Encode(stats{Admitted: int64(len(t.admitted)), Worst: int64(worstWindow(t.admitted)),
		FailOpen: t.failOpen.Load(), Failed: t.failed.Load(), Shed: t.shed.Load(), Errors: t.errors()})
}

// burst: three fresh Limiters with the defaults, 64 goroutines each, 5
// calls a goroutine on one key under PerHour(200), beside 6 CPU-bound
// processes; then a single caller's PerMinute(3) three times and a fourth.
func burst(addr string, rounds int) error {
	var spin []*exec.Cmd
	for range 6 {
		c := self("spin")
		if err := c.Start(); err != nil {
			return err
		}
		spin = append(spin, c)
	}
	defer func() {
		for _, c := range spin {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	bad := false
	for round := range rounds {
		var t tally
		var admitted atomic.Int64
		prefix := fmt.Sprintf("promises-burst-%d:", time.Now().UnixNano())
		var wg sync.WaitGroup
		for range 3 {
			l, err := core.New(redis.NewClient(&redis.Options{Addr: addr}), core.WithPrefix(prefix), core.WithObserver(t.observe))
			if err != nil {
				return err
			}
			for range 64 {
				wg.Go(func() {
					for range 5 {
						if r, err := l.Allow(context.Background(), "one", core.PerHour(200)); err == nil && r.Allowed {
							admitted.Add(1)
						}
					}
				})
			}
		}
		wg.Wait()
		l, err := core.New(redis.NewClient(&redis.Options{Addr: addr}), core.WithPrefix(prefix+"single:"), core.WithObserver(t.observe))
		if err != nil {
			return err
		}
		fourth := false
		for i := range 4 {
			r, err := l.Allow(context.Background(), "one", core.PerMinute(3))
			if err != nil {
				return err
			}
			fourth = i == 3 && r.Allowed
		}
		fmt.Printf("burst round %d: admitted %d of a limit of 200, failure-mode answers %d (admitted %d), shed %d; the single caller's fourth of 3 admitted: %v %v\n",
			round+1, admitted.Load(), t.failed.Load(), t.failOpen.Load(), t.shed.Load(), fourth, t.errors())
		if admitted.Load() > 200 || t.failOpen.Load() > 0 || fourth {
			bad = true
		}
	}
	if bad {
		return errors.New("a promise broke")
	}
	return nil
}

// stopped: a process deciding with 3 Limiters × 64 goroutines on one key
// (PerSecond(100)) for 6s, stopped 120ms of every 220ms from outside.
func stopped(addr string, rounds int) error {
	bad := false
	for round := range rounds {
		prefix := fmt.Sprintf("promises-stopped-%d:", time.Now().UnixNano())
		child := self("-redis", addr, "decide", prefix)
		out, _ := child.StdoutPipe()
		if err := child.Start(); err != nil {
			return err
		}
		logged := pollLog(addr, prefix+"{one}:v2:r1s")
		done := make(chan struct{})
		go func() {
			time.Sleep(500 * time.Millisecond) // warm
			for {
				select {
				case <-done:
					return
				default:
				}
				_ = child.Process.Signal(syscall.SIGSTOP)
				time.Sleep(120 * time.Millisecond)
				_ = child.Process.Signal(syscall.SIGCONT)
				time.Sleep(100 * time.Millisecond)
			}
		}()
		var st stats
		err := json.NewDecoder(out).Decode(&st)
		close(done)
		units := logged()
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Wait()
		if err != nil {
			return fmt.Errorf("the child's stats: %w", err)
		}
		fmt.Printf("stopped round %d: Redis's log: %d units, worst 1s window by Redis's clock %d; admitted %d (worst 1s window by the caller's clock %d, limit 100), failure-mode answers %d (admitted %d), shed %d %v\n",
			round+1, len(units), worstWindow(units), st.Admitted, st.Worst, st.Failed, st.FailOpen, st.Shed, st.Errors)
		if st.FailOpen > 0 || worstWindow(units) > 100 {
			bad = true
		}
	}
	if bad {
		return errors.New("a promise broke")
	}
	return nil
}

func decide(addr, prefix string) error {
	var t tally
	lim := core.PerSecond(100)
	var ls []*core.Limiter
	for range 3 {
		l, err := core.New(redis.NewClient(&redis.Options{Addr: addr}), core.WithPrefix(prefix), core.WithObserver(t.observe))
		if err != nil {
			return err
		}
		if _, err := l.Peek(context.Background(), "one", lim); err != nil { // warm
			return err
		}
		ls = append(ls, l)
	}
	time.Sleep(500 * time.Millisecond)
	end := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	for _, l := range ls {
		for range 64 {
			wg.Go(func() {
				for time.Now().Before(end) {
					if r, err := l.Allow(context.Background(), "one", lim); err == nil && r.Allowed {
						t.admit()
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(stats{Admitted: int64(len(t.admitted)), Worst: int64(worstWindow(t.admitted)),
		FailOpen: t.failOpen.Load(), Failed: t.failed.Load(), Shed: t.shed.Load(), Errors: t.errors()})
}

// paused: Redis paused for 2s (CLIENT PAUSE ALL) under 32 goroutines
// deciding, then the server killed (SHUTDOWN NOSAVE): the failure mode
// answers, each decision within 250ms with the 100ms default.
func paused(addr string) error {
	var t tally
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	l, err := core.New(rdb, core.WithPrefix(fmt.Sprintf("promises-paused-%d:", time.Now().UnixNano())), core.WithObserver(t.observe))
	if err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := l.Peek(ctx, "warm", core.PerSecond(1)); err != nil {
		return err
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	run := func(d time.Duration, from time.Time) (total, failed int, slowest time.Duration) {
		var mu sync.Mutex
		end := time.Now().Add(d)
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Go(func() {
				for time.Now().Before(end) {
					start := time.Now()
					r, err := l.Allow(ctx, fmt.Sprint("k", i), core.PerSecond(1000))
					took := time.Since(start)
					if !start.Before(from) {
						mu.Lock()
						total++
						if err == nil && r.BackendErr != nil {
							failed++
						}
						slowest = max(slowest, took)
						mu.Unlock()
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		wg.Wait()
		return
	}
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "2500", "ALL").Err(); err != nil {
		return err
	}
	start := time.Now()
	total, failed, slowest := run(2*time.Second, start.Add(500*time.Millisecond))
	fmt.Printf("paused: after the first 500ms, %d of %d decisions (%.1f%%) answered by the failure mode; the slowest took %s\n",
		failed, total, 100*float64(failed)/float64(max(total, 1)), slowest.Round(time.Millisecond))
	bad := failed*10 < total*9 // the slowest is reported, not judged: a loaded machine moves it
	time.Sleep(time.Second)    // the pause ends
	if _, err := l.Peek(ctx, "warm", core.PerSecond(1)); err != nil {
		return err
	}
	_ = admin.Do(ctx, "SHUTDOWN", "NOSAVE").Err()
	time.Sleep(100 * time.Millisecond)
	total, failed, slowest = run(time.Second, time.Now().Add(100*time.Millisecond))
	fmt.Printf("killed: %d of %d decisions answered by the failure mode; the slowest took %s\n", failed, total, slowest.Round(time.Millisecond))
	if bad || failed*10 < total*9 {
		return errors.New("fewer than 90% of the decisions were answered by the failure mode")
	}
	return nil
}

// pollLog reads the sliding log at key (see logUnits) every 100ms, until
// the function it returns is called, which returns every unit seen: the
// admissions by Redis's clock.
func pollLog(addr, key string) func() []time.Time {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	seen := map[int64]int{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if v, err := rdb.Get(context.Background(), key).Bytes(); err == nil {
				for t, n := range logUnits(v) {
					seen[t] = max(seen[t], n)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() []time.Time {
		close(stop)
		<-done
		rdb.Close()
		var ts []time.Time
		for t, n := range seen {
			for range n {
				ts = append(ts, time.UnixMicro(t))
			}
		}
		return ts
	}
}

// logUnits reads a sliding log in its compact layout (the width w, a
// 7-byte base, then each unit's offset from it in w bytes, big-endian, all
// in µs on Redis's clock): how many units each time holds; nil when v is
// not in that layout.
func logUnits(v []byte) map[int64]int {
	if len(v) < 8 || v[0] < 1 || v[0] > 7 {
		return nil
	}
	w := int(v[0])
	base := int64(0)
	for _, b := range v[1:8] {
		base = base<<8 | int64(b)
	}
	counts := map[int64]int{}
	for i := 8; i+w <= len(v); i += w {
		off := int64(0)
		for _, b := range v[i : i+w] {
			off = off<<8 | int64(b)
		}
		counts[base+off]++
	}
	return counts
}
