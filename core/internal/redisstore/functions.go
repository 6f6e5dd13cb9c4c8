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

// library holds the scripts of a redisStore as one Redis function library
// (Redis 7: FUNCTION LOAD, FCALL). A library's body runs once, when it
// loads, while EVAL runs a script's whole source on every call: for the
// scripts here, algorithms.lua's function definitions cost about 4.6 µs a
// call, as much as a decision itself. Calls use FCALL once the library is
// loaded, and EVALSHA before that, or for good where Redis has no functions
// (Redis 6, miniredis) or the client may not load them (an ACL without
// FUNCTION, a client other than Client and ClusterClient).
//
// The library is loaded in the background, by the first call that finds it
// unloaded, never in a call's way. Its name, and its functions' names,
// carry a hash of its source ("ratewindow_<hash>"), so that replicas of
// different versions each load and call their own during a rolling upgrade
// (FUNCTION DELETE removes an old version's library; it takes a few tens of
// kilobytes). A call that finds its function missing (FUNCTION FLUSH, a
// restart without persistence, a new Cluster node) runs as EVALSHA instead,
// and the library is loaded again, at most once every libraryRetry.
type library struct {
	name  string // ratewindow_<hash>
	src   string // FUNCTION LOAD's argument
	state atomic.Int32
	retry atomic.Int64 // unix ns before which no load starts after a failure
	// load loads src on every server of the client; nil: the client cannot
	load func(ctx context.Context) error
}

// The states of a library.
const (
	libraryUnloaded int32 = iota // not loaded (yet, or again)
	libraryLoading               // a load is under way
	libraryLoaded                // FCALL works
	libraryUnusable              // the server or the client cannot: EVALSHA for good
)

// libraryRetry is how long after a failed load (a network error, a
// function found missing) the next load may start.
const libraryRetry = 10 * time.Second

// libraryTimeout bounds one load.
const libraryTimeout = 5 * time.Second

// libraryScript is one script of a library: its function's name suffix,
// its own source, and whether it runs after algorithms.lua.
type libraryScript struct {
	s          *script
	name, body string
	algorithms bool
}

// libraryFunctions are the functions of algorithms.lua that the scripts
// call, each script's body one call of the function named as the script:
// the library's build returns them, and each script's function takes its
// own as a local. A script that calls any other fails under FCALL
// (TestLibrary).
var libraryFunctions = [...]string{"allow", "allow_batch", "reserve", "release", "refund", "block"}

// newLibrary builds the library of scripts (whose script.fn it sets) for
// rdb.
func newLibrary(rdb redis.Scripter, algorithms string, scripts []libraryScript) *library {
	// the name: a hash of what the source is built from
	h := sha1.New()
	h.Write([]byte(algorithms))
	for _, sc := range scripts {
		fmt.Fprintf(h, "\x00%s\x00%v\x00%s", sc.name, sc.algorithms, sc.body)
	}
	name := "ratewindow_" + hex.EncodeToString(h.Sum(nil)[:8])
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\n", name)
	b.WriteString("local api -- algorithms.lua's functions, built by the first call\n")
	b.WriteString("-- The standard libraries cannot be reached while a library loads, so\n")
	b.WriteString("-- algorithms.lua runs in build, on the first call, and once.\n")
	b.WriteString("local function build()\n")
	b.WriteString(algorithms)
	b.WriteString("\nreturn {")
	for _, n := range libraryFunctions {
		fmt.Fprintf(&b, "%s = %s, ", n, n)
	}
	b.WriteString("}\nend\n")
	for _, sc := range scripts {
		sc.s.fn = name + "_" + sc.name
		sc.s.fnArg = sc.s.fn
		fmt.Fprintf(&b, "\nredis.register_function('%s', function(KEYS, ARGV)\n", sc.s.fn)
		if sc.algorithms {
			fmt.Fprintf(&b, "  api = api or build()\n  local %s = api.%s\n", sc.name, sc.name)
		}
		b.WriteString(sc.body)
		b.WriteString("\nend)\n")
	}
	l := &library{name: name, src: b.String()}
	switch c := rdb.(type) {
	case *redis.Client: // also NewFailoverClient
		l.load = func(ctx context.Context) error { return loadLibrary(ctx, c, l.src) }
	case *redis.ClusterClient:
		l.load = func(ctx context.Context) error {
			return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return loadLibrary(ctx, m, l.src) })
		}
	default:
		l.state.Store(libraryUnusable)
	}
	return l
}

// loadLibrary loads src on one server; a library of the same name (so of
// the same source) loaded already is no error.
func loadLibrary(ctx context.Context, c *redis.Client, src string) error {
	err := c.FunctionLoad(ctx, src).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// usable reports whether calls go as FCALL; when the library is not loaded
// and no load is under way or failed lately, it starts one.
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

// loadNow loads the library and sets its state by the outcome.
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

// missing notes that a call found its function missing: the library is
// loaded again (see usable).
func (l *library) missing() {
	if l.state.CompareAndSwap(libraryLoaded, libraryUnloaded) {
		l.retry.Store(time.Now().Add(libraryRetry).UnixNano())
	}
}

// cannotLoad reports whether a failed FUNCTION LOAD means that this server
// or client never will: the command is unknown (Redis 6, miniredis), or an
// ACL forbids it.
func cannotLoad(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand") ||
		strings.HasPrefix(msg, "noperm") || strings.Contains(msg, "no permissions")
}

// functionMissing reports whether err is FCALL's answer for a function the
// server does not have.
func functionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// refused reports whether err is FCALL's answer for a call that did not
// run, so that it goes again as EVALSHA: its function is missing (the
// library is loaded again), or an ACL forbids FCALL (the library is not
// used again).
func (l *library) refused(err error) bool {
	switch {
	case err == nil:
		return false
	case functionMissing(err):
		l.missing()
		return true
	case redis.HasErrorPrefix(err, "NOPERM") && strings.Contains(err.Error(), "'fcall'"):
		// the command is forbidden; a key the ACL forbids is that
		// call's own failure, and EVALSHA would fail alike
		l.state.Store(libraryUnusable)
		return true
	}
	return false
}
