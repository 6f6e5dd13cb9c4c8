package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Environment variables read by this package; see the package documentation.
const (
	envAddr         = "REDIS_ADDR"
	envClusterAddrs = "REDIS_CLUSTER_ADDRS"
	envRequire      = "RATEWINDOW_REQUIRE_REDIS"
)

// errStopped is returned for a shared server asked for after Main stopped them.
var errStopped = errors.New("redistest: Main has already stopped the shared servers")

// lazy is a value started at most once per test binary.
type lazy[T any] struct {
	once sync.Once
	val  T
	err  error
}

// get starts the value on the first call and returns the same value and error on
// every call.
func (l *lazy[T]) get(start func() (T, error)) (T, error) {
	l.once.Do(func() { l.val, l.err = start() })
	return l.val, l.err
}

// shared holds the servers started once per test binary. They are the only
// package-level state, and Main stops them.
var shared struct {
	mu      sync.Mutex // guards running
	running bool       // Main is running the tests

	server  lazy[*Process]
	cluster lazy[[]*Process]

	log goRedisLog // go-redis's logger while Main runs
}

// Main runs the package's tests and then stops every server this package started
// for the whole test binary, removes their directories and exits with the tests'
// status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// [New] and [NewCluster] fail the test when Main is not running, because nothing
// else would stop the servers they share. Main also sends go-redis's log lines
// to the log of the test that asked for a server (see goRedisLog).
func Main(m *testing.M) {
	shared.mu.Lock()
	shared.running = true
	shared.mu.Unlock()
	redis.SetLogger(&shared.log)

	code := m.Run()

	shared.mu.Lock()
	shared.running = false
	shared.mu.Unlock()
	// Closing the onces makes a late caller (a goroutine a test leaked) get
	// errStopped instead of starting a server that nothing would stop.
	if p, _ := shared.server.get(func() (*Process, error) { return nil, errStopped }); p != nil {
		p.stop()
	}
	ps, _ := shared.cluster.get(func() ([]*Process, error) { return nil, errStopped })
	for _, p := range ps {
		p.stop()
	}
	os.Exit(code)
}

// requireMain fails t when Main is not running the tests.
func requireMain(t testing.TB, fn string) {
	t.Helper()
	shared.mu.Lock()
	running := shared.running
	shared.mu.Unlock()
	if !running {
		t.Fatalf("redistest.%s: the shared servers are stopped by redistest.Main: add\n\tfunc TestMain(m *testing.M) { redistest.Main(m) }\nto this package's tests", fn)
	}
}

// Server is a Redis for tests.
type Server struct {
	// Addr is the host:port of the server, on 127.0.0.1 (or REDIS_ADDR).
	Addr string
	// Real is true for a real redis-server.
	Real bool
	// Mini is non-nil only when New fell back to miniredis.
	Mini *miniredis.Miniredis
}

// New returns a real Redis for t: REDIS_ADDR if set; otherwise one redis-server
// per test binary, started on the first call on a free port of 127.0.0.1 and shared
// by all tests of the package. Tests isolate themselves by key prefix; nothing
// here ever flushes the server.
//
// Only when no redis-server binary is in PATH does New fall back to a fresh
// miniredis, and it says so with t.Logf; with RATEWINDOW_REQUIRE_REDIS=1 it fails
// the test instead. The package's TestMain must call [Main].
func New(t testing.TB) *Server {
	t.Helper()
	requireMain(t, "New")
	shared.log.watch(t)
	if addr := os.Getenv(envAddr); addr != "" {
		if err := checkLoopback(addr); err != nil {
			t.Fatalf("redistest.New: %s: %v", envAddr, err)
		}
		return &Server{Addr: addr, Real: true}
	}
	if _, err := exec.LookPath(serverBin); err != nil {
		if requireRedis() {
			t.Fatalf("redistest.New: %v; %s=1 forbids the miniredis fallback: install redis-server or set %s", err, envRequire, envAddr)
		}
		m := Mini(t)
		t.Logf("redistest.New: no %s binary in PATH: using miniredis at %s", serverBin, m.Addr())
		return &Server{Addr: m.Addr(), Mini: m}
	}
	p, err := shared.server.get(func() (*Process, error) { return startServer() })
	if err != nil {
		t.Fatalf("redistest.New: shared redis-server: %v", err)
	}
	return &Server{Addr: p.Addr, Real: true}
}

// Client returns a new client for s, closed at t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, s.Addr)
}

// Mini returns a fresh miniredis, closed at t.Cleanup, for unit tests that control
// the clock (FastForward, SetTime).
func Mini(t testing.TB) *miniredis.Miniredis {
	t.Helper()
	return miniredis.RunT(t)
}

// newClient returns a client for addr, closed at t.Cleanup.
func newClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requireRedis reports whether RATEWINDOW_REQUIRE_REDIS=1.
func requireRedis() bool { return os.Getenv(envRequire) == "1" }

// needBinaries skips t (or, with RATEWINDOW_REQUIRE_REDIS=1, fails it) when one of
// the named executables is not in PATH.
func needBinaries(t testing.TB, fn string, names ...string) {
	t.Helper()
	var missing []string
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("redistest.%s: %s not found in PATH", fn, strings.Join(missing, ", "))
	if requireRedis() {
		t.Fatalf("%s, and %s=1 forbids skipping: install redis-server, redis-tools and redis-sentinel", msg, envRequire)
	}
	t.Skip(msg)
}

// checkLoopback returns an error unless addr is host:port with a loopback host.
func checkLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if port == "" {
		return fmt.Errorf("%q has no port", addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address: tests only ever talk to a Redis on 127.0.0.1, ::1 or localhost", addr)
}
