package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// transport sends a Limiter's script calls by one rule (route): a call that
// finds nothing in flight on its lane (a single server, or the node serving
// its key, see laneOf) goes out at once, unbatched (sendUnbatched); else it
// queues, and a flusher sends the queue, at most inflightLimit round trips in
// flight a lane, decisions merged into allow_batch calls, replies read to the
// end after their callers left. On a Cluster or Ring a call that is no
// decision always goes unbatched. It adds no hook to the client.
type transport struct {
	rdb redis.Scripter
	// pipe returns a pipeline to the node serving a hash tag: the client's,
	// or on a Ring its shard's (go-redis's Ring pipeline, run after Close,
	// dereferences the closed shard map on a goroutine of its own and
	// crashes the process; a shard's client says it is closed); nil: none
	// (a Scripter of another type).
	pipe func(tag string) (redis.Pipeliner, error)
	// laneOf names the node serving a decision's hash tag on a Cluster or
	// Ring (a Cluster's master while the client knows it, a Ring's shard;
	// "": unknown, the tag names the lane): a pipeline to one node holds no
	// other node's replies. nil: one server.
	laneOf func(tag string) string
	// cancelled is a context already cancelled: a slot lookup with it reads
	// what the client knows and never sends a command (see master).
	cancelled context.Context
	// deadlineClient is a client that ends a call at its context's
	// deadline: rdb with ContextTimeoutEnabled, or a *redis.Client's clone
	// with it and no retries (the same connections, none of its hooks); nil:
	// a Cluster or Ring without it, whose unbatched calls then run on a
	// goroutine of their own (see sendUnbatched).
	deadlineClient redis.Scripter
	lib            *library // runs the scripts as FCALL once loaded; nil: EVALSHA

	// health checks the server after a failure (see checkDial), as a call's
	// error does not say why (to a closed port, go-redis retries its dial
	// and answers "context deadline exceeded"); nil: none.
	health   func(ctx context.Context) error
	checking atomic.Bool
	dialErr  atomic.Pointer[dialError] // the last check's failure; nil: none

	mu            sync.Mutex
	inflightLimit int              // a lane's round trips in flight at most (see maxInFlight)
	one           lane             // a single server's
	lanes         map[string]*lane // a Cluster's or Ring's, by laneOf, while in use
	calls         sync.Pool
}

// lane is the round trips in flight to one node, and the calls queued behind.
type lane struct {
	inflight int // round trips in flight, the flushers' included
	queue    []*call
	spare    []*call // the last batch sent, reused as the next queue
}

// maxInFlight is a single server's in-flight limit: one round trip in
// flight leaves Redis idle while a reply travels, and more than two split
// the queue into smaller merged calls, each a round trip's cost to both
// sides, which measured slower at all but the highest concurrency
// (docs/performance.md has the sweep and its command). A Cluster's or
// Ring's node takes one at a time: its nodes already work in parallel, and
// more a node measured slower too.
const maxInFlight = 2

// call is one script run on behalf of one caller.
type call struct {
	ctx     context.Context
	script  *script
	merged  *script // the script that runs many such calls in one; nil: none
	answers int     // how many values the merged script answers for this call, without an override (see allowSize)
	keys    []string
	args    []any
	reply   any
	err     error
	done    chan struct{} // buffered: whoever fills the call never blocks on it
	limit   time.Time     // the call's deadline beside ctx's; zero: none
	timer   *time.Timer   // the timer of limit (see await); nil until needed
	bound   *bounded      // ctx ended at limit too, for a call sent alone (see sendUnbatched); nil until needed
}

// script is a Lua script and its function in the library.
type script struct {
	*redis.Script
	name, body string // the function's name suffix; the source without algorithms.lua
	algorithms bool   // it runs after algorithms.lua
	fn         any    // its function's name (a string), boxed once
	ints       bool   // the reply is a flat array of integers: FCALL reads it as []int64
}

func newTransport(rdb redis.Scripter) *transport {
	t := &transport{rdb: rdb, inflightLimit: maxInFlight, lanes: map[string]*lane{}}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	t.cancelled = cancelled
	switch c := rdb.(type) {
	case *redis.Client: // a failover client too
		opt := c.Options()
		t.health = dialHealth(opt.Dialer, opt.DialTimeout, opt.Network, opt.Addr)
		t.pipe, t.deadlineClient = pipeOf(c), c
		if !opt.ContextTimeoutEnabled {
			clone := c.WithTimeout(opt.ReadTimeout)
			clone.Options().ContextTimeoutEnabled = true // the clone's own options
			// no retries: go-redis retries READONLY, LOADING, MASTERDOWN and
			// TRYAGAIN replies after its backoff (3 times: about 100 ms), and
			// the reply, lost at the deadline, became a timeout (its pool drops
			// a connection the server closed before it lends it)
			clone.Options().MaxRetries = 0
			t.deadlineClient = clone
		}
	case *redis.Ring: // its shards' addresses: a down shard takes no command
		opt := c.Options()
		t.health = dialHealth(opt.Dialer, opt.DialTimeout, "tcp", slices.Collect(maps.Values(opt.Addrs))...)
		t.inflightLimit = 1
		t.pipe = func(tag string) (redis.Pipeliner, error) {
			shard, err := c.GetShardClientForKey(tag)
			if err != nil {
				return nil, err
			}
			return shard.Pipeline(), nil
		}
		t.laneOf = func(tag string) string {
			if shard, err := c.GetShardClientForKey(tag); err == nil {
				return shard.Options().Addr
			}
			return ""
		}
		if opt.ContextTimeoutEnabled {
			t.deadlineClient = c
		}
	case *redis.ClusterClient: // a PING goes to a node, and says why it cannot
		t.health = func(ctx context.Context) error {
			var op *net.OpError
			err := c.Ping(ctx).Err()
			if err != nil && !(errors.As(err, &op) && op.Op == "dial") {
				return errUnhealthy // no dial's error to tell
			}
			return err
		}
		if c.Options().ContextTimeoutEnabled {
			t.deadlineClient = c
		}
		t.pipe, t.inflightLimit, t.laneOf = pipeOf(c), 1, t.master
	}
	t.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	return t
}

// pipeOf returns a pipe of rdb's own pipelines.
func pipeOf(rdb redis.UniversalClient) func(string) (redis.Pipeliner, error) {
	return func(string) (redis.Pipeliner, error) { return rdb.Pipeline(), nil }
}

// master returns the address of the Cluster master serving tag's slot, as
// the client knows it without a round trip; "" when not a Cluster or unknown.
func (t *transport) master(tag string) string {
	c, ok := t.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	m, err := c.MasterForKey(t.cancelled, tag)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

// dialHealth returns a health check that dials each of addrs as the
// client does, and fails with the first failure.
func dialHealth(dialer func(context.Context, string, string) (net.Conn, error), timeout time.Duration, network string, addrs ...string) func(context.Context) error {
	if dialer == nil {
		dialer = (&net.Dialer{Timeout: timeout}).DialContext
	}
	return func(ctx context.Context) error {
		for _, addr := range addrs {
			conn, err := dialer(ctx, network, addr)
			if err != nil {
				return err
			}
			conn.Close()
		}
		return nil
	}
}

type dialError struct {
	err error
	at  time.Time
}

// dialErrorAge is how long a failed health check explains later failures.
const dialErrorAge = 10 * time.Second

// checkDial has the failures after err, a call's without a reply, explained
// (see explain): by err when it is a failed dial (not a timeout), else by a
// health check in the background, one at a time.
func (t *transport) checkDial(err error) {
	if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" && !op.Timeout() {
		t.dialErr.Store(&dialError{err, time.Now()})
		return
	}
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

// errUnhealthy: the health check tells nothing new; the last explanation stays.
var errUnhealthy = errors.New("unhealthy")

// explain returns err with a recent failed dial (see checkDial) but err's own.
func (t *transport) explain(err error) error {
	last := t.dialErr.Load()
	if last == nil || time.Since(last.at) > dialErrorAge || errors.Is(err, last.err) {
		return err
	}
	return fmt.Errorf("%w (the health check failed %s ago: %w)", err, time.Since(last.at).Round(time.Millisecond), last.err)
}

// replied reports whether err is an error reply or an unexpected reply.
func replied(err error) bool {
	var re redis.Error
	return errors.As(err, &re) || errors.Is(err, store.ErrUnexpectedReply)
}

func (t *transport) recycle(c *call) {
	clear(c.keys)
	clear(c.args)
	*c = call{keys: c.keys[:0], args: c.args[:0], done: c.done, timer: c.timer, bound: c.bound}
	t.calls.Put(c)
}

// route sends c by the transport's rule (unbatched when its lane is idle,
// else queued for a flusher) and returns the script's reply, by deadline at
// the latest (zero: ctx's alone); c goes back to the pool. A queued caller
// waits on its pooled call's timer (see await), not a context.WithTimeout.
func (t *transport) route(ctx context.Context, c *call, deadline time.Time) (any, error) {
	if err := ended(ctx, deadline, time.Now()); err != nil {
		t.recycle(c)
		return nil, err
	}
	c.ctx, c.limit = ctx, deadline
	name := ""
	if t.laneOf != nil {
		if c.merged == nil {
			return t.sendUnbatched(c)
		}
		if name = t.laneOf(tag(c)); name == "" {
			name = tag(c)
		}
	}
	t.mu.Lock()
	l := &t.one
	if t.laneOf != nil {
		if l = t.lanes[name]; l == nil { // a node's lane, made when first in use
			l = new(lane)
			t.lanes[name] = l
		}
	}
	if l.inflight == 0 {
		l.inflight++
		t.mu.Unlock()
		defer t.handOff(name, l)
		return t.sendUnbatched(c)
	}
	l.queue = append(l.queue, c)
	free := l.inflight < t.inflightLimit
	if free {
		l.inflight++
	}
	t.mu.Unlock()
	if free {
		go t.flush(name, l)
	}
	return t.await(c)
}

// ended returns ctx's error, or DeadlineExceeded when deadline (zero:
// none) has passed at now.
func ended(ctx context.Context, deadline, now time.Time) error {
	if err := ctx.Err(); err != nil || deadline.IsZero() || now.Before(deadline) {
		return err
	}
	return context.DeadlineExceeded
}

// tag returns the hash tag "rw:{k}:" that decision c's keys share, from its
// block key "rw:{k}:block".
func tag(c *call) string { return c.keys[0][:len(c.keys[0])-len(blockName)] }

// sendUnbatched sends c alone, never merged: on the caller's goroutine
// through deadlineClient, else (a Cluster or Ring without one) on a
// goroutine of its own that the caller leaves at the deadline.
func (t *transport) sendUnbatched(c *call) (any, error) {
	if t.deadlineClient == nil {
		go func() {
			reply, err := t.runOne(context.WithoutCancel(c.ctx), t.rdb, c)
			t.finish(c, reply, err)
		}()
		return t.await(c)
	}
	ctx, bound := c.ctx, false
	if dl, ok := ctx.Deadline(); !c.limit.IsZero() && (!ok || c.limit.Before(dl)) {
		if c.bound == nil {
			c.bound = newBounded()
		}
		ctx, bound = c.bound.start(c.ctx, c.limit), true
	}
	reply, err := t.runOne(ctx, t.deadlineClient, c)
	if bound && !c.bound.stop() { // before c goes back to the pool, to another caller
		c.bound = nil // it ended, or may be ending: the next call takes a new one
	}
	if dl, ok := ctx.Deadline(); err != nil && ok && store.IsTimeout(err) && !time.Now().Before(dl) {
		err = context.DeadlineExceeded // a read cut at the deadline, as go-redis says after a retry's wait
	}
	t.recycle(c)
	return reply, err
}

// bounded is a call's context ended at its limit too, as
// context.WithDeadline's is, but kept with its pooled call: its channel and
// timer serve call after call while none ends (context.WithDeadline made 5
// allocations and a new timer a decision: 0.9-2µs on a 2-core machine, the
// largest part of the Limiter's own CPU time in a lone decision). Its
// values and end are its parent's, its deadline the limit; Done closes at
// the limit or at the parent's end.
type bounded struct {
	parent   context.Context
	limit    time.Time
	done     chan struct{}
	timer    *time.Timer  // ends it at limit; nil until first started
	unparent func() bool  // stops the watch of parent's end (context.AfterFunc); nil: parent never ends
	state    atomic.Int32 // boundLive, then boundEnding, then boundEnded
	err      error        // set before state is boundEnded
	expire   func()       // end by the limit: boxed once
	orphan   func()       // end by the parent: boxed once
}

const (
	boundLive = iota
	boundEnding
	boundEnded
)

func newBounded() *bounded {
	b := &bounded{done: make(chan struct{})}
	b.expire = func() { b.end(context.DeadlineExceeded) }
	b.orphan = func() { b.end(b.parent.Err()) }
	return b
}

// start makes b parent's context ended at limit too (a live b, not started since its last stop).
func (b *bounded) start(parent context.Context, limit time.Time) context.Context {
	b.parent, b.limit = parent, limit
	if b.timer == nil {
		b.timer = time.AfterFunc(time.Until(limit), b.expire)
	} else {
		b.timer.Reset(time.Until(limit))
	}
	if parent.Done() != nil {
		b.unparent = context.AfterFunc(parent, b.orphan)
	}
	return b
}

// stop ends b's watch of its limit and parent; false when b ended or may
// be ending (a watch fired): it cannot serve another call.
func (b *bounded) stop() bool {
	live := b.timer.Stop()
	if b.unparent != nil {
		live = b.unparent() && live
		b.unparent = nil
	}
	if live = live && b.state.Load() == boundLive; live {
		b.parent = nil // no watch runs now that reads it
	}
	return live
}

func (b *bounded) end(err error) {
	if b.state.CompareAndSwap(boundLive, boundEnding) {
		b.err = err
		b.state.Store(boundEnded)
		close(b.done)
	}
}

func (b *bounded) Deadline() (time.Time, bool) { return b.limit, true }
func (b *bounded) Done() <-chan struct{}       { return b.done }
func (b *bounded) Value(key any) any           { return b.parent.Value(key) }

func (b *bounded) Err() error {
	if b.state.Load() == boundEnded {
		return b.err
	}
	return nil
}

// await waits for c's reply, or the end of c.ctx or c.limit; a caller that
// leaves first leaves c to whoever fills it.
func (t *transport) await(c *call) (any, error) {
	var timeout <-chan time.Time
	if !c.limit.IsZero() {
		if c.timer == nil {
			c.timer = time.NewTimer(time.Until(c.limit))
		} else {
			c.timer.Reset(time.Until(c.limit))
		}
		timeout = c.timer.C
	}
	var gone error
	select {
	case <-c.done:
	case <-c.ctx.Done():
		gone = c.ctx.Err()
	case <-timeout:
		gone = context.DeadlineExceeded
	}
	if timeout != nil {
		c.timer.Stop() // since Go 1.23 no value sent before Stop is received later
	}
	if gone != nil {
		select {
		case <-c.done: // the reply came with the deadline: it answers
		default:
			return nil, gone
		}
	}
	reply, err := c.reply, c.err
	t.recycle(c)
	return reply, err
}

// handOff ends a caller's round trip on l: its slot goes to a flusher if
// calls queued.
func (t *transport) handOff(name string, l *lane) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(l.queue) == 0 {
		t.idle(name, l)
	} else {
		go t.flush(name, l) // the slot stays taken: a flusher sends next
	}
}

// flush, holding a slot of l, sends l's queue until it is empty, then frees the slot.
func (t *transport) flush(name string, l *lane) {
	for {
		t.mu.Lock()
		batch := l.queue
		l.queue, l.spare = l.spare[:0], nil
		if len(batch) == 0 {
			t.idle(name, l)
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		t.send(batch)
		clear(batch)
		t.mu.Lock()
		if l.spare == nil {
			l.spare = batch[:0]
		}
		t.mu.Unlock()
	}
}

// idle frees a slot of l, t.mu held; a node's lane goes with its last slot.
func (t *transport) idle(name string, l *lane) {
	if l.inflight--; l.inflight == 0 && l != &t.one {
		delete(t.lanes, name)
	}
}

func (t *transport) finish(c *call, reply any, err error) {
	c.reply, c.err = reply, err
	c.done <- struct{}{}
}

// runOne runs c's script alone on rdb: FCALL when the library is loaded,
// else (or when FCALL is refused) EVALSHA, then EVAL after NOSCRIPT.
func (t *transport) runOne(ctx context.Context, rdb redis.Scripter, c *call) (any, error) {
	if t.lib != nil && t.lib.usable() {
		reply, err := result(fcall(ctx, rdb.(processor), c))
		if !t.lib.refused(err) {
			return reply, err
		}
	}
	return c.script.Run(ctx, rdb, c.keys, c.args...).Result()
}

// fcall runs (in a pipeline: queues) FCALL of c's function on p, built as
// FCall builds it (its first key position set, by which a Cluster routes
// it) with the function's name boxed once; with ints its reply is []int64.
func fcall(ctx context.Context, p processor, c *call) redis.Cmder {
	all := make([]any, 0, 3+len(c.keys)+len(c.args))
	all = append(all, "fcall", c.script.fn, len(c.keys))
	for _, k := range c.keys {
		all = append(all, k)
	}
	all = append(all, c.args...)
	var cmd redis.Cmder
	if c.script.ints {
		cmd = redis.NewIntSliceCmd(ctx, all...)
	} else {
		cmd = redis.NewCmd(ctx, all...)
	}
	cmd.SetFirstKeyPos(3)
	_ = p.Process(ctx, cmd) // its error is cmd's
	return cmd
}

// processor runs a command: a Client, ClusterClient, or their pipelines.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}
