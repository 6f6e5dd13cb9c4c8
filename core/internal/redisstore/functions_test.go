package redisstore

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// waitLibrary waits for the background load of s's library to end, and
// returns the state it ended in.
func waitLibrary(t *testing.T, l *library) int32 {
	t.Helper()
	for deadline := time.Now().Add(libraryTimeout + 5*time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st := l.state.Load(); st != libraryLoading {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatal("the library's load did not end")
		}
	}
}

// scriptNames records the names of the script commands a client sends.
type scriptNames struct {
	names chan string
	ints  *atomic.Int64 // the script calls read as []int64 (fcallInts)
}

func newScriptNames() scriptNames { return scriptNames{make(chan string, 10000), new(atomic.Int64)} }

func (h scriptNames) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h scriptNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note(cmd)
		return next(ctx, cmd)
	}
}

func (h scriptNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.note(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h scriptNames) note(cmd redis.Cmder) {
	if isScriptCall(cmd) {
		if _, ok := cmd.(*redis.IntSliceCmd); ok {
			h.ints.Add(1)
		}
		select {
		case h.names <- cmd.Name():
		default:
		}
	}
}

func (h scriptNames) take() []string {
	var out []string
	for {
		select {
		case n := <-h.names:
			out = append(out, n)
		default:
			return out
		}
	}
}

// The scripts run as one function library where Redis has functions: the
// first decision, sent as EVALSHA, starts the library's load; later ones
// are FCALLs, alone and in pipelines, with the same answers. A library
// lost on the server (FUNCTION FLUSH) costs no decision: the call that
// finds its function missing goes as EVAL, and the library is loaded
// again. Where functions are not to be had (miniredis, an ACL without
// FUNCTION or FCALL), the scripts run as EVALSHA for good.
func TestLibrary(t *testing.T) {
	ctx := context.Background()
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.Start(t).Client(t)
		s, lib, names := libraryStore(t, rdb)
		lim := perHour(1000)
		remaining := int64(1000)
		allow := func(step string, n int) {
			t.Helper()
			for range n {
				remaining--
				d, err := s.Allow(ctx, decision("k", lim))
				if err != nil || !d.Allowed || d.States[0].Remaining != remaining {
					t.Fatalf("%s: %+v %v, want %d remaining", step, d, err, remaining)
				}
			}
		}
		allow("first", 1)
		if got := strings.Join(names.take(), " "); got != "evalsha eval" { // NOSCRIPT on a new server
			t.Fatalf("the first decision sent %v, want EVALSHA and EVAL", got)
		}
		if st := waitLibrary(t, lib); st != libraryLoaded {
			t.Fatalf("the library's state is %d after its load, want loaded", st)
		}
		libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib.name}).Result()
		if err != nil || len(libs) != 1 || len(libs[0].Functions) != 8 {
			t.Fatalf("FUNCTION LIST %s: %+v %v, want one library of 8 functions", lib.name, libs, err)
		}
		ints := names.ints.Load()
		allow("loaded", 5)
		if got := names.take(); strings.Join(got, " ") != "fcall fcall fcall fcall fcall" {
			t.Fatalf("decisions after the load sent %v, want FCALL", got)
		}
		if got := names.ints.Load() - ints; got != 5 {
			t.Fatalf("%d of 5 lone FCALLs were read as []int64", got)
		}
		// concurrent decisions: pipelines of FCALL (merged ones included)
		done := make(chan error, 64)
		for range 64 {
			go func() {
				_, err := s.Allow(ctx, decision("other", lim))
				done <- err
			}()
		}
		for range 64 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range names.take() {
			if n != "fcall" {
				t.Fatalf("a concurrent decision sent %s", n)
			}
		}
		d, err := s.Allow(ctx, peek("other", lim))
		if err != nil || d.States[0].Remaining != 1000-64 {
			t.Fatalf("after 64 concurrent decisions: %+v %v", d, err)
		}
		names.take()
		// the library lost: the call goes again as EVALSHA, then the
		// library is loaded anew
		if err := rdb.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		allow("flushed", 1)
		if got := strings.Join(names.take(), " "); got != "fcall evalsha" {
			t.Fatalf("the decision after FUNCTION FLUSH sent %v, want FCALL, then EVALSHA", got)
		}
		if st := lib.state.Load(); st != libraryUnloaded {
			t.Fatalf("after a missing function the state is %d, want unloaded", st)
		}
		lib.retry.Store(0) // no need to wait libraryRetry
		allow("reloading", 1)
		if st := waitLibrary(t, lib); st != libraryLoaded {
			t.Fatalf("the library's state is %d after its second load, want loaded", st)
		}
		allow("reloaded", 3)
		if got := names.take(); len(got) < 3 || strings.Join(got[len(got)-3:], " ") != "fcall fcall fcall" {
			t.Fatalf("decisions after the second load sent %v, want FCALL", got)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		rdb := redistest.NewCluster(t).Client(t)
		s, lib, names := libraryStore(t, rdb)
		lim := perHour(10)
		keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"} // on every node
		for i, want := range []int64{9, 8} {
			for _, k := range keys {
				d, err := s.Allow(ctx, decision(k, lim))
				if err != nil || d.States[0].Remaining != want {
					t.Fatalf("round %d, key %s: %+v %v", i, k, d, err)
				}
			}
			if i == 0 {
				if st := waitLibrary(t, lib); st != libraryLoaded {
					t.Fatalf("the library's state is %d after its load, want loaded", st)
				}
				names.take()
			}
		}
		if got := strings.Join(names.take(), " "); got != strings.TrimSpace(strings.Repeat("fcall ", len(keys))) {
			t.Fatalf("decisions after the load sent %v, want FCALL", got)
		}
		if err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			libs, err := m.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib.name}).Result()
			if err == nil && len(libs) != 1 {
				t.Errorf("master %s holds %d libraries named %s", m.Options().Addr, len(libs), lib.name)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range []struct {
		name   string
		client func(t *testing.T) *redis.Client
	}{
		{"miniredis", func(t *testing.T) *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: redistest.Mini(t).Addr()})
			t.Cleanup(func() { c.Close() })
			return c
		}},
		{"ACL without FCALL", func(t *testing.T) *redis.Client { return redistest.ACLClient(t, "-fcall") }},
		{"ACL without FUNCTION", func(t *testing.T) *redis.Client { return redistest.ACLClient(t, "-function") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, lib, names := libraryStore(t, c.client(t))
			for i := range 3 {
				d, err := s.Allow(ctx, decision("k", perHour(10)))
				if err != nil || d.States[0].Remaining != int64(9-i) {
					t.Fatalf("decision %d: %+v %v", i, d, err)
				}
				if i == 0 {
					waitLibrary(t, lib)
				}
			}
			if st := lib.state.Load(); st != libraryUnusable {
				t.Fatalf("the library's state is %d, want unusable", st)
			}
			fcalls := 0
			for _, n := range names.take() {
				if n == "fcall" {
					fcalls++
				}
			}
			if fcalls > 1 { // the one an ACL refuses, at most
				t.Fatalf("%d FCALLs sent", fcalls)
			}
		})
	}
}

// libraryStore returns a store on rdb, its library, and a hook that
// records the script commands rdb sends.
func libraryStore(t *testing.T, rdb redis.UniversalClient) (*Store, *library, scriptNames) {
	t.Helper()
	names := newScriptNames()
	rdb.AddHook(names)
	// no timeout: every call goes through rdb and its hooks (a lone call
	// bounded by a timeout goes by rdb's clone, which runs no hooks)
	s := New(rdb, uniquePrefix(t))
	hookClones(s, names)
	return s, s.t.lib, names
}

// TestLibrarySpecs checks the spec a lone call keeps from call to call in
// the loaded library (read_spec converts its arguments only when they
// changed): decisions that alternate between limits, a Peek and a
// decision on two limits each get their own limits' answers.
func TestLibrarySpecs(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	s, lib, names := libraryStore(t, rdb)
	if _, err := s.Allow(ctx, decision("load", perHour(1))); err != nil {
		t.Fatal(err)
	}
	if st := waitLibrary(t, lib); st != libraryLoaded {
		t.Fatalf("the library's state is %d after its load, want loaded", st)
	}
	names.take()
	three, five, fiveMinute := perHour(3), perHour(5), per(5, time.Minute)
	for i := range int64(7) {
		steps := []struct {
			name    string
			r       store.Request
			allowed bool
			left    []int64 // remaining under each limit
		}{
			{"three", decision("a", three), i < 3, []int64{max(2-i, 0)}},
			{"five", decision("b", five), i < 5, []int64{max(4-i, 0)}},
			// one unit more would fit while any is left; nothing recorded
			{"peek three", peek("a", three), i < 2, []int64{max(2-i, 0)}},
			{"both", decision("c", three, fiveMinute), i < 3, []int64{max(2-i, 0), 4 - min(i, 2)}},
		}
		for _, step := range steps {
			d, err := s.Allow(ctx, step.r)
			if err != nil || d.Allowed != step.allowed || !slices.Equal(remainings(d, len(step.left)), step.left) {
				t.Fatalf("decision %d, %s: %+v %v; want allowed %v, %v remaining", i, step.name, d, err, step.allowed, step.left)
			}
		}
	}
	for _, n := range names.take() {
		if n != "fcall" {
			t.Fatalf("a decision went as %s; want every one as FCALL (the library's spec kept)", n)
		}
	}
}

// remainings returns the units remaining under each of the n limits of d.
func remainings(d store.Decision, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = d.States[i].Remaining
	}
	return out
}
