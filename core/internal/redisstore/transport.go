package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// transport sends one Limiter's script calls to Redis. A call that finds
// nothing queued and a free slot of the in-flight limit is sent at once, on
// its caller's goroutine (as rueidis does with an uncontended command): one
// goroutine's decisions pay no hand-off. Calls that find every slot taken
// are queued, and the caller waits for its reply or the end of its context,
// whichever comes first. When a round trip ends with calls queued, a
// goroutine sends them all at once (coalescing, see send): on a single
// server the decisions go as one allow_batch call, everything else beside
// them in one go-redis pipeline. Under load the batches grow by themselves,
// and each round trip serves many decisions.
//
// A call keeps its context's deadline with every client: a client with
// ContextTimeoutEnabled ends its reads at the deadline itself; a
// *redis.Client without it (the go-redis default, and a failover client)
// sends through its WithTimeout clone for the Limiter's timeouts, on the
// caller's goroutine; any other call (a caller's own deadline, a Cluster or
// Ring without ContextTimeoutEnabled) runs on a goroutine of its own when
// a slot is free, else is queued, and its caller stops waiting at the
// deadline either way. The transport adds no hook to the client.
type transport struct {
	rdb  redis.Scripter
	pipe func() redis.Pipeliner // nil: the client cannot pipeline
	// boundsReads: the client ends its reads at the context's deadline
	boundsReads bool
	// clones are a *redis.Client's WithTimeout clones (the same
	// connections; go-redis gives them none of the client's hooks), one per
	// timeout of the Limiter: a call whose deadline is that timeout is sent
	// through its clone, whose reads end then (see client)
	clones []clone
	lib    *library // runs the scripts as FCALL once loaded; nil: EVALSHA

	born      time.Time    // the origin of clock, on the monotonic clock
	lastReply atomic.Int64 // clock when Redis last answered (0: never)
	slowUntil atomic.Int64 // clock until which calls go through flushers
	pauses    bool         // a *redis.Client: slowUntil applies (see run)

	// health is the health check after a failure (see checkDial): a
	// dial of a *redis.Client's server as the client dials it, a PING of
	// another client (Cluster, Ring); nil: none. A call's own error does
	// not say why: to a closed port, go-redis retries its dial with
	// backoff and answers "context deadline exceeded"
	health   func(ctx context.Context) error
	checking atomic.Bool
	dialErr  atomic.Pointer[dialError] // the last check's failure; nil: none

	mu       sync.Mutex
	queue    []*call
	spare    []*call // the last batch sent, reused as the next queue
	inflight int     // round trips in flight, the flushers' included
	flushing int     // slots held by flushers (at most maxInFlight)
	calls    sync.Pool
}

type clone struct {
	timeout time.Duration
	c       *redis.Client
}

// maxInFlight is the in-flight limit of one Limiter once calls queue, and
// how many flushers send batches at once. One would leave Redis idle while
// a batch's reply travels back and the next batch forms; many would give
// up coalescing. Measured with rwbench on 2 cores, 3 beat 2 by 15-40% at 64
// and 256 goroutines; 2, 3, 4 and 8 were alike at 16.
const maxInFlight = 3

// maxLone is the in-flight limit while no flusher is at work: with a few
// concurrent callers, each sends its own at once, as with a plain client.
// Measured on 2 cores, 8 beat 3 by 20-25% at 4 goroutines.
const maxLone = 8

// call is one script run on behalf of one caller.
type call struct {
	ctx    context.Context
	script *script
	merged *script // a script that runs many such calls in one; nil: none
	// answers: how many values the merged script answers for this call
	// (allow.lua's reply)
	answers int
	keys    []string
	args    []any
	reply   any
	err     error
	done    chan struct{} // buffered: whoever fills the call never blocks on it
	limit   time.Time     // a queued call's deadline beside ctx's; zero: none
	timer   *time.Timer   // the timer of limit (see await); nil until needed
}

// script is a Lua script and its source, which a pipeline sends again
// after NOSCRIPT, and its function's name in the store's library.
type script struct {
	*redis.Script
	src   string
	fn    string
	fnArg any // fn, boxed once for the command's arguments
	// ints: the script's reply is a flat array of integers (allow.lua,
	// allow_batch.lua), so that FCALL reads it as []int64 (see fcallInts)
	ints bool
}

func newScript(src string) *script { return &script{Script: redis.NewScript(src), src: src} }

// newTransport returns the transport of rdb, for calls bounded by the
// given timeouts (0: none).
func newTransport(rdb redis.Scripter, timeouts ...time.Duration) *transport {
	t := &transport{rdb: rdb, boundsReads: boundsReads(rdb), born: time.Now()}
	switch c := rdb.(type) {
	case *redis.Client: // a failover client too
		t.pauses = true
		opt := c.Options()
		t.health = dialHealth(opt.Dialer, opt.DialTimeout, opt.Network, opt.Addr)
	case *redis.Ring: // its shards' addresses: a down shard takes no command
		opt := c.Options()
		checks := make([]func(context.Context) error, 0, len(opt.Addrs))
		for _, addr := range opt.Addrs {
			checks = append(checks, dialHealth(opt.Dialer, opt.DialTimeout, "tcp", addr))
		}
		t.health = func(ctx context.Context) error {
			for _, check := range checks {
				if err := check(ctx); err != nil {
					return err
				}
			}
			return nil
		}
	case interface {
		Ping(context.Context) *redis.StatusCmd
	}: // a Cluster: a PING goes to a node, and says why it cannot
		t.health = func(ctx context.Context) error {
			var op *net.OpError
			if err := c.Ping(ctx).Err(); err != nil && !(errors.As(err, &op) && op.Op == "dial") {
				return errUnhealthy // no dial's error to tell
			} else {
				return err
			}
		}
	}
	if c, ok := rdb.(*redis.Client); ok && !t.boundsReads {
		for _, d := range timeouts {
			if d > 0 {
				t.clones = append(t.clones, clone{d, c.WithTimeout(d)})
			}
		}
	}
	if p, ok := rdb.(interface{ Pipeline() redis.Pipeliner }); ok {
		t.pipe = p.Pipeline
	}
	t.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	return t
}

// clock is the time in ns since the transport was made, on the monotonic
// clock; never 0.
func (t *transport) clock() int64 { return int64(time.Since(t.born)) + 1 }

// lastSlow reports whether a call on its caller's goroutine ran out of
// time within slowPause.
func (t *transport) lastSlow() bool {
	until := t.slowUntil.Load()
	return until != 0 && t.clock() < until
}

// answeredSince reports whether Redis has answered this client since
// clock read sent (a reply or an error reply of the server).
func (t *transport) answeredSince(sent int64) bool { return t.lastReply.Load() >= sent }

// answered notes a reply of Redis when err is none or an error reply of the
// server (not a network error, a timeout or the context's end). The time
// noted never goes back: a goroutine that read the clock, then was
// preempted while another noted a later reply, leaves the later one.
func (t *transport) answered(err error) {
	if err == nil || replied(err) {
		now := t.clock()
		for last := t.lastReply.Load(); last < now && !t.lastReply.CompareAndSwap(last, now); last = t.lastReply.Load() {
		}
	}
}

// dialHealth returns the health check of the server at addr: one dial,
// as the client dials it (its Dialer, else a net.Dialer).
func dialHealth(dialer func(context.Context, string, string) (net.Conn, error), timeout time.Duration, network, addr string) func(context.Context) error {
	if dialer == nil {
		dialer = (&net.Dialer{Timeout: timeout}).DialContext
	}
	return func(ctx context.Context) error {
		conn, err := dialer(ctx, network, addr)
		if err == nil {
			conn.Close()
		}
		return err
	}
}

// dialError is the failure of the health check, and when it failed.
type dialError struct {
	err error
	at  time.Time
}

// dialErrorAge is how long a failed health check explains later failures.
const dialErrorAge = 10 * time.Second

// checkDial starts a health check after a failure without any reply (see
// health), in the background, at most one at a time, whose error explains
// the failures that follow (see explain): a refused connection, a wrong
// host, rather than only a deadline.
func (t *transport) checkDial() {
	if t.health == nil || !t.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer t.checking.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		switch err := t.health(ctx); {
		case err == nil:
			t.dialErr.Store(nil)
		case err != errUnhealthy:
			t.dialErr.Store(&dialError{err, time.Now()})
		}
	}()
}

// errUnhealthy is a health check's failure that tells nothing more than
// the calls' own errors: the last explanation stays.
var errUnhealthy = errors.New("unhealthy")

// noteDial keeps err when it is the failed dial of a call itself (not cut
// short by its deadline), which explains the failures that follow as the
// health check's would, and reports whether it was one.
func (t *transport) noteDial(err error) bool {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" || op.Timeout() {
		return false
	}
	t.dialErr.Store(&dialError{err, time.Now()})
	return true
}

// explain returns err with the health check's recent failure, if any.
func (t *transport) explain(err error) error {
	last := t.dialErr.Load()
	if last == nil || time.Since(last.at) > dialErrorAge {
		return err
	}
	return fmt.Errorf("%w (the health check failed %s ago: %w)", err, time.Since(last.at).Round(time.Millisecond), last.err)
}

// replied reports whether err is an answer of the server: an error reply
// (a script error, NOPERM, OOM, TRYAGAIN...) or a reply the scripts never
// send.
func replied(err error) bool {
	var re redis.Error
	return errors.As(err, &re) || errors.Is(err, store.ErrUnexpectedReply)
}

// newCall returns a call with room for the keys and arguments of a call
// on limits limits.
func (t *transport) newCall(limits int) *call {
	c := t.calls.Get().(*call)
	if cap(c.keys) < 1+limits {
		c.keys = make([]string, 0, 1+limits)
	}
	if cap(c.args) < 3+2*limits {
		c.args = make([]any, 0, 3+2*limits)
	}
	return c
}

func (t *transport) recycle(c *call) {
	clear(c.keys)
	clear(c.args)
	*c = call{keys: c.keys[:0], args: c.args[:0], done: c.done, timer: c.timer}
	t.calls.Put(c)
}

// run sends c (filled by the caller) and returns the script's reply, by
// ctx's deadline at the latest, and by d from now (0: no bound but ctx).
// c must not be used afterwards.
//
// A call that finds nothing queued and a slot free is sent at once: on its
// caller's goroutine when the client ends it at its deadline (see client),
// else on a goroutine of its own. Else (or within slowPause of a timeout)
// it is queued, and a flusher sends it, started now if a slot is free. A
// caller that does not send its call itself waits for its reply or its
// deadline; a queued one on a timer kept in its pooled call, with no
// context of its own (context.WithTimeout costs 4 allocations and a
// runtime timer: measured with rwbench at 64 and 256 goroutines on 2
// cores, 1-3 µs of client CPU per decision and 15-40% of the decisions
// per second).
func (t *transport) run(ctx context.Context, c *call, d time.Duration) (any, error) {
	if err := ctx.Err(); err != nil {
		t.recycle(c)
		return nil, err
	}
	var limit time.Time // d from now, unless ctx ends sooner
	if d > 0 {
		limit = time.Now().Add(d)
		if dl, ok := ctx.Deadline(); ok && !dl.After(limit) {
			limit = time.Time{}
		}
	}
	slow := t.lastSlow()
	t.mu.Lock()
	free := t.inflight < maxInFlight || t.flushing == 0 && t.inflight < maxLone
	if free && len(t.queue) == 0 && !slow {
		t.inflight++
		t.mu.Unlock()
		defer t.handOff()
		if !limit.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, limit)
			defer cancel()
		}
		rdb := t.client(ctx, d, !limit.IsZero())
		if rdb == nil {
			// the client would not end the call at ctx's deadline: it runs
			// on a goroutine of its own (not a flusher's: a node that does
			// not answer must not hold up the others' calls)
			c.ctx = ctx
			go func() {
				c.reply, c.err = t.runOne(ctx, t.rdb, c)
				c.done <- struct{}{}
			}()
			return t.await(ctx, c, time.Time{})
		}
		reply, err := t.runOne(ctx, rdb, c)
		t.recycle(c)
		if err != nil && t.pauses && store.IsTimeout(err) && ctx.Err() != nil {
			// a read that ends at its deadline costs its connection: for
			// a while, calls go through flushers, which wait for a late
			// reply while their callers leave at their deadline
			t.slowUntil.Store(t.clock() + int64(slowPause))
		}
		return reply, err
	}
	c.ctx, c.limit = ctx, limit
	t.queue = append(t.queue, c)
	start := free && t.flushing < maxInFlight
	if start {
		t.inflight++
		t.flushing++
	}
	t.mu.Unlock()
	if start {
		go t.flush()
	}
	return t.await(ctx, c, limit)
}

// slowPause is how long after a call on its caller's goroutine ran out of
// time calls to a single server go through flushers instead. Each such timeout closes a
// connection (its reply may still come), and under a flood of requests on
// a machine short of CPU, new connections timed out in turn, so that one
// client got no reply for hundreds of milliseconds while Redis answered
// the others (TestFlood beside two busy loops).
const slowPause = time.Second

// client returns the client that ends a call on its caller's goroutine at
// its deadline, or nil when there is none: rdb itself when it ends its
// reads at the context's deadline or the call never ends; else, for a call
// bounded by d (limited: no sooner deadline of the caller's), the
// WithTimeout clone of d.
func (t *transport) client(ctx context.Context, d time.Duration, limited bool) redis.Scripter {
	switch {
	case t.boundsReads:
		return t.rdb
	case limited:
		for _, cl := range t.clones {
			if cl.timeout == d {
				return cl.c
			}
		}
		return nil
	}
	if _, ok := ctx.Deadline(); !ok && ctx.Done() == nil {
		return t.rdb // it never ends
	}
	return nil
}

// await waits for c's reply, filled by another goroutine, or for ctx's
// end or limit (zero: none). A caller that leaves first leaves c to
// whoever fills it.
func (t *transport) await(ctx context.Context, c *call, limit time.Time) (any, error) {
	var timeout <-chan time.Time
	if !limit.IsZero() {
		if c.timer == nil {
			c.timer = time.NewTimer(time.Until(limit))
		} else {
			c.timer.Reset(time.Until(limit))
		}
		timeout = c.timer.C
	}
	var gone error
	atLimit := false
	select {
	case <-c.done:
	case <-ctx.Done():
		gone = ctx.Err()
	case <-timeout:
		gone, atLimit = context.DeadlineExceeded, true
	}
	if timeout != nil {
		c.timer.Stop() // since Go 1.23 no value sent before Stop is received later
	}
	if gone != nil && !t.late(c.done, limit, atLimit) {
		return nil, gone
	}
	reply, err := c.reply, c.err
	t.recycle(c)
	return reply, err
}

// lateAllowance is how late a goroutine may see its deadline and still be
// taken at its word: later than that, this process was short of CPU (a
// flood, a busy machine) while the reply may have waited for its reader
// just as long.
const lateAllowance = 25 * time.Millisecond

// late reports whether the reply on done came after all, once the caller's
// wait has ended: it lets the goroutines that are ready run once (the
// reply's reader among them), and when a queued call's wait ended at
// limit, the Limiter's timeout, and this goroutine saw it more than
// lateAllowance late, it waits on as long again. A caller's own deadline
// never waits, nor does a call run on a goroutine of its own (its
// context carries the timeout).
// Without it, TestFlood beside two busy loops answered 1-3 decisions in 1
// run of 10 by the failure mode after a stall of the whole process.
func (t *transport) late(done <-chan struct{}, limit time.Time, atLimit bool) bool {
	runtime.Gosched()
	select {
	case <-done:
		return true
	default:
	}
	late := time.Since(limit)
	if !atLimit || late <= lateAllowance {
		return false
	}
	timer := time.NewTimer(late)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}

// handOff ends a round trip sent by its caller: when calls queued
// meanwhile its slot goes to a new flusher, which sends them, unless
// maxInFlight flushers are at work already.
func (t *transport) handOff() {
	t.mu.Lock()
	if len(t.queue) == 0 || t.flushing >= maxInFlight {
		t.inflight--
		t.mu.Unlock()
		return
	}
	t.flushing++ // the slot stays taken: a flusher sends next
	t.mu.Unlock()
	go t.flush()
}

// flush is a flusher goroutine, started holding a slot: it sends whatever
// is queued, batch after batch, and gives its slot back when the queue is
// empty.
func (t *transport) flush() {
	for {
		t.mu.Lock()
		batch := t.queue
		t.queue, t.spare = t.spare[:0], nil
		if len(batch) == 0 {
			t.flushing--
			t.inflight--
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		t.send(batch)
		clear(batch)
		t.mu.Lock()
		if t.spare == nil {
			t.spare = batch[:0]
		}
		t.mu.Unlock()
	}
}

// finish hands c its reply.
func (t *transport) finish(c *call, reply any, err error) {
	c.reply, c.err = reply, err
	c.done <- struct{}{}
}

// runOne runs c's script alone on rdb, with ctx: FCALL when the library
// is loaded, else (or when the server lacks the function) Script.Run
// (EVALSHA, and EVAL when the server lacks the script). It notes whether
// Redis answered.
func (t *transport) runOne(ctx context.Context, rdb redis.Scripter, c *call) (any, error) {
	if t.lib != nil && t.lib.usable() {
		var reply any
		var err error
		if p, ok := rdb.(processor); ok && c.script.ints {
			// the reply read as []int64: FCall's generic reply would box
			// every value, an allocation each for all but small ones
			cmd := fcallIntsCmd(ctx, c.script, c.keys, c.args)
			if err = p.Process(ctx, cmd); err == nil {
				reply = cmd
			}
		} else {
			reply, err = rdb.(functionCaller).FCall(ctx, c.script.fn, c.keys, c.args...).Result()
		}
		if !t.lib.refused(err) {
			t.answered(err)
			return reply, err
		}
	}
	reply, err := c.script.Run(ctx, rdb, c.keys, c.args...).Result()
	t.answered(err)
	return reply, err
}

// fcallIntsCmd returns the command FCALL of sc's function whose reply is
// read as []int64: its arguments as go-redis's FCall builds them, but for
// the function's name, boxed once; its first key's position set, so that
// a Cluster routes it by that key, as FCall's.
func fcallIntsCmd(ctx context.Context, sc *script, keys []string, args []any) *redis.IntSliceCmd {
	all := make([]any, 0, 3+len(keys)+len(args))
	all = append(all, "fcall", sc.fnArg, len(keys))
	for _, k := range keys {
		all = append(all, k)
	}
	cmd := redis.NewIntSliceCmd(ctx, append(all, args...)...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// processor is a client that runs any command: a Client or ClusterClient.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// functionCaller is a client that runs FCALL: a Client or ClusterClient
// (see newLibrary), and their pipelines.
type functionCaller interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
}

// boundsReads reports whether rdb bounds its network reads by the context's
// deadline (go-redis with ContextTimeoutEnabled). Without it, go-redis
// waits for a silent server until its own ReadTimeout (3s by default, and
// 5s measured for a fresh connection's handshake), whatever the context.
func boundsReads(rdb redis.Scripter) bool {
	switch c := rdb.(type) {
	case *redis.Client: // also NewFailoverClient
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// AddHook adds h to the clients the store sends through beside its own
// (the WithTimeout clones, which have none of its hooks), so that a test
// that hooks the client sees every call.
func (s *Store) AddHook(h redis.Hook) {
	for _, cl := range s.t.clones {
		cl.c.AddHook(h)
	}
}
