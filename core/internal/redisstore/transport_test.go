package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// hookClones adds h to the client clones of l's transport, which run
// none of the client's hooks: a test's hook on the client then sees every
// call of l.
func hookClones(l *Limiter, h redis.Hook) {
	for _, cl := range l.store.(*redisStore).t.clones {
		cl.c.AddHook(h)
	}
}

// isScriptCall reports whether cmd runs a script: EVALSHA, EVAL or FCALL.
func isScriptCall(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval" || n == "fcall"
}

// answeredScript reports whether cmd is a script call that ran (not one
// answered NOSCRIPT, which is sent again).
func answeredScript(cmd redis.Cmder, err error) bool {
	return isScriptCall(cmd) && !redis.HasErrorPrefix(err, "NOSCRIPT") && !functionMissing(err)
}

// allowCallFor builds the transport call of one Allow of key on limits.
func allowCallFor(s *redisStore, key string, limits ...Limit) *call {
	c := s.allowCall(&query{key: key, n: 1, limits: limits, commit: true})
	c.ctx = context.Background()
	return c
}

// sendAll sends calls as one batch and returns each caller's outcome.
func sendAll(s *redisStore, calls []*call) ([]Result, []error) {
	s.t.send(calls)
	rs, errs := make([]Result, len(calls)), make([]error, len(calls))
	for i, c := range calls {
		<-c.done
		errs[i] = c.err
		if c.err == nil {
			q := &query{limits: []Limit{PerMinute(3)}}
			if errs[i] = parseAllow(c.reply, q); errs[i] == nil {
				rs[i] = q.result()
			}
		}
	}
	return rs, errs
}

// One batch of decisions on many keys, with three on one key: every
// decision exact, on a single server (one merged script call) and on a
// Cluster (a pipeline that go-redis splits per node), before and after the
// server forgets its scripts.
func TestTransportSend(t *testing.T) {
	single := redistest.Start(t)
	clients := []struct {
		name  string
		rdb   redis.Scripter
		flush func() error
	}{
		{"single", single.Client(t), func() error { return single.Client(t).ScriptFlush(context.Background()).Err() }},
		{"cluster", redistest.NewCluster(t).Client(t), nil},
	}
	for _, cl := range clients {
		t.Run(cl.name, func(t *testing.T) {
			s := newRedisStore(cl.rdb, uniquePrefix(t), 0)
			for round := range 2 {
				if round == 1 && cl.flush != nil {
					if err := cl.flush(); err != nil { // NOSCRIPT: sent again as EVAL
						t.Fatal(err)
					}
				}
				var calls []*call
				for i := range 8 {
					calls = append(calls, allowCallFor(s, fmt.Sprintf("k%d-%d", round, i), PerMinute(3)))
				}
				for range 4 {
					calls = append(calls, allowCallFor(s, fmt.Sprintf("hot-%d", round), PerMinute(3)))
				}
				rs, errs := sendAll(s, calls)
				for i := range calls {
					wantRemaining := int64(2)
					if i >= 8 {
						wantRemaining = max(2-int64(i-8), 0)
					}
					if errs[i] != nil || rs[i].Allowed != (i < 11) || rs[i].Remaining != wantRemaining {
						t.Fatalf("round %d call %d: %+v %v", round, i, rs[i], errs[i])
					}
				}
			}
		})
	}
}

// A merged script call in which decisions fail (their key holds another
// type) answers those callers with Redis's error, and the others as usual:
// read as []any (EVALSHA) and as []int64 (FCALL, the library loaded). The
// failed decisions go again alone, one round trip for a run of them on
// one key.
func TestTransportMergedError(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	names := newScriptNames()
	rdb.AddHook(names)
	s := newRedisStore(rdb, uniquePrefix(t), 0)
	lim := PerMinute(30)
	for _, key := range []string{"bad", "worse"} {
		bad := storageKey(keyTag(s.prefix, key), lim)
		if err := rdb.Set(context.Background(), bad, "not a sliding log", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, sc := range []*script{s.allowS, s.allowBatchS} {
		if err := rdb.ScriptLoad(ctx, sc.src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s.t.lib.state.Store(libraryUnusable) // EVALSHA, as without functions
	for _, phase := range []string{"evalsha", "fcall"} {
		if phase == "fcall" {
			s.t.lib.state.Store(libraryUnloaded)
			s.t.lib.usable() // starts the load
			if st := waitLibrary(t, s.t.lib); st != libraryLoaded {
				t.Fatalf("the library's state is %d, want loaded", st)
			}
		}
		keys := []string{"a", "bad", "bad", "bad", "b", "worse", "c"}
		calls := make([]*call, len(keys))
		for i, k := range keys {
			calls[i] = allowCallFor(s, k, lim)
		}
		names.take()
		ints := names.ints.Load()
		rs, errs := sendAll(s, calls)
		for i, k := range keys {
			if strings.HasPrefix(k, "bad") || k == "worse" {
				if errs[i] == nil || !strings.Contains(errs[i].Error(), "WRONGTYPE") {
					t.Fatalf("%s: call %d (%s): %v, want WRONGTYPE", phase, i, k, errs[i])
				}
				continue
			}
			if errs[i] != nil || !rs[i].Allowed {
				t.Fatalf("%s: call %d (%s): %+v %v", phase, i, k, rs[i], errs[i])
			}
		}
		// the merged call, then one decision of the bad run and the worse
		// one, alone
		if got := strings.Join(names.take(), " "); got != phase+" "+phase+" "+phase {
			t.Fatalf("%s: sent %q, want the merged call and two alone", phase, got)
		}
		if got, want := names.ints.Load()-ints, map[string]int64{"evalsha": 0, "fcall": 3}[phase]; got != want {
			t.Fatalf("%s: %d calls read as []int64, want %d", phase, got, want)
		}
	}
}

// TestTransportAbandonedNotCharged: a queued decision whose caller leaves
// before its batch is sent is not sent: the key holds none of its units.
func TestTransportAbandonedNotCharged(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := newRedisStore(rdb, uniquePrefix(t), 0)
	ctx := context.Background()
	lim := []Limit{PerMinute(3)}
	if err := s.allow(ctx, &query{key: "warm", n: 1, limits: lim}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", "500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, maxLone)
	for range maxLone { // in flight for the whole pause: every slot taken
		go func() { first <- s.allow(ctx, &query{key: "a", n: 1, limits: lim, commit: true}) }()
	}
	for { // set-up: wait until every slot is in flight
		s.t.mu.Lock()
		full := s.t.inflight == maxLone
		s.t.mu.Unlock()
		if full {
			break
		}
		time.Sleep(time.Millisecond)
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := s.allow(dctx, &query{key: "b", n: 1, limits: lim, commit: true}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued call: %v, want the deadline", err)
	}
	for range maxLone {
		if err := <-first; err != nil {
			t.Fatalf("a call in flight: %v", err)
		}
	}
	q := &query{key: "b", n: 1, limits: lim}
	if err := s.allow(ctx, q); err != nil || q.states[0].remaining != 3 {
		t.Fatalf("peek of the abandoned key: %+v %v, want 3 remaining: nothing recorded", q.states, err)
	}
}
