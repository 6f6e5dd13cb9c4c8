package nethttp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// maxFrames is the most frames of ratewindow's own code between the
// middleware's ServeHTTP and go-redis on a lone decision's way.
const maxFrames = 10

// framesHook records, at the client's Process of each script call, the
// frames of ratewindow's packages on the stack.
type framesHook struct {
	mu     sync.Mutex
	frames [][]string
}

func (h *framesHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *framesHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *framesHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "fcall" || name == "evalsha" || name == "eval" {
			pcs := make([]uintptr, 64)
			fs := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
			var own []string
			for f, more := fs.Next(); ; f, more = fs.Next() {
				if strings.HasPrefix(f.Function, "github.com/ratewindow/ratewindow/") && !strings.Contains(f.Function, "_test") &&
					!strings.Contains(f.Function, ".Test") {
					own = append(own, f.Function)
				}
				if !more {
					break
				}
			}
			h.mu.Lock()
			h.frames = append(h.frames, own)
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// TestDecisionFrames: a lone decision passes through at most maxFrames
// frames of ratewindow's own code from the middleware to go-redis (a client
// with ContextTimeoutEnabled: the store sends through it, hooks and all).
func TestDecisionFrames(t *testing.T) {
	srv := redistest.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	h := &framesHook{}
	rdb.AddHook(h)
	l, err := core.New(rdb, core.WithPrefix("frames:"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(context.Background()); err != nil { // the scripts loaded: the decision is one FCALL
		t.Fatal(err)
	}
	h.mu.Lock()
	h.frames = nil
	h.mu.Unlock()
	handler := LimitByIP(l, 100, 60e9)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	handler.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.frames) != 1 {
		t.Fatalf("%d script calls, want 1", len(h.frames))
	}
	if got := h.frames[0]; len(got) > maxFrames {
		t.Fatalf("%d frames of ratewindow's code, want at most %d:\n%s", len(got), maxFrames, strings.Join(got, "\n"))
	} else {
		t.Logf("%d frames:\n%s", len(got), strings.Join(got, "\n"))
	}
}
