package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// library holds the scripts as one Redis 7 function library, so that
// algorithms.lua's definitions run once at load rather than on every EVAL.
// Calls use EVALSHA until it is loaded in the background, and for good where
// Redis has no functions (Redis 6, miniredis) or the client may not load
// them (an ACL, a Ring). Its name carries a hash of its source: versions side
// by side in a rolling upgrade each call their own. A call finding its
// function missing (FUNCTION FLUSH, a restart, a new Cluster node) runs as
// EVALSHA, and the library loads again, at most once every libraryRetry.
type library struct {
	name  string // ratewindow_<hash>
	src   string // FUNCTION LOAD's argument
	state atomic.Int32
	retry atomic.Int64                    // unix ns before which no load starts after a failure
	load  func(ctx context.Context) error // on every master
}

// The states of a library.
const (
	libraryUnloaded int32 = iota // not loaded (yet, or again)
	libraryLoading               // a load is under way
	libraryLoaded                // FCALL works
	libraryUnusable              // the server or the client cannot: EVALSHA for good
)

const (
	libraryRetry   = 10 * time.Second // after a failed load or a function found missing
	libraryTimeout = 5 * time.Second  // bounds one load
)

// newLibrary builds the library of scripts (setting their fn) for rdb;
// nil when rdb cannot load it (a Ring).
func newLibrary(rdb redis.Scripter, algorithms string, scripts []*script) *library {
	l := &library{}
	switch c := rdb.(type) {
	case *redis.Client: // also NewFailoverClient
		l.load = func(ctx context.Context) error { return loadLibrary(ctx, c, l.src) }
	case *redis.ClusterClient:
		l.load = func(ctx context.Context) error {
			return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return loadLibrary(ctx, m, l.src) })
		}
	default:
		return nil
	}
	h := sha1.New()
	h.Write([]byte(algorithms))
	for _, sc := range scripts {
		fmt.Fprintf(h, "\x00%s\x00%v\x00%s", sc.name, sc.algorithms, sc.body)
	}
	l.name = "ratewindow_" + hex.EncodeToString(h.Sum(nil)[:8])
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\nlocal api -- algorithms.lua's functions, built by the first call\n"+
		"-- The standard libraries cannot be reached while a library loads, so\n"+
		"-- algorithms.lua runs in build, on the first call, and once.\n"+
		"local function build()\n%s\nreturn {", l.name, algorithms)
	for _, sc := range scripts {
		if sc.algorithms { // it calls algorithms.lua's function of its name
			fmt.Fprintf(&b, "%s = %s, ", sc.name, sc.name)
		}
	}
	b.WriteString("}\nend\n")
	for _, sc := range scripts {
		sc.fn = l.name + "_" + sc.name
		fmt.Fprintf(&b, "\nredis.register_function('%s', function(KEYS, ARGV)\n", sc.fn)
		if sc.algorithms {
			fmt.Fprintf(&b, "  api = api or build()\n  local %s = api.%s\n", sc.name, sc.name)
		}
		fmt.Fprintf(&b, "%s\nend)\n", sc.body)
	}
	l.src = b.String()
	return l
}

// loadLibrary loads src on one server; already loaded is no error.
func loadLibrary(ctx context.Context, c *redis.Client, src string) error {
	err := c.FunctionLoad(ctx, src).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// usable reports whether calls go as FCALL; it starts a load when one is due.
func (l *library) usable() bool {
	switch l.state.Load() {
	case libraryLoaded:
		return true
	case libraryUnloaded:
		if time.Now().UnixNano() >= l.retry.Load() && l.state.CompareAndSwap(libraryUnloaded, libraryLoading) {
			go l.loadNow()
		}
	}
	return false
}

func (l *library) loadNow() {
	ctx, cancel := context.WithTimeout(context.Background(), libraryTimeout)
	defer cancel()
	err := l.load(ctx)
	switch {
	case err == nil:
		l.state.Store(libraryLoaded)
	case cannotLoad(err):
		l.state.Store(libraryUnusable)
	default:
		l.retry.Store(time.Now().Add(libraryRetry).UnixNano())
		l.state.Store(libraryUnloaded)
	}
}

// cannotLoad reports whether a failed FUNCTION LOAD means the server or
// client never will: an unknown command, or an ACL.
func cannotLoad(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand") ||
		strings.HasPrefix(msg, "noperm") || strings.Contains(msg, "no permissions")
}

// refused reports whether FCALL did not run, so that the call goes again
// as EVALSHA: its function is missing (the library loads again), or an ACL
// forbids FCALL (the library is not used again).
func (l *library) refused(err error) bool {
	switch {
	case err == nil:
		return false
	case strings.Contains(err.Error(), "Function not found"):
		if l.state.CompareAndSwap(libraryLoaded, libraryUnloaded) {
			l.retry.Store(time.Now().Add(libraryRetry).UnixNano())
		}
		return true
	case redis.HasErrorPrefix(err, "NOPERM") && strings.Contains(err.Error(), "'fcall'"):
		// the command is forbidden; a key the ACL forbids is that
		// call's own failure, and EVALSHA would fail alike
		l.state.Store(libraryUnusable)
		return true
	}
	return false
}
