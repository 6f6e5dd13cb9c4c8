package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { Main(m) }

func TestNew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(t)
	c := s.Client(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING %s: %v", s.Addr, err)
	}
	if s.Real == (s.Mini != nil) {
		t.Errorf("Real = %v, Mini = %v: exactly one must be set", s.Real, s.Mini)
	}
	key := "redistest:" + t.Name()
	if err := c.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if s.Real {
		// One server per test binary: a second New shares it.
		if again := New(t); again.Addr != s.Addr {
			t.Errorf("second New: %s, want the shared %s", again.Addr, s.Addr)
		}
		if v, err := New(t).Client(t).Get(ctx, key).Result(); err != nil || v != "v" {
			t.Errorf("GET through a second New = %q, %v; want v", v, err)
		}
	}
}

func TestMini(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := Mini(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	m.FastForward(2 * time.Second)
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET after the TTL passed: %v, want redis.Nil", err)
	}
	if Mini(t) == m {
		t.Error("Mini returned the same miniredis twice")
	}
}

func TestStartKillRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := Start(t, "--maxmemory", "10mb")
	c := p.Client(t)
	if got, err := c.ConfigGet(ctx, "maxmemory").Result(); err != nil || got["maxmemory"] != "10485760" {
		t.Errorf("CONFIG GET maxmemory = %v, %v; want the extra argument 10mb", got, err)
	}
	for param, want := range map[string]string{"bind": "127.0.0.1", "save": "", "appendonly": "no", "protected-mode": "no"} {
		if got, err := c.ConfigGet(ctx, param).Result(); err != nil || got[param] != want {
			t.Errorf("CONFIG GET %s = %v, %v; want %q", param, got, err, want)
		}
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr := p.Addr

	p.Kill(t)
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s accepts connections after Kill", addr)
	}
	if _, err := command(addr, "PING"); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	p.Kill(t) // killing a dead server does nothing

	p.Restart(t)
	if p.Addr != addr {
		t.Fatalf("Restart moved the server from %s to %s", addr, p.Addr)
	}
	// The client created before Kill reconnects by itself.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET k after Restart: %v, want redis.Nil (no persistence)", err)
	}

	p.Restart(t) // restarting a running server kills it first
	if err := p.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after the second Restart: %v", err)
	}
}

func TestLaunchRetriesTakenPort(t *testing.T) {
	t.Parallel()
	needBinaries(t, "launch", serverBin)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	tries := 0
	p, err := launch(serverBin, func(dir string) (int, []string, error) {
		tries++
		port := takenPort
		if tries > 1 {
			if port, err = freePort(); err != nil {
				return 0, nil, err
			}
		}
		return port, commonArgs(port, dir), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	if tries != 2 || p.Addr == taken.Addr().String() {
		t.Errorf("after %d tries the server is on %s; want a second try on another port than %s", tries, p.Addr, taken.Addr())
	}
	if err := p.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Error(err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := NewCluster(t)
	cc := cl.Client(t)
	for _, tag := range []string{"a", "b", "c", "d", "e"} {
		key := fmt.Sprintf("redistest:%s:{%s}", t.Name(), tag)
		if err := cc.Set(ctx, key, tag, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		if v, err := cc.Get(ctx, key).Result(); err != nil || v != tag {
			t.Fatalf("GET %s = %q, %v; want %q", key, v, err, tag)
		}
	}
	nodes, err := newClient(t, cl.Addrs[0]).ClusterNodes(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	masters := 0
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("CLUSTER NODES line %q", line)
		}
		if strings.Contains(f[2], "master") {
			masters++
			if !strings.HasPrefix(f[1], "127.0.0.1:") {
				t.Errorf("node %s is not on 127.0.0.1", f[1])
			}
		}
	}
	if masters != 3 {
		t.Errorf("CLUSTER NODES lists %d masters, want 3:\n%s", masters, nodes)
	}
	if again := NewCluster(t); strings.Join(again.Addrs, ",") != strings.Join(cl.Addrs, ",") {
		t.Errorf("second NewCluster: %v, want the shared %v", again.Addrs, cl.Addrs)
	}
}

func TestSilent(t *testing.T) {
	t.Parallel()
	addr := Silent(t)
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  time.Second,
		ReadTimeout:  100 * time.Millisecond,
		WriteTimeout: 100 * time.Millisecond,
		MaxRetries:   -1,
	})
	defer c.Close()
	start := time.Now()
	err := c.Ping(context.Background()).Err()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING to a silent server: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the timeout took %v with a 100ms read timeout", d)
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := NewSentinel(t)
	c := s.Client(t)
	key := "redistest:" + t.Name()
	if err := c.Set(ctx, key, "before", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d, %v; want the replica to acknowledge", n, err)
	}
	oldMaster, oldReplica := s.Master, s.Replica

	start := time.Now()
	s.Failover(t)
	t.Logf("Failover took %v", time.Since(start))
	if s.Master != oldReplica || s.Replica != oldMaster {
		t.Fatal("Failover did not swap Master and Replica")
	}
	if addr, err := s.masterAddr(); err != nil || addr != s.Master.Addr {
		t.Fatalf("the sentinel reports master %s, %v; want %s", addr, err, s.Master.Addr)
	}
	if v, err := c.Get(ctx, key).Result(); err != nil || v != "before" {
		t.Errorf("GET after failover = %q, %v; want before", v, err)
	}
	// The failover client now writes to the new master.
	if err := c.Set(ctx, key, "after", time.Minute).Err(); err != nil {
		t.Fatalf("SET through the failover client after Failover: %v", err)
	}
	if v, err := s.Master.Client(t).Get(ctx, key).Result(); err != nil || v != "after" {
		t.Errorf("GET on the new master = %q, %v; want after", v, err)
	}
	if err := s.Replica.Client(t).Set(ctx, key, "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Errorf("SET on the former master: %v, want READONLY", err)
	}
}

func TestCheckLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:6379": true,
		"127.8.9.1:1":    true,
		"localhost:6379": true,
		"[::1]:6379":     true,
		"10.0.0.1:6379":  false,
		"redis:6379":     false,
		"0.0.0.0:6379":   false,
		"127.0.0.1":      false,
		"127.0.0.1:":     false,
	} {
		if err := checkLoopback(addr); (err == nil) != ok {
			t.Errorf("checkLoopback(%q) = %v, want ok = %v", addr, err, ok)
		}
	}
}

// TestEnvironment checks the fallbacks and the environment variables without
// binaries in PATH. It changes the environment, so it is not parallel.
func TestEnvironment(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(envAddr, "")
	t.Setenv(envClusterAddrs, "")

	t.Setenv(envRequire, "")
	if f := run(t, func(tb testing.TB) {
		s := New(tb)
		if s.Real || s.Mini == nil || s.Addr != s.Mini.Addr() {
			t.Errorf("New without redis-server = %+v, want the miniredis fallback", s)
		}
	}); f.ended != "" {
		t.Errorf("New without redis-server: %s %s", f.ended, f.msg)
	}
	for name, start := range map[string]func(testing.TB){
		"Start":       func(tb testing.TB) { Start(tb) },
		"NewCluster":  func(tb testing.TB) { NewCluster(tb) },
		"NewSentinel": func(tb testing.TB) { NewSentinel(tb) },
	} {
		if f := run(t, start); f.ended != "skip" || !strings.Contains(f.msg, "not found in PATH") {
			t.Errorf("%s without binaries: %s %q, want a skip", name, f.ended, f.msg)
		}
	}

	t.Setenv(envRequire, "1")
	for name, start := range map[string]func(testing.TB){
		"New":         func(tb testing.TB) { New(tb) },
		"Start":       func(tb testing.TB) { Start(tb) },
		"NewCluster":  func(tb testing.TB) { NewCluster(tb) },
		"NewSentinel": func(tb testing.TB) { NewSentinel(tb) },
	} {
		if f := run(t, start); f.ended != "fatal" || !strings.Contains(f.msg, envRequire+"=1") {
			t.Errorf("%s without binaries, %s=1: %s %q, want a fatal error naming the variable", name, envRequire, f.ended, f.msg)
		}
	}

	t.Setenv(envAddr, "127.0.0.1:1")
	t.Setenv(envClusterAddrs, "127.0.0.1:2, 127.0.0.1:3,127.0.0.1:4")
	run(t, func(tb testing.TB) {
		if s := New(tb); s.Addr != "127.0.0.1:1" || !s.Real || s.Mini != nil {
			t.Errorf("New with %s = %+v", envAddr, s)
		}
		if c := NewCluster(tb); strings.Join(c.Addrs, ",") != "127.0.0.1:2,127.0.0.1:3,127.0.0.1:4" {
			t.Errorf("NewCluster with %s: %v", envClusterAddrs, c.Addrs)
		}
	})

	t.Setenv(envAddr, "192.0.2.1:6379")
	if f := run(t, func(tb testing.TB) { New(tb) }); f.ended != "fatal" || !strings.Contains(f.msg, "loopback") {
		t.Errorf("New with a remote %s: %s %q, want a fatal error", envAddr, f.ended, f.msg)
	}
	t.Setenv(envClusterAddrs, "127.0.0.1:2,192.0.2.1:6379")
	if f := run(t, func(tb testing.TB) { NewCluster(tb) }); f.ended != "fatal" || !strings.Contains(f.msg, "loopback") {
		t.Errorf("NewCluster with a remote address: %s %q, want a fatal error", f.ended, f.msg)
	}
}

// fakeTB records how a test ended: Skip and Fatal end its goroutine like the
// real ones; Cleanup, Logf and the rest go to the real test.
type fakeTB struct {
	testing.TB
	mu    sync.Mutex
	ended string // "", "skip" or "fatal"
	msg   string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skip(args ...any)                  { f.end("skip", fmt.Sprint(args...)) }
func (f *fakeTB) Skipf(format string, args ...any)  { f.end("skip", fmt.Sprintf(format, args...)) }
func (f *fakeTB) Fatal(args ...any)                 { f.end("fatal", fmt.Sprint(args...)) }
func (f *fakeTB) Fatalf(format string, args ...any) { f.end("fatal", fmt.Sprintf(format, args...)) }

func (f *fakeTB) end(how, msg string) {
	f.mu.Lock()
	f.ended, f.msg = how, msg
	f.mu.Unlock()
	runtime.Goexit()
}

// run calls fn with a fakeTB in a goroutine of its own and returns the fakeTB
// once fn has returned or ended.
func run(t *testing.T, fn func(testing.TB)) *fakeTB {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f
}

// logTB records what is logged to it; the rest goes to the real test.
type logTB struct {
	testing.TB
	mu    sync.Mutex
	lines []string
}

func (l *logTB) Logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// TestGoRedisLogGoesToTheTest: Main made go-redis log to the test that
// asked for a server: a client whose server is gone logs its failed dials
// there, not on the binary's stderr; once the test's cleanup ran, its log
// gets nothing more.
func TestGoRedisLogGoesToTheTest(t *testing.T) {
	var rec *logTB
	t.Run("user", func(t *testing.T) {
		rec = &logTB{TB: t}
		p := Start(rec)
		c := p.Client(t)
		p.Kill(t)
		_ = c.Ping(context.Background()).Err() // go-redis logs the dials it could not make
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if !slices.ContainsFunc(rec.lines, func(s string) bool { return strings.HasPrefix(s, "go-redis: ") }) {
			t.Fatalf("no go-redis line in the test's log: %q", rec.lines)
		}
	})
	n := len(rec.lines)
	shared.log.Printf(context.Background(), "after the test")
	if len(rec.lines) != n {
		t.Fatalf("a line logged after the test ended went to its log: %q", rec.lines[n:])
	}
}
