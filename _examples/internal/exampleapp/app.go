// Package exampleapp is what the example servers in _examples share: the
// Redis connection (REDIS_URL, or an embedded miniredis), the Limiter, the
// three rules, the listener and the clean shutdown. Each example's main.go
// holds only the framework wiring.
//
// Environment:
//
//   - REDIS_URL: a redis:// or rediss:// URL (see redis.ParseURL). Unset, the
//     server starts an embedded miniredis on a free port of 127.0.0.1, so an
//     example runs on a machine with nothing else installed.
//   - ADDR: the address to listen on, host:port or a bare port. Default
//     127.0.0.1:8080. Port 0 picks a free port; the server prints the one it
//     got.
package exampleapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
)

// DefaultAddr is where an example listens when ADDR is unset.
const DefaultAddr = "127.0.0.1:8080"

// App is one example server's shared state.
type App struct {
	// Name is the framework, such as "chi", shown in the output.
	Name string
	// Limiter keeps its counts in Redis (REDIS_URL or the embedded one).
	Limiter *core.Limiter
	// Rules are the three rules every example installs.
	Rules Rules

	getenv func(string) string
	out    io.Writer
	rdb    *redis.Client
	mini   *miniredis.Miniredis // nil with REDIS_URL
}

// Main runs an example server and exits: it connects to Redis, builds the
// handler with routes, serves on ADDR until SIGINT or SIGTERM, then shuts
// down. On an error it prints it to stderr and exits with status 1.
func Main(name string, routes func(*App) http.Handler) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, name, os.Getenv, os.Stdout, routes)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s example: %v\n", name, err)
		os.Exit(1)
	}
}

// run is Main without the process: the environment, the output and the
// end of the server's life (ctx) come from the caller.
func run(ctx context.Context, name string, getenv func(string) string, out io.Writer, routes func(*App) http.Handler) error {
	a, err := newApp(ctx, name, getenv, out)
	if err != nil {
		return err
	}
	defer a.close()
	return a.serve(ctx, routes(a))
}

// newApp connects to Redis and builds the Limiter and the rules.
func newApp(ctx context.Context, name string, getenv func(string) string, out io.Writer) (*App, error) {
	a := &App{Name: name, getenv: getenv, out: out}
	fmt.Fprintf(out, "ratewindow %s example\n", name)
	if err := a.connect(ctx); err != nil {
		return nil, err
	}
	lim, err := core.New(a.rdb,
		core.WithPrefix("rw:example:"),
		core.WithObserver(a.observe),
	)
	if err != nil {
		a.close()
		return nil, err
	}
	a.Limiter = lim
	// Check: reachable, authorised, allowed to run the scripts, and no
	// eviction of the Limiter's keys. The embedded miniredis cannot tell
	// its eviction policy (it has none): that alone is fine here.
	if err := lim.Check(ctx); err != nil && !(a.mini != nil && errors.Is(err, core.ErrCheckIncomplete)) {
		a.close()
		return nil, fmt.Errorf("redis is not ready for ratewindow: %w", err)
	}
	a.Rules = newRules(a.onError)
	for _, r := range a.Rules.all() {
		if err := r.Validate(); err != nil {
			a.close()
			return nil, err
		}
	}
	a.Rules.print(out)
	return a, nil
}

// connect opens REDIS_URL, or starts an embedded miniredis when it is unset.
func (a *App) connect(ctx context.Context) error {
	raw := a.getenv("REDIS_URL")
	if raw == "" {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true) // keys expire on the wall clock, like on a real Redis
		if err := m.Start(); err != nil {
			return fmt.Errorf("start embedded redis: %w", err)
		}
		a.mini = m
		a.rdb = redis.NewClient(&redis.Options{Addr: m.Addr()})
		fmt.Fprintf(a.out, "redis:  embedded miniredis at %s (set REDIS_URL=redis://127.0.0.1:6379/0 to use a real Redis)\n", m.Addr())
		return nil
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, password included
		}
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	a.rdb = redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := a.rdb.Ping(pctx).Err(); err != nil {
		a.close()
		return fmt.Errorf("redis at %s (REDIS_URL): %w", opt.Addr, err)
	}
	fmt.Fprintf(a.out, "redis:  %s (REDIS_URL)\n", opt.Addr)
	return nil
}

// observe prints denials; allowed requests stay quiet.
func (a *App) observe(ev core.Event) {
	if ev.Err == nil && !ev.Result.Allowed {
		fmt.Fprintf(a.out, "%s denied  rule=%s key=%s limit=%s retry in %s\n",
			time.Now().Format(time.TimeOnly), ev.Rule, ev.Key, ev.Result.Limit.PolicyName(), ev.Result.RetryAfter.Round(time.Millisecond))
	}
}

// onError prints key and Redis errors, the Rule.OnError of every rule. It
// writes no response, so the Limiter's failure mode (fail open) decides.
func (a *App) onError(rule string) func(http.ResponseWriter, *http.Request, error) {
	return func(_ http.ResponseWriter, r *http.Request, err error) {
		fmt.Fprintf(a.out, "%s error   rule=%s %s %s: %v\n",
			time.Now().Format(time.TimeOnly), rule, r.Method, r.URL.Path, err)
	}
}

// serve listens on ADDR and serves h until ctx is done, then shuts the
// server down, letting requests in flight finish.
func (a *App) serve(ctx context.Context, h http.Handler) error {
	addr := listenAddr(a.getenv("ADDR"))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	base := baseURL(ln.Addr())
	fmt.Fprintf(a.out, "listening on %s\n", base)
	fmt.Fprintf(a.out, "see a 429:\n  %s\n", curlLoop(base))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintln(a.out, "shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// close releases the Redis client and the embedded Redis.
func (a *App) close() {
	if a.rdb != nil {
		_ = a.rdb.Close()
	}
	if a.mini != nil {
		a.mini.Close()
	}
}

// listenAddr turns ADDR into an address for net.Listen: empty is
// DefaultAddr, a bare port listens on 127.0.0.1.
func listenAddr(env string) string {
	switch {
	case env == "":
		return DefaultAddr
	case !strings.Contains(env, ":"):
		return net.JoinHostPort("127.0.0.1", env)
	}
	return env
}

// baseURL is the URL a client on this machine uses to reach addr: an
// unspecified host (0.0.0.0, ::) becomes the loopback address.
func baseURL(addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String()
	}
	ip := ta.IP
	if ip.IsUnspecified() {
		if ip.To4() != nil {
			ip = net.IPv4(127, 0, 0, 1)
		} else {
			ip = net.IPv6loopback
		}
	}
	return "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port))
}

// curlLoop is a shell line that logs in as alice until the login limit
// answers 429.
func curlLoop(base string) string {
	return fmt.Sprintf(`for i in $(seq %d); do curl -s -o /dev/null -w '%%{http_code}\n' -X POST -H 'X-User: alice' %s/login; done`,
		LoginPerMinute+2, base)
}
