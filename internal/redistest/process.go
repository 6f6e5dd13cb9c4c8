package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Executables started by this package, looked up in PATH.
const (
	serverBin   = "redis-server"
	cliBin      = "redis-cli"
	sentinelBin = "redis-sentinel"
)

const (
	readyTimeout = 5 * time.Second  // a started server must answer by then
	stopTimeout  = 10 * time.Second // a killed server must be reaped by then
	startTries   = 3                // attempts with fresh ports when a start fails
	logTail      = 4 << 10          // bytes of the server log shown in an error
)

// Process is a redis-server (or redis-sentinel) started by this package on a free
// port of 127.0.0.1, in its own temporary directory and process group.
// Its methods may be called from several goroutines.
type Process struct {
	// Addr is the host:port the process listens on, on 127.0.0.1. Restart keeps it.
	Addr string

	bin  string   // absolute path of the executable
	dir  string   // working directory: log, cluster and sentinel configuration
	argv []string // command line after bin; the same on every (re)start

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil before the first start
	done   chan struct{} // closed when cmd has exited and been reaped
	killed bool          // the group of cmd has been killed: its id may be reused
}

// Start starts a dedicated redis-server for t on a free port of 127.0.0.1 and stops
// it at t.Cleanup. args are appended to the command line, for example
// "--maxmemory", "10mb"; they must not set the port, bind address or directory.
// Without a redis-server binary the test is skipped, or fails when
// RATEWINDOW_REQUIRE_REDIS=1.
func Start(t testing.TB, args ...string) *Process {
	t.Helper()
	needBinaries(t, "Start", serverBin)
	shared.log.watch(t)
	p, err := startServer(args...)
	if err != nil {
		t.Fatalf("redistest.Start: %v", err)
	}
	t.Cleanup(p.stop)
	return p
}

// Client returns a new client for p, closed at t.Cleanup. The client reconnects
// by itself after Restart.
func (p *Process) Client(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, p.Addr)
}

// Kill sends SIGKILL to the process (and its forked children) and returns when the
// port no longer accepts connections. Killing a stopped process does nothing.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.kill(); err != nil {
		t.Fatalf("redistest: kill %s: %v", p.Addr, err)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		c, err := net.DialTimeout("tcp", p.Addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s still accepts connections after the server was killed", p.Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Restart starts the process again with the same command line on the same port,
// killing it first if it is still running, and returns when it answers.
// Data is not kept across a restart: persistence is off.
func (p *Process) Restart(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.kill(); err != nil {
		t.Fatalf("redistest: restart %s: %v", p.Addr, err)
	}
	if err := p.start(); err != nil {
		t.Fatalf("redistest: restart %s: %v", p.Addr, err)
	}
}

// port returns the port of p.Addr.
func (p *Process) port() string {
	_, port, _ := net.SplitHostPort(p.Addr)
	return port
}

// commonArgs are the arguments of every server: loopback only, no persistence.
func commonArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
	}
}

// startServer starts a redis-server with args appended to the common ones.
func startServer(args ...string) (*Process, error) {
	return launch(serverBin, func(dir string) (int, []string, error) {
		port, err := freePort()
		if err != nil {
			return 0, nil, err
		}
		// Replication without delay: a replica attached to this server, or this
		// server once it is a replica, syncs at once instead of after 5s.
		argv := append(commonArgs(port, dir), "--repl-diskless-sync-delay", "0")
		return port, append(argv, args...), nil
	})
}

// launch starts the executable name in a new temporary directory. argv returns
// the port and the command line of one attempt; it is called again, to pick new
// ports, when the attempt fails because the process exited or another process
// answered on its port.
func launch(name string, argv func(dir string) (port int, argv []string, err error)) (*Process, error) {
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-"+name+"-")
	if err != nil {
		return nil, err
	}
	for try := 1; ; try++ {
		port, args, err := argv(dir)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		p := &Process{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			bin:  bin,
			dir:  dir,
			argv: args,
		}
		err = p.start()
		if err == nil {
			return p, nil
		}
		var again *retryError
		if !errors.As(err, &again) || try == startTries {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
}

// retryError is a failed start that fresh ports may fix: the port was taken.
type retryError struct{ err error }

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// start starts the process and waits until it answers on p.Addr. p.mu is held or
// p is not shared yet.
func (p *Process) start() error {
	logPath := filepath.Join(p.dir, "redis.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	// This attempt's output starts here.
	from, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		_ = logf.Close()
		return err
	}
	fmt.Fprintf(logf, "### redistest %s: %s %s\n", time.Now().Format(time.RFC3339Nano), p.bin, strings.Join(quoteArgs(p.argv), " "))
	cmd := exec.Command(p.bin, p.argv...)
	cmd.Dir = p.dir
	// A file, not a pipe: a child that outlived the test binary would otherwise
	// hold go test's output open.
	cmd.Stdout, cmd.Stderr = logf, logf
	setProcAttr(cmd)
	err = cmd.Start()
	_ = logf.Close() // the child has its own descriptor
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.cmd, p.done, p.killed = cmd, done, false

	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			err := fmt.Errorf("%s on %s exited at start (%v)%s", filepath.Base(p.bin), p.Addr, cmd.ProcessState, p.logTail())
			if p.logSince(from, "Address already in use") {
				return &retryError{err}
			}
			return err
		default:
		}
		pid, err := serverPID(p.Addr)
		switch {
		case err == nil && pid == cmd.Process.Pid:
			return nil
		case err == nil:
			_ = p.kill()
			return &retryError{fmt.Errorf("another server (pid %d) answers on %s", pid, p.Addr)}
		case time.Now().After(deadline):
			_ = p.kill()
			return fmt.Errorf("%s on %s did not answer within %v: %v%s", filepath.Base(p.bin), p.Addr, readyTimeout, err, p.logTail())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill kills the process group and waits until the process is reaped. p.mu is
// held or p is not shared.
func (p *Process) kill() error {
	if p.cmd == nil || p.killed {
		return nil
	}
	// The group goes even when the leader has exited by itself: a forked child
	// (a replication or save child) may still be alive, and keeps the group id
	// from being reused. It goes once: afterwards the id is free again.
	killGroup(p.cmd)
	select {
	case <-p.done:
		p.killed = true
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("pid %d did not exit within %v of SIGKILL", p.cmd.Process.Pid, stopTimeout)
	}
}

// stop kills the process and removes its directory.
func (p *Process) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.kill()
	_ = os.RemoveAll(p.dir)
}

// logTail returns the end of the process log, for error messages.
func (p *Process) logTail() string {
	b, err := os.ReadFile(filepath.Join(p.dir, "redis.log"))
	if err != nil {
		return fmt.Sprintf("\n(no log: %v)", err)
	}
	if len(b) > logTail {
		b = b[len(b)-logTail:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return "\n--- log of " + filepath.Base(p.bin) + " " + p.Addr + " ---\n" + strings.TrimRight(string(b), "\n")
}

// logSince reports whether the log contains s after offset from.
func (p *Process) logSince(from int64, s string) bool {
	b, err := os.ReadFile(filepath.Join(p.dir, "redis.log"))
	return err == nil && from <= int64(len(b)) && bytes.Contains(b[from:], []byte(s))
}

// quoteArgs quotes the empty and spaced arguments of a command line for the log.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}

// freePort returns a port of 127.0.0.1 that was free a moment ago. Another
// process may take it before the server binds it; launch then retries.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// serverPID asks the server at addr for its process id (INFO server).
func serverPID(addr string) (int, error) {
	// Short: a probe that hangs (something else holds the port and does not
	// speak RESP) must not eat the start's deadline; the next probe follows.
	reply, err := commandWithin(250*time.Millisecond, addr, "INFO", "server")
	if err != nil {
		return 0, err
	}
	info, ok := reply.(string)
	if !ok {
		return 0, fmt.Errorf("INFO: unexpected reply %v", reply)
	}
	v, ok := infoField(info, "process_id")
	if !ok {
		return 0, fmt.Errorf("INFO: no process_id")
	}
	return strconv.Atoi(v)
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, true
		}
	}
	return "", false
}

// ACLClient starts a dedicated server (see Start) and returns a client of a
// user allowed every command on every key but for the ACL rules given,
// such as "-fcall" or "resetkeys", "~rw:{ok*"; closed at t.Cleanup.
func ACLClient(t testing.TB, rules ...string) *redis.Client {
	t.Helper()
	p := Start(t)
	args := []any{"ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := p.Client(t).Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("redistest.ACLClient: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	return c
}
