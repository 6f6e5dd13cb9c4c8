package main

// The upstream scenario measures the throttler's promise where it matters:
// at the upstream. Run from the repository root, against a loopback Redis:
//
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 -rounds 5 -busy 8 upstream              # load ~10
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 -rounds 5 upstream                       # no busy processes
//	go run ./internal/cmd/promises -redis 127.0.0.1:6379 -rounds 5 -busy 8 -margin 50ms upstream  # Transport.Margin 50ms
//
// A round starts a strict upstream HTTP server on 127.0.0.1 that admits at
// most 5 requests in any 1s window by its own arrival times (a log of
// them: a request that would be the 6th within 1s is refused, 429 with
// Retry-After). It runs in a session of its own at nice -10 where allowed,
// standing for a server on another machine, and reports its longest stall.
// Then -procs client processes (default 2; this binary again), each with
// its own core.Limiter on the shared Redis with the library's defaults and
// a nethttp.Transport with only Limiter and Rule set (PerSecond(5), the
// default key: the upstream's host), and -goroutines goroutines (default
// 8) sending requests in a loop for -seconds (default 10s), so that the
// throttler is saturated. -busy N starts N CPU-bound processes first and
// waits (at most a minute) until the 1-minute load average reaches N;
// -margin sets the Transport's Margin (0: its default, 50ms for 1s).
//
// Each round prints the requests the clients sent (and the mean time one
// took: its Wait and its trip), the upstream's arrivals (retries of
// refused requests included), its refusals, the most arrivals in any 1s
// window, the Redis log's worst 1s window by Redis's clock (its units read
// every 100ms, a reservation given back not counted), the reservations
// seen given back, the load average (1 minute) at the start and the end,
// and the mean of the tasks runnable now (/proc/loadavg's fourth field,
// sampled every 100ms: the load during the round). It exits 1 when the
// upstream refused any request.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/strictup"
	"github.com/ratewindow/ratewindow/nethttp"
)

// upstreamLimit is what the strict upstream admits in any 1s window, and
// the clients' rule.
const upstreamLimit = 5

// upConfig is the upstream scenario's setting.
type upConfig struct {
	rounds, busy, procs, goroutines int
	seconds                         time.Duration
	margin                          time.Duration
	grpc                            string // the gRPC half's binary, if set
}

// strictHandler answers as a strict upstream: 429 with Retry-After when
// its log refuses.
type strictHandler struct{ log *strictup.Log }

func (h strictHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ok, retry := h.log.Arrive(time.Now()); !ok {
		w.Header().Set("Retry-After", strictup.RetryAfter(retry))
		http.Error(w, "too many requests", http.StatusTooManyRequests)
		return
	}
	io.WriteString(w, "ok\n")
}

// upstreamProc is a running strict upstream process.
type upstreamProc struct {
	cmd  *exec.Cmd
	out  *bufio.Reader
	addr string
	note string // why it runs at the default priority, if it does
}

// startUpstream starts the strict upstream in a process of its own, in
// its own session, at nice -10 when this process may raise priorities
// (its threads', and its session's autogroup's, where the kernel groups
// sessions: otherwise a nice value weighs only within the session): it
// stands for a server on another machine, whose arrival times the busy
// processes here must not move. Its longest stall is reported all the same.
func startUpstream(c *exec.Cmd) (*upstreamProc, error) {
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	up := &upstreamProc{cmd: c, out: bufio.NewReader(out)}
	// PRIO_PGRP sets every thread of the group; threads made later inherit it
	if err := syscall.Setpriority(syscall.PRIO_PGRP, c.Process.Pid, -10); err != nil {
		up.note = fmt.Sprintf(" (at the default priority: %v)", err)
	}
	autogroup := fmt.Sprintf("/proc/%d/autogroup", c.Process.Pid)
	if _, err := os.Stat(autogroup); err == nil {
		if err := os.WriteFile(autogroup, []byte("-10"), 0); err != nil {
			up.note += fmt.Sprintf(" (its autogroup at the default priority: %v)", err)
		}
	}
	line, err := up.out.ReadString('\n')
	if err != nil {
		_ = c.Process.Kill()
		_ = c.Wait()
		return nil, fmt.Errorf("the upstream's address: %w", err)
	}
	up.addr = strings.TrimSpace(line)
	return up, nil
}

// stop ends the upstream and returns what it saw.
func (up *upstreamProc) stop() (strictup.Seen, error) {
	var seen strictup.Seen
	_ = up.cmd.Process.Signal(syscall.SIGTERM)
	err := json.NewDecoder(up.out).Decode(&seen)
	if err != nil {
		err = fmt.Errorf("the upstream's report: %w", err)
	}
	return seen, errors.Join(err, up.cmd.Wait())
}

// upserve is the upstream process: a strict upstream HTTP server.
func upserve() error {
	log := strictup.New(upstreamLimit)
	srv := &http.Server{Handler: strictHandler{log}}
	return strictup.Serve(log, srv.Serve, func() { srv.Close() }, func(err error) bool { return errors.Is(err, http.ErrServerClosed) })
}

func upstream(addr string, cfg upConfig) error {
	if cfg.busy < 0 || cfg.procs < 1 || cfg.goroutines < 1 || cfg.seconds <= 0 {
		return errors.New("upstream needs -busy >= 0, -procs >= 1, -goroutines >= 1 and -seconds > 0")
	}
	stopBusy, err := busy(cfg.busy)
	if err != nil {
		return err
	}
	defer stopBusy()
	client := "nethttp.Transport"
	if cfg.grpc != "" {
		client = "grpcmw client"
	}
	bad := false
	for round := range cfg.rounds {
		loadBefore := loadavg()
		runnable := sampleRunnable()
		up, err := startUpstream(upCmd(cfg.grpc, "serve"))
		if err != nil {
			return err
		}
		rule := fmt.Sprintf("promises-upstream-%d", time.Now().UnixNano())
		start := time.Now().Add(time.Second) // the clients start together
		log := pollSettled(addr, core.DefaultPrefix+"{"+rule+":*")
		var children []*exec.Cmd
		var outs []io.Reader
		for range cfg.procs {
			target := "http://" + up.addr + "/"
			if cfg.grpc != "" {
				target = up.addr
			}
			c := upCmd(cfg.grpc, "client", "-redis", addr, "-margin", cfg.margin.String())
			c.Args = append(c.Args, target, rule, strconv.FormatInt(start.UnixNano(), 10), strconv.Itoa(cfg.goroutines), cfg.seconds.String())
			out, _ := c.StdoutPipe()
			if err := c.Start(); err != nil {
				_, _ = up.stop()
				return err
			}
			children = append(children, c)
			outs = append(outs, out)
		}
		var total strictup.Stats
		var childErr error
		for i, c := range children {
			var st strictup.Stats
			if err := json.NewDecoder(outs[i]).Decode(&st); err != nil {
				childErr = errors.Join(childErr, fmt.Errorf("a client's stats: %w", err))
			}
			if err := c.Wait(); err != nil {
				childErr = errors.Join(childErr, fmt.Errorf("a client: %w", err))
			}
			total.Add(st)
		}
		units, released, logErr := log()
		runnableMean := runnable()
		seen, upErr := up.stop()
		if err := errors.Join(childErr, upErr); err != nil {
			return err
		}
		arrivals := make([]time.Time, len(seen.Arrivals))
		for i, ns := range seen.Arrivals {
			arrivals[i] = time.Unix(0, ns)
		}
		redisWorst := "unread"
		if logErr == nil {
			redisWorst = fmt.Sprintf("%d (%d units)", worstWindow(units), len(units))
		} else {
			fmt.Fprintln(os.Stderr, "promises: the Redis log:", logErr)
		}
		mean := time.Duration(0)
		if total.Sent > 0 {
			mean = total.Took / time.Duration(total.Sent)
		}
		starts := make([]time.Time, len(total.Starts))
		for i, ns := range total.Starts {
			starts[i] = time.Unix(0, ns)
		}
		lateness := "unread"
		if logErr == nil {
			lateness = offsets(units, starts)
		}
		fmt.Printf("upstream round %d: %s, %d processes × %d goroutines, margin %s, busy %d, load %.1f→%.1f (runnable tasks %.1f): sent %d (ok %d, refusals to the caller %d, errors %d %v), mean request time %s; upstream arrivals %d, refused %d, worst 1s window %d arrivals (limit %d), its longest stall %s%s; Redis log's worst 1s window %s; reservations seen given back %d; the throttler's starts: worst 1s window %d, after their units (paired in time order) %s; trips (arrivals after starts) %s\n",
			round+1, client, cfg.procs, cfg.goroutines, marginName(cfg.margin), cfg.busy, loadBefore, loadavg(), runnableMean,
			total.Sent, total.OK, total.Refused, total.Failed, total.Errors, mean.Round(time.Millisecond),
			len(arrivals), seen.Refused, worstWindow(arrivals), upstreamLimit, seen.Stall.Round(time.Millisecond), up.note, redisWorst, released,
			worstWindow(starts), lateness, offsets(starts, arrivals))
		if seen.Refused > 0 {
			bad = true
		}
	}
	if bad {
		return errors.New("the upstream refused requests")
	}
	return nil
}

// offsets pairs the times of from and to in time order (the shorter's
// length) and describes to's offsets after from: p50, p99, max.
func offsets(from, to []time.Time) string {
	from, to = slices.Clone(from), slices.Clone(to)
	cmp := func(a, b time.Time) int { return a.Compare(b) }
	slices.SortFunc(from, cmp)
	slices.SortFunc(to, cmp)
	n := min(len(from), len(to))
	if n == 0 {
		return "none"
	}
	d := make([]time.Duration, n)
	for i := range n {
		d[i] = to[i].Sub(from[i])
	}
	slices.Sort(d)
	r := func(x time.Duration) time.Duration { return x.Round(100 * time.Microsecond) }
	return fmt.Sprintf("p50 %s, p99 %s, max %s (%d of %d and %d)", r(d[n/2]), r(d[n*99/100]), r(d[n-1]), n, len(from), len(to))
}

func marginName(m time.Duration) string {
	if m == 0 {
		return "default"
	}
	return m.String()
}

// upclient is a client process of the upstream scenario: from start on,
// goroutines send GET url through a nethttp.Transport with the defaults,
// each in a loop for d, then it prints its strictup.Stats as JSON.
func upclient(addr string, margin time.Duration, url, rule, start, goroutines, d string) error {
	l, err := core.New(redis.NewClient(&redis.Options{Addr: addr}))
	if err != nil {
		return err
	}
	var starts strictup.Starts // the Transport's Base runs when the throttler lets a request go
	base := roundTripper(func(r *http.Request) (*http.Response, error) {
		starts.Go()
		return http.DefaultTransport.RoundTrip(r)
	})
	client := &http.Client{Transport: &nethttp.Transport{Limiter: l, Margin: margin, Base: base,
		Rule: core.Rule{Name: rule, Limits: []core.Limit{core.PerSecond(upstreamLimit)}}}}
	return strictup.Clients(start, goroutines, d, &starts, func() (bool, error) {
		resp, err := client.Get(url)
		if err != nil {
			return false, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return false, nil
		case http.StatusTooManyRequests:
			return true, nil
		}
		return false, fmt.Errorf("status %d", resp.StatusCode)
	})
}

// roundTripper is a function as an http.RoundTripper.
type roundTripper func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// upCmd is a process of the upstream scenario: this binary's subcommand
// ("upserve", "upclient"), or with a gRPC binary, its ("serve", "client").
func upCmd(grpcBin, sub string, args ...string) *exec.Cmd {
	if grpcBin == "" {
		return self(append(args, "up"+sub)...)
	}
	c := exec.Command(grpcBin, append(args, sub)...)
	c.Stderr = os.Stderr
	return c
}

// busy starts n CPU-bound processes and waits, at most a minute, until
// the 1-minute load average reaches n (it creeps towards its level: the
// rounds' own samples say what the load was); stop ends them.
func busy(n int) (stop func(), err error) {
	var spin []*exec.Cmd
	stop = func() {
		for _, c := range spin {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for range n {
		c := self("spin")
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		spin = append(spin, c)
	}
	if n == 0 {
		return stop, nil
	}
	for deadline := time.Now().Add(time.Minute); loadavg() < float64(n) && time.Now().Before(deadline); {
		time.Sleep(time.Second)
	}
	return stop, nil
}

// loadavg is the 1-minute load average (/proc/loadavg), or -1.
func loadavg() float64 {
	avg, _ := readLoad()
	return avg
}

// readLoad reads /proc/loadavg: the 1-minute load average and the tasks
// runnable now, or -1 for what it cannot read.
func readLoad() (avg float64, runnable int) {
	avg, runnable = -1, -1
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return avg, runnable
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return avg, runnable
	}
	if v, err := strconv.ParseFloat(f[0], 64); err == nil {
		avg = v
	}
	if r, _, ok := strings.Cut(f[3], "/"); ok {
		if v, err := strconv.Atoi(r); err == nil {
			runnable = v
		}
	}
	return avg, runnable
}

// sampleRunnable samples the tasks runnable now every 100ms, the reader
// itself excluded, until the function it returns is called, which returns
// their mean (-1 without samples): the load during a round, which the
// 1-minute average reaches only after minutes.
func sampleRunnable() func() float64 {
	var sum, n int
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, r := readLoad(); r > 0 {
				sum, n = sum+r-1, n+1
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		if n == 0 {
			return -1
		}
		return float64(sum) / float64(n)
	}
}

// snapshot is a sliding log's units (µs on Redis's clock → how many) read
// at at (Redis's TIME, after the read).
type snapshot struct {
	at    int64
	units map[int64]int
}

// pollSettled finds the sliding log matching pattern and reads it every
// 100ms until the function it returns is called, which reads it once more
// and returns the units that stayed (see settle) and the reservations
// seen given back.
func pollSettled(addr, pattern string) func() ([]time.Time, int, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	ctx := context.Background()
	var snaps []snapshot
	var key string
	var lastErr error
	read := func() {
		if key == "" {
			keys, err := rdb.Keys(ctx, pattern).Result()
			if err != nil || len(keys) == 0 {
				lastErr = errors.Join(err, fmt.Errorf("no key matches %q", pattern))
				return
			}
			key = keys[0]
		}
		var get *redis.StringCmd
		var now *redis.TimeCmd
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			get, now = p.Get(ctx, key), p.Time(ctx)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			lastErr = err
			return
		}
		units := map[int64]int{}
		if v, err := get.Bytes(); err == nil {
			if units = logUnits(v); units == nil {
				lastErr = fmt.Errorf("%s is not a compact sliding log", key)
				return
			}
		}
		lastErr = nil
		snaps = append(snaps, snapshot{at: now.Val().UnixMicro(), units: units})
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			read()
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() ([]time.Time, int, error) {
		close(stop)
		<-done
		read()
		rdb.Close()
		if key == "" || len(snaps) == 0 {
			return nil, 0, lastErr
		}
		final, released := settle(snaps, time.Second.Microseconds())
		var ts []time.Time
		for t, n := range final {
			for range n {
				ts = append(ts, time.UnixMicro(t))
			}
		}
		return ts, released, lastErr
	}
}

// settle returns the units that stayed in a sliding log read as snaps
// (in order): a unit at t counts as often as the last snapshot still
// within window of t holds it (the log cannot have dropped it yet, so a
// unit missing there was given back), and released is how many units a
// snapshot held beyond that. A reservation given back more than a window
// after its time, or before any snapshot saw it, escapes both counts.
func settle(snaps []snapshot, window int64) (final map[int64]int, released int) {
	final = map[int64]int{}
	seen := map[int64]int{}
	for _, s := range snaps {
		for t, n := range s.units {
			seen[t] = max(seen[t], n)
		}
	}
	for t, n := range seen {
		last := -1
		for i, s := range snaps {
			if s.at-t < window {
				last = i
			}
		}
		kept := 0
		if last >= 0 {
			kept = snaps[last].units[t]
		}
		if kept > 0 {
			final[t] = kept
		}
		released += n - kept
	}
	return final, released
}
