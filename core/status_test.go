package core_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core"
)

// TestServeNextKeepsTheWriter: under CountIf the handler's ResponseWriter
// captures the status and still flushes, hijacks, reads from a file and
// answers http.ResponseController, on a real server.
func TestServeNextKeepsTheWriter(t *testing.T) {
	statuses := make(chan int, 10)
	l := core.NewMemory()
	rule := core.Rule{Name: "writer", Limits: []core.Limit{core.PerMinute(100)}, CountIf: func(s int) bool {
		statuses <- s
		return true
	}}
	e, err := core.NewEnforcer(l, rule)
	if err != nil {
		t.Fatal(err)
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/flush":
			w.Write([]byte("a"))
			w.(http.Flusher).Flush()
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("ResponseController.Flush: %v", err)
			}
		case "/deadline":
			// reached through Unwrap
			if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Errorf("SetWriteDeadline: %v", err)
			}
			w.WriteHeader(http.StatusAccepted)
		case "/readfrom":
			w.WriteHeader(http.StatusCreated)
			if _, err := w.(io.ReaderFrom).ReadFrom(strings.NewReader("copied")); err != nil {
				t.Errorf("ReadFrom: %v", err)
			}
		case "/hijack":
			conn, rw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("Hijack: %v", err)
				return
			}
			rw.WriteString("HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			rw.Flush()
			conn.Close()
		case "/interim":
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusNotFound)
		case "/nothing":
		}
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r, ok := e.Handle(w, r, ""); ok {
			e.ServeNext(w, r, next)
		}
	}))
	defer srv.Close()
	for _, c := range []struct {
		path   string
		status int
		body   string
		seen   int
	}{
		{"/flush", 200, "a", 200},
		{"/deadline", 202, "", 202},
		{"/readfrom", 201, "copied", 201},
		{"/hijack", 418, "", 101},
		{"/interim", 404, "", 404},
		{"/nothing", 200, "", 200},
	} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+c.path, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		body, _ := io.ReadAll(bufio.NewReader(resp.Body))
		resp.Body.Close()
		var seen int
		select {
		case seen = <-statuses:
		case <-time.After(10 * time.Second):
		}
		if resp.StatusCode != c.status || string(body) != c.body || seen != c.seen {
			t.Errorf("%s: %d %q, CountIf saw %d; want %d %q, CountIf %d", c.path, resp.StatusCode, body, seen, c.status, c.body, c.seen)
		}
	}
}
