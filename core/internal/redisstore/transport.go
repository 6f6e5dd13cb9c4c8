package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// transport sends one Limiter's script calls to Redis, by one routing
// rule, rueidis's: a call alone goes straight out on its caller's
// goroutine; otherwise it is queued, and a flusher sends the queue at once,
// its decisions merged into allow_batch calls. What "alone" means is where
// the calls can merge: on a single server, no call in flight (the flushers
// send everything queued, the decisions as one allow_batch call and every
// other call in one go-redis pipeline, with at most maxInFlight round trips
// in flight); on a Cluster or Ring, whose keys live on different nodes, no
// decision in flight on the same key (its hash tag: see lane), behind which
// the decisions on that key queue and go as one allow_batch call to its
// node, one round trip in flight a key. Under load the batches grow by
// themselves, and each round trip serves many decisions; a slow node holds
// only its own keys' calls.
//
// Every call ends for its caller at its deadline (the decision's one
// budget, or its caller's context). A call alone is sent through a client
// that ends every wait at the context's deadline (direct), which closes
// the connection of a read cut short. A queued call's caller waits for its
// reply or its deadline, whichever comes first, while the flusher reads the
// reply to the end: a slow moment (a flood on a machine short of CPU)
// costs no connection, and the next calls find theirs ready. A Cluster or
// Ring without ContextTimeoutEnabled cannot end a call at its deadline: its
// calls run on goroutines of their own, which their callers leave at the
// deadline. The transport adds no hook to the client.
type transport struct {
	rdb  redis.Scripter
	pipe func() redis.Pipeliner // a single server's (a *redis.Client): calls queue and merge; nil: none
	// direct sends a call on its caller's goroutine and ends it at its
	// context's deadline, wherever go-redis waits (the pool, a dial, the
	// handshake, a read, a retry's backoff): rdb itself with
	// ContextTimeoutEnabled; for a *redis.Client without it (go-redis's
	// default), a clone of it with ContextTimeoutEnabled, which shares its
	// connections and runs none of its hooks; nil: none (a Cluster or Ring
	// without it)
	direct redis.Scripter
	lib    *library // runs the scripts as FCALL once loaded; nil: EVALSHA

	born      time.Time    // the origin of clock, on the monotonic clock
	lastReply atomic.Int64 // clock when Redis last answered (0: never)

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
	// lanes are the keys with a decision in flight on a Cluster or Ring,
	// by their hash tag (see call.lane), each with the decisions queued
	// behind it
	lanes map[string][]*call
	calls sync.Pool
}

// maxInFlight is the in-flight limit of one Limiter: the flushers at work
// (and a call alone). One would leave Redis idle while a batch's reply
// travels back and the next batch forms; many would give up merging.
// Measured on 2 cores: see docs/performance.md.
const maxInFlight = 8

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
	// lane: on a Cluster or Ring, the hash tag of the decision's keys
	// ("rw:{k}:"), by which decisions on one key queue and merge; "": none
	lane  string
	timer *time.Timer // the timer of limit (see await); nil until needed
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

// newTransport returns the transport of rdb.
func newTransport(rdb redis.Scripter) *transport {
	t := &transport{rdb: rdb, born: time.Now(), lanes: map[string][]*call{}}
	switch c := rdb.(type) {
	case *redis.Client: // a failover client too
		opt := c.Options()
		t.health = dialHealth(opt.Dialer, opt.DialTimeout, opt.Network, opt.Addr)
		t.pipe, t.direct = c.Pipeline, c
		if !opt.ContextTimeoutEnabled {
			clone := c.WithTimeout(opt.ReadTimeout)
			clone.Options().ContextTimeoutEnabled = true // the clone's own options
			t.direct = clone
		}
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
		if opt.ContextTimeoutEnabled {
			t.direct = c
		}
	case *redis.ClusterClient: // a PING goes to a node, and says why it cannot
		t.health = func(ctx context.Context) error {
			var op *net.OpError
			if err := c.Ping(ctx).Err(); err != nil && !(errors.As(err, &op) && op.Op == "dial") {
				return errUnhealthy // no dial's error to tell
			} else {
				return err
			}
		}
		if c.Options().ContextTimeoutEnabled {
			t.direct = c
		}
	}
	t.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	return t
}

// clock is the time in ns since the transport was made, on the monotonic
// clock; never 0.
func (t *transport) clock() int64 { return int64(time.Since(t.born)) + 1 }

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
// deadline at the latest (zero: none but ctx's). c must not be used
// afterwards.
//
// A call alone is sent at once, on its caller's goroutine, through
// direct. Else it is queued, and a flusher sends it, started now when a
// slot is free; its caller waits for its
// reply or its deadline, on a timer kept in its pooled call, with no
// context of its own (context.WithTimeout costs 4 allocations and a
// runtime timer: measured with rwbench at 64 and 256 goroutines on 2
// cores, 1-3 µs of client CPU per decision and 15-40% of the decisions
// per second).
func (t *transport) run(ctx context.Context, c *call, deadline time.Time) (any, error) {
	if err := ctx.Err(); err != nil {
		t.recycle(c)
		return nil, err
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		t.recycle(c)
		return nil, context.DeadlineExceeded
	}
	if t.pipe == nil {
		return t.runLane(ctx, c, deadline)
	}
	t.mu.Lock()
	if t.inflight == 0 {
		t.inflight++
		t.mu.Unlock()
		defer t.handOff()
		return t.runAlone(ctx, c, deadline)
	}
	c.ctx, c.limit = ctx, deadline
	t.queue = append(t.queue, c)
	free := t.inflight < maxInFlight
	if free {
		t.inflight++
	}
	t.mu.Unlock()
	if free {
		go t.flush()
	}
	return t.await(ctx, c, deadline)
}

// runLane runs c on a Cluster or Ring: alone when no decision on its key
// is in flight (and every call but a decision), else queued behind the
// one in flight, whose caller hands the queue to a flusher (handOffLane).
func (t *transport) runLane(ctx context.Context, c *call, deadline time.Time) (any, error) {
	if c.lane == "" {
		return t.runAlone(ctx, c, deadline)
	}
	lane := c.lane
	t.mu.Lock()
	if q, busy := t.lanes[lane]; busy {
		c.ctx, c.limit = ctx, deadline
		t.lanes[lane] = append(q, c)
		t.mu.Unlock()
		return t.await(ctx, c, deadline)
	}
	t.lanes[lane] = nil // in flight, nothing queued
	t.mu.Unlock()
	defer t.handOffLane(lane)
	return t.runAlone(ctx, c, deadline)
}

// handOffLane ends the round trip of a lane's first call: the decisions
// queued behind it go to a flusher, else the lane ends.
func (t *transport) handOffLane(lane string) {
	t.mu.Lock()
	ended := t.endLane(lane)
	t.mu.Unlock()
	if !ended {
		go t.flushLane(lane)
	}
}

// flushLane sends the decisions queued on lane, merged, batch after batch,
// and ends the lane when none is left.
func (t *transport) flushLane(lane string) {
	for {
		t.mu.Lock()
		if t.endLane(lane) {
			t.mu.Unlock()
			return
		}
		batch := t.lanes[lane]
		t.lanes[lane] = nil
		t.mu.Unlock()
		t.sendLane(batch)
	}
}

// endLane ends lane when nothing is queued on it, and reports whether it
// did; t.mu is held.
func (t *transport) endLane(lane string) bool {
	if len(t.lanes[lane]) > 0 {
		return false
	}
	delete(t.lanes, lane)
	return true
}

// sendLane sends a lane's batch: its decisions, on one key, as allow_batch
// calls of up to maxMerged decisions each. A call goes through direct with
// the latest deadline of its callers (each leaves at its own), else through
// the client, whose ReadTimeout ends a wait on a silent node.
func (t *transport) sendLane(batch []*call) {
	live := t.live(batch)
	for len(live) > 0 {
		n := min(len(live), maxMerged)
		group := live[:n]
		live = live[n:]
		s := merge(group)
		ctx, rdb := context.WithoutCancel(group[0].ctx), t.rdb
		cancel := context.CancelFunc(func() {})
		if t.direct != nil {
			rdb = t.direct
			if deadline := latest(group); !deadline.IsZero() {
				ctx, cancel = context.WithDeadline(ctx, deadline)
			}
		}
		t.runSent(ctx, rdb, s)
		cancel()
	}
}

// latest returns the latest deadline of calls; zero when one has none.
func latest(calls []*call) time.Time {
	var last time.Time
	for _, c := range calls {
		if c.limit.IsZero() {
			return time.Time{}
		}
		if c.limit.After(last) {
			last = c.limit
		}
	}
	return last
}

// runAlone sends c on its own and returns its reply by deadline at the
// latest: on the caller's goroutine through direct, else on a goroutine of
// its own, which the caller leaves at the deadline.
func (t *transport) runAlone(ctx context.Context, c *call, deadline time.Time) (any, error) {
	if t.direct == nil {
		c.ctx = ctx
		go t.runBehind(c)
		return t.await(ctx, c, deadline)
	}
	if dl, ok := ctx.Deadline(); !deadline.IsZero() && (!ok || deadline.Before(dl)) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	reply, err := t.runOne(ctx, t.direct, c)
	t.recycle(c)
	return reply, err
}

// runBehind runs c on the client, to the end whenever its caller leaves,
// and hands it its reply.
func (t *transport) runBehind(c *call) {
	reply, err := t.runOne(context.WithoutCancel(c.ctx), t.rdb, c)
	t.finish(c, reply, err)
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
	select {
	case <-c.done:
	case <-ctx.Done():
		gone = ctx.Err()
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

// handOff ends a round trip sent by its caller: when calls queued
// meanwhile, its slot goes to a new flusher, which sends them.
func (t *transport) handOff() {
	t.mu.Lock()
	if len(t.queue) == 0 {
		t.inflight--
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	go t.flush() // the slot stays taken: a flusher sends next
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
