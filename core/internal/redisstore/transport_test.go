package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// patient is the timeout of tests that expect Redis to answer: long enough
// for a loaded CI machine, where a loopback call may take over 100ms.
const patient = 2 * time.Second

// isScriptCall reports whether cmd runs a script: EVALSHA, EVAL or FCALL.
func isScriptCall(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval" || n == "fcall"
}

// One batch of decisions on many keys, with three on one key: every
// decision exact, on a single server (one merged script call) and on a
// Cluster (one after another: a Cluster merges only the decisions on one
// key, see TestClusterMergesHotKey), before and after the server forgets its scripts.
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
			s := New(cl.rdb, uniquePrefix(t))
			for round := range 2 {
				if round == 1 && cl.flush != nil {
					if err := cl.flush(); err != nil { // NOSCRIPT: sent again as EVAL
						t.Fatal(err)
					}
				}
				var rs []store.Request
				for i := range 8 {
					rs = append(rs, decision(fmt.Sprintf("k%d-%d", round, i), perMinute(3)))
				}
				for range 4 {
					rs = append(rs, decision(fmt.Sprintf("hot-%d", round), perMinute(3)))
				}
				send := allowBatch
				if cl.flush == nil { // a Cluster merges only one key's
					send = allowEach
				}
				for i, o := range send(s, rs) {
					wantRemaining := int64(2)
					if i >= 8 {
						wantRemaining = max(2-int64(i-8), 0)
					}
					if o.err != nil || o.d.Allowed != (i < 11) || o.d.States[0].Remaining != wantRemaining {
						t.Fatalf("round %d call %d: %+v %v", round, i, o.d, o.err)
					}
				}
			}
		})
	}
}

// A merged script call in which decisions fail (their key holds another
// type) answers those callers with Redis's error, and the others as usual:
// read as []any (EVALSHA) and as []int64 (FCALL, the library loaded). The
// failed decisions go again alone, for Redis's own error.
func TestTransportMergedError(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	names := newScriptNames()
	rdb.AddHook(names)
	s := New(rdb, uniquePrefix(t))
	lim := perMinute(30)
	for _, key := range []string{"bad", "worse"} {
		bad := storageKey(keyTag(s.prefix, key), lim)
		if err := rdb.Set(context.Background(), bad, "not a sliding log", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, sc := range []*script{s.allowS, s.allowBatchS} {
		if err := sc.Load(ctx, rdb).Err(); err != nil {
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
		rs := make([]store.Request, len(keys))
		for i, k := range keys {
			rs[i] = decision(k, lim)
		}
		names.take()
		ints := names.ints.Load()
		for i, o := range allowBatch(s, rs) {
			if k := keys[i]; k == "bad" || k == "worse" {
				if o.err == nil || !strings.Contains(o.err.Error(), "WRONGTYPE") || !store.Replied(o.err) {
					t.Fatalf("%s: call %d (%s): %v, want WRONGTYPE, an answer of the server", phase, i, k, o.err)
				}
				continue
			}
			if o.err != nil || !o.d.Allowed || o.d.States[0].Remaining != 29 {
				t.Fatalf("%s: call %d (%s): %+v %v", phase, i, keys[i], o.d, o.err)
			}
		}
		// FCALL's replies are read as integers (evalsha: as []any)
		if got := names.ints.Load() - ints; (phase == "fcall") != (got > 0) {
			t.Fatalf("%s: %d calls read as []int64", phase, got)
		}
		for _, k := range []string{"a", "b", "c"} { // the next phase decides them anew
			if err := s.Reset(ctx, decision(k, lim)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Concurrent decisions on a single server and on a Cluster: every
// decision exact.
func TestTransportConcurrent(t *testing.T) {
	for _, c := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"single", func(t *testing.T) redis.UniversalClient { return redistest.New(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.NewCluster(t).Client(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			const timeout = 10 * time.Second
			s := New(c.rdb(t), uniquePrefix(t))
			ctx := context.Background()
			lim := perHour(40)
			if d, err := s.Allow(ctx, within(decision("lone", lim), timeout)); err != nil || !d.Allowed || d.States[0].Remaining != 39 {
				t.Fatalf("lone call: %+v %v", d, err)
			}
			const goroutines, each, keys = 64, 10, 8
			admitted := make([]atomic.Int64, keys)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						k := (g + i) % keys
						d, err := s.Allow(ctx, within(decision(fmt.Sprint("key-", k), lim), timeout))
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted[k].Add(1)
						}
					}
				})
			}
			wg.Wait()
			for k := range admitted {
				if n := admitted[k].Load(); n != 40 {
					t.Errorf("key %d: %d admitted, want exactly 40", k, n)
				}
			}
		})
	}
}

// TestTransportKeepsDeadline: with a server that accepts connections and
// never answers, every call returns by its deadline, with every client type
// and whichever way it is sent: concurrent decisions (some alone, some
// queued) end by their Request's Within (the Limiter's timeout), and with
// a later Within, by the caller's own deadline; no reply came, and the
// error says so (a deadline's, not an answer of the server).
func TestTransportKeepsDeadline(t *testing.T) {
	t.Parallel()
	addr := redistest.Silent(t)
	clients := []struct {
		name string
		new  func() redis.UniversalClient
	}{
		{"client", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr}) }},
		{"client/ContextTimeoutEnabled", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		}},
		{"cluster", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
		}},
		{"ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
		}},
		{"failover", func() redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{addr}})
		}},
	}
	const (
		timeout  = 100 * time.Millisecond
		deadline = 50 * time.Millisecond
		margin   = 250 * time.Millisecond
		callers  = 3 * maxInFlight
	)
	for _, c := range clients {
		for _, callerDeadline := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/caller deadline %v", c.name, callerDeadline), func(t *testing.T) {
				t.Parallel()
				rdb := c.new()
				t.Cleanup(func() { go rdb.Close() })
				storeTimeout, bound := timeout, timeout+margin
				if callerDeadline {
					storeTimeout, bound = time.Minute, deadline+margin
				}
				s := New(rdb, uniquePrefix(t))
				stalls := stall.Start(t)
				var wg sync.WaitGroup
				for i := range callers {
					wg.Go(func() {
						ctx := context.Background()
						if callerDeadline {
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, deadline)
							defer cancel()
						}
						start := time.Now()
						d, err := s.Allow(ctx, within(decision(fmt.Sprint("k", i), perMinute(4)), storeTimeout))
						beyond(t, stalls, time.Since(start), bound, fmt.Sprintf("decision %d", i))
						if err == nil || !store.IsTimeout(err) || store.Replied(err) {
							t.Errorf("decision %d: %+v %v, want a deadline's error", i, d, err)
						}
					})
				}
				wg.Wait()
			})
		}
	}
}

// TestTransportRepliesAfterPause: decisions sent while the server is
// paused (CLIENT PAUSE), alone and queued, get their replies when it
// resumes, within a timeout longer than the pause: every decision exact.
func TestTransportRepliesAfterPause(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 5 * time.Second
	s := New(srv.Client(t), uniquePrefix(t))
	ctx := context.Background()
	lim := perHour(20)
	if _, err := s.Allow(ctx, within(peek("warm", lim), timeout)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", "300", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	const callers = 32 // more than the limit, and than maxInFlight
	for range callers {
		wg.Go(func() {
			d, err := s.Allow(ctx, within(decision("k", lim), timeout))
			if err != nil {
				t.Errorf("%+v %v", d, err)
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 20 {
		t.Fatalf("%d admitted of %d, want 20", n, callers)
	}
}

// TestTransportAbandonedNotCharged: a queued decision whose caller leaves
// before its batch is sent is not sent: the key holds none of its units.
func TestTransportAbandonedNotCharged(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(t), uniquePrefix(t))
	ctx := context.Background()
	lim := perMinute(3)
	if _, err := s.Allow(ctx, peek("warm", lim)); err != nil {
		t.Fatal(err)
	}
	release := holdSends(s) // every slot taken: calls queue
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	out := queueAllow(dctx, s, decision("b", lim))
	if o := <-out; !errors.Is(o.err, context.DeadlineExceeded) {
		t.Fatalf("queued call: %v, want the deadline", o.err)
	}
	release()
	sendQueued(s) // as a flusher would, after its caller left
	if d, err := s.Allow(ctx, peek("b", lim)); err != nil || d.States[0].Remaining != 3 {
		t.Fatalf("peek of the abandoned key: %+v %v, want 3 remaining: nothing recorded", d.States[0], err)
	}
}

// TestRedisAnsweredErrorsStayWithTheirKey: errors that Redis answered for
// one key (NOPERM from an ACL that forbids its keys; a script error on a
// key that holds another type) are that key's decisions' failures, and the
// store says they are answers of the server (Replied), which the
// Limiter's guard never counts against Redis; every other key is decided
// by Redis meanwhile.
func TestRedisAnsweredErrorsStayWithTheirKey(t *testing.T) {
	t.Parallel()
	prefix := "acl:"
	lim := perMinute(100)
	for _, c := range []struct {
		name string
		rdb  func(t *testing.T) *redis.Client
		want string
	}{
		{"NOPERM", func(t *testing.T) *redis.Client {
			return redistest.ACLClient(t, "resetkeys", "~"+prefix+"{ok*")
		}, "NOPERM"},
		{"script error", func(t *testing.T) *redis.Client {
			rdb := redistest.Start(t).Client(t)
			if err := rdb.Set(context.Background(), storageKey(keyTag(prefix, "bad"), lim), "a string", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			return rdb
		}, "WRONGTYPE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := New(c.rdb(t), prefix)
			ctx := context.Background()
			const tries = 12       // four times the Limiter's breakerFailures
			for i := range tries { // one after the other
				d, err := s.Allow(ctx, within(decision("bad", lim), patient))
				if err == nil || !strings.Contains(err.Error(), c.want) || !store.Replied(err) {
					t.Fatalf("bad key, decision %d: %+v %v, want %s, an answer of the server", i, d, err, c.want)
				}
			}
			for i := range tries {
				d, err := s.Allow(ctx, within(decision(fmt.Sprint("ok", i), lim), patient))
				if err != nil || !d.Allowed || d.States[0].Remaining != 99 {
					t.Fatalf("another key, decision %d: %+v %v, want Redis's answer", i, d, err)
				}
			}
			// at once, so that decisions of both kinds are merged into one
			// call (a NOPERM refuses a whole call): still each key's own
			var allowed [4]atomic.Int64
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					key := "bad"
					if g < 4 {
						key = fmt.Sprint("ok-together-", g)
					}
					for range 300 {
						d, err := s.Allow(ctx, within(decision(key, lim), patient))
						switch {
						case g >= 4 && (err == nil || !strings.Contains(err.Error(), c.want)):
							t.Errorf("bad key: %+v %v, want %s", d, err, c.want)
						case g < 4 && err != nil:
							t.Errorf("%s, decided beside the bad key: %v", key, err)
						case g < 4 && d.Allowed:
							allowed[g].Add(1)
						}
					}
				})
			}
			wg.Wait()
			for g := range allowed {
				if n := allowed[g].Load(); n != 100 {
					t.Errorf("ok-together-%d: %d of 300 allowed, want the limit's 100", g, n)
				}
			}
		})
	}
}

// TestRemoteAnswers: what a call's outcome says about Redis (store.Remote,
// which the Limiter's guard reads). An error reply of the server, however
// wrapped, and a reply the scripts never send are answers (Replied); a
// deadline, the caller leaving and a network error are not. Redis answered
// this client since a call was sent (AnsweredSince) when a reply or an
// error reply came after it; not when the call got none, whether Redis
// answered before (a paused server) or never (a silent one).
func TestRemoteAnswers(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	serverErr := rdb.Do(ctx, "NOSUCHCOMMAND").Err()
	if serverErr == nil {
		t.Fatal("NOSUCHCOMMAND: no error")
	}
	s := New(rdb, uniquePrefix(t))
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"no error", nil, false},
		{"error reply", serverErr, true},
		{"wrapped error reply", fmt.Errorf("script: %w", serverErr), true},
		{"explained refusal", explainRefusal(serverErr), true},
		{"unexpected reply", fmt.Errorf("%w: allow returned int64", store.ErrUnexpectedReply), true},
		{"caller gone", context.Canceled, false},
		{"timeout", context.DeadlineExceeded, false},
		{"read timeout", fmt.Errorf("read: %w", os.ErrDeadlineExceeded), false},
		{"network", errors.New("connection refused"), false},
	} {
		if got := replied(c.err); got != c.want {
			t.Errorf("%s: Replied(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}

	lim := perMinute(5)
	if _, err := s.Allow(ctx, decision("k", lim)); err != nil {
		t.Fatalf("a reply: %v", err)
	}
	if err := rdb.Set(ctx, storageKey(keyTag(s.prefix, "bad"), lim), "a string", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Allow(ctx, decision("bad", lim)); !store.Replied(err) {
		t.Fatalf("an error reply: %v", err)
	}
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Client(t).Do(context.Background(), "CLIENT", "UNPAUSE") })
	if _, err := s.Allow(ctx, within(decision("k", lim), 50*time.Millisecond)); !store.IsTimeout(err) || store.Replied(err) {
		t.Fatalf("no reply from a paused server: %v", err)
	}
	silent := New(redis.NewClient(&redis.Options{Addr: redistest.Silent(t)}), uniquePrefix(t))
	if _, err := silent.Allow(ctx, within(decision("k", lim), 50*time.Millisecond)); !store.IsTimeout(err) || store.Replied(err) {
		t.Fatalf("no reply from a silent server: %v", err)
	}
}

// TestRemoteExplainsFailedDial: a call whose connection is refused fails
// without a reply, and the store explains its later failures with that
// dial's error (a health check's finding).
func TestRemoteExplainsFailedDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	s := New(rdb, uniquePrefix(t))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err = s.Allow(context.Background(), within(decision("k", perMinute(1)), patient))
		var se *store.Error
		if !errors.As(err, &se) || se.Replied {
			t.Fatalf("a refused connection: %v, want a *store.Error without a reply", err)
		}
		if n := strings.Count(err.Error(), "refused"); n > 1 {
			t.Fatalf("%v: the refused dial told %d times", err, n)
		} else if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v, want the refused dial", err)
		}
	}
}

// settledCluster returns a client of the test binary's cluster once a
// decision on keys of every master succeeds quickly (right after the
// cluster is created, the nodes may still disagree for a moment, which is
// not what these tests are about).
func settledCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	cc := redistest.NewCluster(t).Client(t)
	s := New(cc, uniquePrefix(t))
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 30; i++ {
		start := time.Now()
		_, err := s.Allow(ctx, within(decision(fmt.Sprint("settle-", i), perSecond(1)), 5*time.Second))
		if d := time.Since(start); err != nil || d > 50*time.Millisecond {
			if time.Now().After(deadline) {
				t.Fatalf("the cluster does not settle: %v after %v", err, d)
			}
			i = -1 // again, from the first key
			time.Sleep(20 * time.Millisecond)
		}
	}
	return cc
}

// TestClusterNodePerMaster: one master stops answering (CLIENT PAUSE). The
// store names each key's master (Node), so that the Limiter's guard can
// tell the paused one's failures from the others: decisions on its keys
// end at their deadline, without a reply; keys on the other masters are
// decided by Redis all along.
func TestClusterNodePerMaster(t *testing.T) {
	cc := settledCluster(t)
	prefix := uniquePrefix(t)
	const timeout = 100 * time.Millisecond
	s := New(cc, prefix)
	ctx := context.Background()
	lim := perMinute(1000)
	paused, err := cc.MasterForKey(ctx, storageKey(keyTag(prefix, "k"), lim))
	if err != nil {
		t.Fatal(err)
	}
	var elsewhere []string // keys of the other masters
	for i := 0; len(elsewhere) < 20; i++ {
		key := fmt.Sprint("other-", i)
		m, err := cc.MasterForKey(ctx, storageKey(keyTag(prefix, key), lim))
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr != paused.Options().Addr {
			elsewhere = append(elsewhere, key)
		}
	}
	for _, key := range append([]string{"k"}, elsewhere...) { // every master has answered
		if _, err := s.Allow(ctx, within(decision(key, lim), patient)); err != nil {
			t.Fatalf("%s before the pause: %v", key, err)
		}
	}
	if n := s.Node("k"); n != paused.Options().Addr {
		t.Fatalf("Node(k) = %q, want the master %s", n, paused.Options().Addr)
	}
	for _, key := range elsewhere {
		if n := s.Node(key); n == "" || n == paused.Options().Addr {
			t.Fatalf("Node(%s) = %q, want another master than %s", key, n, paused.Options().Addr)
		}
	}
	if err := paused.Do(ctx, "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { paused.Do(context.Background(), "CLIENT", "UNPAUSE") })
	// the other masters keep answering meanwhile
	stop, busy := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				busy <- nil
				return
			default:
			}
			if _, err := s.Allow(ctx, within(decision(elsewhere[i%len(elsewhere)], perHour(1_000_000)), patient)); err != nil {
				busy <- fmt.Errorf("another master during the pause: %v", err)
				return
			}
		}
	}()
	stalls := stall.Start(t)
	for i := range 6 { // twice the Limiter's breakerFailures
		start := time.Now()
		_, err := s.Allow(ctx, within(decision("k", lim), timeout))
		beyond(t, stalls, time.Since(start), timeout+250*time.Millisecond, fmt.Sprintf("decision %d on the paused master", i))
		if !store.IsTimeout(err) || store.Replied(err) {
			t.Fatalf("decision %d on the paused master: %v, want its deadline's error", i, err)
		}
	}
	close(stop)
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	for _, key := range elsewhere {
		if d, err := s.Allow(ctx, within(decision(key, lim), patient)); err != nil || !d.Allowed || d.States[0].Remaining != 998 {
			t.Fatalf("%s on another master: %+v %v, want Redis's answer", key, d, err)
		}
	}
}

// scripterOnly is a redis.Scripter of none of go-redis's client types (New
// takes any): it has no pipelines.
type scripterOnly struct{ redis.Scripter }

// TestOtherScripterBatches: on a Scripter of another type, a batch of
// several commands (decisions and blocks queued together) goes command by
// command: every call answered, no panic in a flusher (it called the nil
// pipe and crashed the process).
func TestOtherScripterBatches(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	s := New(scripterOnly{rdb}, uniquePrefix(t))
	ctx := context.Background()
	lim := perMinute(1000000)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				var err error
				if (g+i)%2 == 0 {
					_, err = s.Allow(ctx, decision("k", lim))
				} else {
					err = s.Block(ctx, store.Request{Key: "b"}, time.Millisecond)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// On a Cluster, the decisions on one hot key queue behind the one in
// flight and go to its master merged (allow_batch): every decision exact,
// in fewer script calls than decisions.
func TestClusterMergesHotKey(t *testing.T) {
	cl := redistest.NewCluster(t)
	s := New(cl.Client(t), uniquePrefix(t))
	ctx := context.Background()
	masters := make([]*redis.Client, len(cl.Addrs))
	for i, addr := range cl.Addrs {
		masters[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer masters[i].Close()
		if err := masters[i].ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	const goroutines, each, limit = 64, 20, 500
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				d, err := s.Allow(ctx, within(decision("hot", perHour(limit)), patient))
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != limit {
		t.Errorf("%d admitted, want exactly %d", n, limit)
	}
	calls := 0
	for _, m := range masters {
		info, err := m.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			for _, cmd := range []string{"cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"} {
				if rest, ok := strings.CutPrefix(line, cmd+"calls="); ok {
					var n int
					fmt.Sscanf(rest, "%d", &n)
					calls += n
				}
			}
		}
	}
	if decisions := goroutines * each; calls == 0 || calls >= decisions {
		t.Errorf("%d script calls for %d decisions on one key: want merged calls, fewer than the decisions", calls, decisions)
	}
	t.Logf("%d script calls for %d decisions", calls, goroutines*each)
}

// pipelineHook records the pipelines a client sends: their sizes, and how
// many held keys of more than one node (node: the address serving a key).
type pipelineHook struct {
	node           func(key string) string
	pipelines      atomic.Int64
	commands       atomic.Int64
	mixed, largest atomic.Int64
}

func (h *pipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, isScriptCall) { // a node's connection set up (HELLO, CLIENT SETINFO)
			return next(ctx, cmds)
		}
		nodes := map[string]bool{}
		for _, cmd := range cmds {
			nodes[h.node(fmt.Sprint(cmd.Args()[3]))] = true
		}
		if len(nodes) > 1 {
			h.mixed.Add(1)
		}
		h.pipelines.Add(1)
		h.commands.Add(int64(len(cmds)))
		for n := int64(len(cmds)); ; {
			l := h.largest.Load()
			if n <= l || h.largest.CompareAndSwap(l, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// On a Cluster or Ring the decisions queued behind one in flight to a node
// (a master, a shard) go to that node in one pipeline, and only to it: many
// goroutines deciding on many keys send pipelines of several calls, none
// holding another node's keys (whose slowness would hold this one's
// replies), and every decision is exact.
func TestPipelinesPerNode(t *testing.T) {
	cc := settledCluster(t)
	p1, p2 := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": p1.Addr, "b": p2.Addr}})
	defer ring.Close()
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
		node func(key string) string
	}{
		{"cluster", cc, func(key string) string {
			m, err := cc.MasterForKey(context.Background(), key)
			if err != nil {
				return err.Error()
			}
			return m.Options().Addr
		}},
		{"ring", ring, func(key string) string {
			shard, err := ring.GetShardClientForKey(key)
			if err != nil {
				return err.Error()
			}
			return shard.Options().Addr
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &pipelineHook{node: tc.node}
			if ring, ok := tc.rdb.(*redis.Ring); ok { // its queued calls go through its shards' clients
				for _, shard := range ring.GetShardClients() {
					shard.AddHook(h)
				}
			} else {
				tc.rdb.AddHook(h)
			}
			s := New(tc.rdb, uniquePrefix(t))
			ctx := context.Background()
			const goroutines, keys = 64, 3000
			var admitted, denied atomic.Int64
			var next atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for i := next.Add(1) - 1; i < 2*keys; i = next.Add(1) - 1 {
						d, err := s.Allow(ctx, within(decision(fmt.Sprint("user:", i%keys), perHour(1)), patient))
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
						} else {
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if a, d := admitted.Load(), denied.Load(); a != keys || d != keys {
				t.Errorf("%d admitted and %d denied, want %d each (one a key)", a, d, keys)
			}
			if h.largest.Load() < 2 {
				t.Errorf("the largest pipeline held %d calls: want the queued decisions sent together", h.largest.Load())
			}
			if m := h.mixed.Load(); m != 0 {
				t.Errorf("%d of %d pipelines held keys of more than one node", m, h.pipelines.Load())
			}
			t.Logf("%d pipelines of %d calls, the largest %d", h.pipelines.Load(), h.commands.Load(), h.largest.Load())
		})
	}
}

// TestPingJudgesItsNode: on a Cluster, the health check of a key's paused
// master finds it silent; another master's answers.
func TestPingJudgesItsNode(t *testing.T) {
	cl := redistest.NewCluster(t)
	rdb := cl.Client(t)
	s := New(rdb, "late:")
	ctx := context.Background()
	lim := perMinute(100)
	if _, err := s.Allow(ctx, decision("k", lim)); err != nil { // the slot map
		t.Fatal(err)
	}
	node := s.Node("k")
	otherKey := ""
	for i := 0; otherKey == "" || s.Node(otherKey) == node; i++ {
		otherKey = fmt.Sprint("other-", i)
	}
	pause := redis.NewClient(&redis.Options{Addr: node})
	t.Cleanup(func() { pause.Close() })
	if err := pause.Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx, "k", 100*time.Millisecond); !errors.Is(err, store.ErrSilent) {
		t.Fatalf("the paused master's health check: %v, want ErrSilent", err)
	}
	if err := s.Ping(ctx, otherKey, time.Second); err != nil {
		t.Fatalf("another master's health check: %v", err)
	}
}

// TestPing: a health check's PING is answered by a server, silent on a
// server that accepts and never answers, and fails at once, no timeout,
// on a refused connection.
func TestPing(t *testing.T) {
	ctx := context.Background()
	s := New(redistest.Start(t).Client(t), "ping:")
	if err := s.Ping(ctx, "k", time.Second); err != nil {
		t.Fatalf("a server: %v", err)
	}
	silent := New(redis.NewClient(&redis.Options{Addr: redistest.Silent(t)}), "ping:")
	start := time.Now()
	if err := silent.Ping(ctx, "k", 50*time.Millisecond); !errors.Is(err, store.ErrSilent) || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("a silent server: %v after %v, want ErrSilent after 50ms", err, time.Since(start))
	}
	refused := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "ping:")
	if err := refused.Ping(ctx, "k", time.Second); err == nil || store.IsTimeout(err) || errors.Is(err, store.ErrSilent) || store.Replied(err) {
		t.Fatalf("a refused connection: %v, want its failure", err)
	}
}

// TestPendingSeesUnreadReply: a reply that arrived while this process did
// not read (a stall past the health check's deadline) is found in the
// socket; none is found on a silent server, and a closed connection says so.
func TestPendingSeesUnreadReply(t *testing.T) {
	for _, c := range []struct {
		name string
		addr string
		want bool
	}{{"server", redistest.Start(t).Addr, true}, {"silent", redistest.Silent(t), false}} {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Second)
		got, err := pending(conn)
		for ; !got && err == nil && c.want && time.Now().Before(deadline); got, err = pending(conn) {
			time.Sleep(10 * time.Millisecond) // the reply on its way, unread
		}
		if err != nil || got != c.want {
			t.Errorf("%s: pending %v, %v; want %v", c.name, got, err, c.want)
		}
		conn.Close()
	}
	a, b := net.Pipe() // no socket: nothing can tell
	defer a.Close()
	defer b.Close()
	if _, err := pending(a); !errors.Is(err, errNoPeek) {
		t.Errorf("a pipe: %v, want errNoPeek", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(2 * time.Second)
	_, err = pending(conn)
	for ; err == nil && time.Now().Before(deadline); _, err = pending(conn) {
		time.Sleep(10 * time.Millisecond)
	}
	if !errors.Is(err, io.EOF) {
		t.Errorf("a closed connection: %v, want io.EOF", err)
	}
}

// A Ring closed while decisions are in flight (a service shutting down)
// fails the decisions sent after it, and nothing else: go-redis's Ring
// pipeline, run after Close, dereferenced its closed shard map on a
// goroutine of its own and crashed the process, so a Ring's queued calls go
// to their shard's client, which says it is closed.
func TestRingClosedWhileDeciding(t *testing.T) {
	p1, p2 := redistest.Start(t), redistest.Start(t)
	for round := range 5 {
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": p1.Addr, "b": p2.Addr}})
		s := New(ring, uniquePrefix(t))
		closed := make(chan struct{})
		var after, failed atomic.Int64
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-closed:
						if after.Add(1) > 2000 {
							return
						}
					default:
					}
					_, err := s.Allow(context.Background(), within(decision(fmt.Sprint("user:", (g*31+i)%200), perHour(1000)), patient))
					if err != nil {
						failed.Add(1)
					}
				}
			})
		}
		time.Sleep(50 * time.Millisecond)
		if err := ring.Close(); err != nil {
			t.Fatalf("round %d: closing the ring: %v", round, err)
		}
		close(closed)
		wg.Wait()
		if failed.Load() == 0 {
			t.Errorf("round %d: no decision failed after the ring was closed", round)
		}
	}
}

// TestTransportBoundsPoolWait: a call sent alone ends at its deadline, or
// at its caller's end, while it waits for a connection of a full pool (the
// one connection held by a BLPOP); once the pool frees, the next decision
// is answered.
func TestTransportBoundsPoolWait(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1})
	t.Cleanup(func() { rdb.Close() })
	s := New(rdb, uniquePrefix(t))
	ctx := context.Background()
	if _, err := s.Allow(ctx, within(decision("warm", perMinute(3)), patient)); err != nil {
		t.Fatal(err)
	}
	const (
		timeout = 100 * time.Millisecond
		margin  = 250 * time.Millisecond
		held    = 2 * time.Second
	)
	blpop := make(chan error, 1)
	go func() { blpop <- rdb.BLPop(ctx, held, uniquePrefix(t)+"none").Err() }()
	time.Sleep(50 * time.Millisecond) // the BLPOP holds the one connection
	stalls := stall.Start(t)
	start := time.Now()
	_, err := s.Allow(ctx, within(decision("k", perMinute(3)), timeout))
	beyond(t, stalls, time.Since(start), timeout+margin, "the decision")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the decision at its deadline: %v, want %v", err, context.DeadlineExceeded)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	start = time.Now()
	_, err = s.Allow(cctx, within(decision("k", perMinute(3)), time.Minute))
	beyond(t, stalls, time.Since(start), 20*time.Millisecond+margin, "the cancelled decision")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled decision: %v, want %v", err, context.Canceled)
	}
	if err := <-blpop; !errors.Is(err, redis.Nil) {
		t.Fatalf("BLPOP: %v", err)
	}
	for i := range 3 {
		if d, err := s.Allow(ctx, within(decision("k", perMinute(3)), patient)); err != nil || !d.Allowed {
			t.Fatalf("decision %d once the pool is free: %+v %v", i, d, err)
		}
	}
}

// TestTransportDeadlineNoAllocs: a deadline costs a decision sent alone no
// allocation (its context is kept with the pooled call; context.WithDeadline
// made 5). Up to 2 are let pass: under the race detector sync.Pool drops a
// call now and then, and a new call makes its context anew.
func TestTransportDeadlineNoAllocs(t *testing.T) {
	s := New(redistest.Start(t).Client(t), uniquePrefix(t))
	ctx := context.Background()
	lim := with(perMinute(1<<30), store.SlidingCounter)
	allocs := func(deadline bool) float64 {
		return testing.AllocsPerRun(200, func() {
			r := decision("k", lim)
			if deadline {
				r = within(r, time.Minute)
			}
			if _, err := s.Allow(ctx, r); err != nil {
				t.Fatal(err)
			}
		})
	}
	without, with := allocs(false), allocs(true)
	if with > without+2 {
		t.Errorf("%v allocations a decision with a deadline, %v without", with, without)
	}
}

// TestBounded: a bounded context ends at its limit (DeadlineExceeded) or
// at its parent's end (the parent's error), as context.WithDeadline's
// does, and serves call after call while it has not ended.
func TestBounded(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	b := newBounded()
	for i := range 3 {
		ctx := b.start(parent, time.Now().Add(time.Minute))
		if ctx.Err() != nil || ctx.Value(key{}) != "v" {
			t.Fatalf("use %d: %v %v", i, ctx.Err(), ctx.Value(key{}))
		}
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < 50*time.Second {
			t.Fatalf("use %d: deadline %v %v", i, dl, ok)
		}
		if !b.stop() {
			t.Fatalf("use %d: stopped as ended", i)
		}
	}
	ctx := b.start(parent, time.Now().Add(10*time.Millisecond))
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || b.stop() {
		t.Fatalf("at the limit: %v", ctx.Err())
	}
	cparent, cancel := context.WithCancel(parent)
	b = newBounded()
	ctx = b.start(cparent, time.Now().Add(time.Minute))
	cancel()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) || b.stop() {
		t.Fatalf("at the parent's end: %v", ctx.Err())
	}
}

// TestTransportBoundedReuse: decisions with deadlines from many goroutines,
// some alone and some queued, each with a context of its own: every one
// answered, and (under the race detector) no call's context is touched by
// the caller that used its pooled call before.
func TestTransportBoundedReuse(t *testing.T) {
	s := New(redistest.Start(t).Client(t), uniquePrefix(t))
	lim := with(perMinute(1<<30), store.SlidingCounter)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				d, err := s.Allow(ctx, within(decision(fmt.Sprint("k", g, "-", i%7), lim), patient))
				cancel()
				if err != nil || !d.Allowed {
					t.Errorf("goroutine %d decision %d: %+v %v", g, i, d, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
