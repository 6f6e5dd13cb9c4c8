package exampleapp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestListenAddr(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"", "127.0.0.1:8080"},
		{"9090", "127.0.0.1:9090"},
		{"0", "127.0.0.1:0"},
		{"127.0.0.1:0", "127.0.0.1:0"},
		{":8080", ":8080"},
		{"[::1]:0", "[::1]:0"},
	} {
		if got := listenAddr(tc.env); got != tc.want {
			t.Errorf("listenAddr(%q) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestBaseURL(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}, "http://127.0.0.1:8080"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 80}, "http://127.0.0.1:80"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "http://[::1]:8080"},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, "http://[::1]:1"},
		{&net.UnixAddr{Name: "/tmp/x.sock", Net: "unix"}, "http:///tmp/x.sock"},
	} {
		if got := baseURL(tc.addr); got != tc.want {
			t.Errorf("baseURL(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// syncBuffer is an output the server and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listening = regexp.MustCompile(`(?m)^listening on (http://127\.0\.0\.1:[0-9]+)$`)

// startRun runs the server with env until the test ends; it returns the
// base URL, the output and a function that stops the server and returns
// run's error.
func startRun(t *testing.T, env map[string]string, routes func(*App) http.Handler) (string, *syncBuffer, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, "test", func(k string) string { return env[k] }, out, routes) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			return fmt.Errorf("run did not return 10s after its context was canceled")
		}
	})
	t.Cleanup(func() { _ = stop() })
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			return m[1], out, stop
		}
		select {
		case err := <-errc:
			t.Fatalf("run returned before listening: %v\noutput:\n%s", err, out)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("no address printed within 10s; output:\n%s", out)
	return "", nil, nil
}

// get returns the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func hello(*App) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
}

// ports hides port numbers, which change from run to run.
var ports = regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)

func TestRunEmbeddedRedis(t *testing.T) {
	url, out, stop := startRun(t, map[string]string{"ADDR": "127.0.0.1:0"}, hello)
	if code, body := get(t, url+"/"); code != http.StatusOK || body != "hello" {
		t.Errorf("GET / = %d %q, want 200 \"hello\"", code, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	want := `ratewindow test example
redis:  embedded miniredis at 127.0.0.1:PORT (set REDIS_URL=redis://127.0.0.1:PORT/0 to use a real Redis)
limits:
  global  20/s and 300/min per client IP        every route but /healthz
  login   5/min per user (X-User) and route    POST /login
  export  20 units/min per client IP, 5 a call  GET /export
listening on http://127.0.0.1:PORT
see a 429:
  for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' -X POST -H 'X-User: alice' http://127.0.0.1:PORT/login; done
shutting down
`
	if got := ports.ReplaceAllString(out.String(), "127.0.0.1:PORT"); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
}

func TestRunRedisURL(t *testing.T) {
	s := redistest.New(t)
	url, out, stop := startRun(t, map[string]string{"ADDR": "127.0.0.1:0", "REDIS_URL": "redis://" + s.Addr + "/0"}, hello)
	if code, _ := get(t, url+"/"); code != http.StatusOK {
		t.Errorf("GET / = %d, want 200", code)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if want := "redis:  " + s.Addr + " (REDIS_URL)\n"; !strings.Contains(out.String(), want) {
		t.Errorf("output:\n%s\nwant a line %q", out, want)
	}
}

func TestRunErrors(t *testing.T) {
	// A port nobody listens on: bind one, then close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // the start of the error
		hide string // text the error must not show
	}{
		{"bad url", map[string]string{"REDIS_URL": "redis://:s3cret@127.0.0.1:notaport/0"}, "REDIS_URL: ", "s3cret"},
		{"bad scheme", map[string]string{"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL: ", ""},
		{"no redis", map[string]string{"REDIS_URL": "redis://" + closed + "/0"}, "redis at " + closed + " (REDIS_URL): ", ""},
		{"bad addr", map[string]string{"ADDR": "127.0.0.1:notaport"}, "listen: ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			routes := func(*App) http.Handler { called = true; return http.NotFoundHandler() }
			err := run(context.Background(), "test", func(k string) string { return tc.env[k] }, io.Discard, routes)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("run: %v, want an error starting with %q", err, tc.want)
			}
			if tc.hide != "" && strings.Contains(err.Error(), tc.hide) {
				t.Errorf("error %q shows %q", err, tc.hide)
			}
			if called != (tc.name == "bad addr") {
				t.Errorf("routes called: %v", called)
			}
		})
	}
}

func ExampleLogin() {
	for _, user := range []string{"alice", ""} {
		code, body := Login(user)
		fmt.Printf("%d %s", code, body)
	}
	// Output:
	// 200 welcome, alice
	// 400 X-User header required
}
