package redistest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
)

// goRedisLog is go-redis's logger while Main runs the tests (redis.SetLogger
// is global: Main sets it once per test binary). Its lines (a pool that cannot
// dial, a Sentinel's master moving) go to the log of the newest running test
// that asked this package for a server, shown for a failed test or under -v,
// rather than to the binary's stderr, where they buried the FAIL lines. When
// tests run in parallel, the newest is a guess; a line written while no such
// test runs (a client's pool redialling after its test ended) is printed
// only under -v.
type goRedisLog struct {
	mu    sync.Mutex
	tests []testing.TB // oldest first; a test once per server it asked for
}

// Printf implements go-redis's internal.Logging.
func (l *goRedisLog) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.tests); n > 0 {
		l.tests[n-1].Logf("go-redis: "+format, v...)
		return
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "go-redis (no test running): "+format+"\n", v...)
	}
}

// watch sends go-redis's lines to t's log until t's cleanup ends (after
// the cleanups registered later, such as closing its clients).
func (l *goRedisLog) watch(t testing.TB) {
	l.mu.Lock()
	l.tests = append(l.tests, t)
	l.mu.Unlock()
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if i := slices.Index(l.tests, t); i >= 0 {
			l.tests = slices.Delete(l.tests, i, i+1)
		}
	})
}
