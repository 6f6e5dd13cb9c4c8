package core

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the script calls of one process's concurrent decisions to
// Redis together ("smart batching"). A call that finds a free slot and
// nobody queued is sent at once, alone: on its caller's goroutine when the
// client bounds the read by its deadline (see directly), else by a sender
// goroutine. Up to maxLone such calls are in flight at once while no
// flusher is at work, so that a few concurrent callers each send their own,
// as with a plain client; once calls queue, the slots are maxInFlight.
// Calls that find every slot taken queue, and when a round trip ends its
// slot goes to a flusher goroutine (up to maxInFlight of them), which sends
// everything queued as one pipeline, and again as long as calls queue; so
// several pipelines are in flight at once. It never waits for more work.
// Under load the batches grow by themselves, so one round trip and one
// write/read pair on either side serve many decisions, while the other
// slots keep Redis busy during a batch's way back.
//
// A queued caller waits for its reply or its context, whichever comes
// first, so it keeps its deadline even when the client does not bound its
// reads by the context. An abandoned call is dropped from its batch when its
// context is done before the batch leaves; otherwise its reply is dropped.
//
// On a *redis.ClusterClient or *redis.Ring the pipeline is split per node by
// go-redis itself; every call's keys share one hash tag, so each call goes
// to one node whole.
type batcher struct {
	rdb  redis.Scripter
	pipe func() redis.Pipeliner // nil: the client cannot pipeline
	// boundsReads: the client ends its reads at the context's deadline
	// (see boundsReads); otherwise a lone call goes to a sender goroutine
	// so that its caller still returns at the deadline, unless lone bounds
	// it.
	boundsReads bool
	// lone is the client's clone (redis.Client.WithTimeout: the same
	// connection pool) whose reads and writes end after the Limiter's
	// decision timeout, loneTimeout: a lone call whose deadline is that
	// timeout is sent on its caller's goroutine by it (see directly). nil:
	// none (a client that bounds its reads, one that cannot be cloned so,
	// or no timeout).
	lone        *redis.Client
	loneTimeout time.Duration

	mu       sync.Mutex
	queue    []*call
	spare    []*call // a flusher's last batch, reused as the next queue
	inflight int     // round trips in flight, the flushers' included
	flushing int     // slots held by flushers (at most maxInFlight): sending, or about to
	running  int     // flusher goroutines
	// wake hands a slot to an idle flusher: each value is a slot taken for
	// it (see handOff)
	wake chan struct{}
	// work hands a lone call to an idle sender (see sendLone): a
	// goroutine that sends lone calls one after another, its stack grown
	// once.
	work chan *call

	calls sync.Pool
	dials *dialErrors // the last failed dial or refusal of this batcher's calls
	// lib runs the scripts as FCALL once it is loaded; nil: always EVALSHA
	lib *library

	born  time.Time    // the origin of heard, on the monotonic clock
	heard atomic.Int64 // ns since born: when Redis last answered
	// starved is when (ns since born) a direct call last ran out of time
	// in a starved process: for starvedPause after, lone calls go to a
	// sender (see directly)
	starved atomic.Int64
}

// starvedPause is how long after a direct call ran out of time in a
// starved process lone calls go to a sender instead. A direct read ends at
// the deadline even when the reply has come and only its reader was slow
// to run, while a caller waiting on a sender waits on for a late reply
// (see awaitLate): in a flood, the decision and its retries (see
// starvedRetries) would otherwise each lose a reply that came in time.
const starvedPause = time.Second

// maxInFlight is how many round trips one Limiter has in flight at once
// once calls queue, and how many flushers send pipelines. One would leave
// Redis idle while a batch's reply travels back and the next batch forms;
// many would give up batching. Measured with rwbench on 2 cores, 3 slots
// with a flusher each beat 2 slots with one flusher by 15-40% at 64 and
// 256 goroutines; 2, 3, 4 and 8 were alike at 16.
const maxInFlight = 3

// maxLone is how many lone calls one Limiter has in flight at once while no
// flusher is at work (nothing queued): with a few concurrent callers, each
// sends its own at once, as with a plain client, rather than the fourth
// waiting for a slot and going through a flusher. Measured on 2 cores, 8
// beat 3 by 20-25% at 4 goroutines, and was alike from 16 goroutines on,
// where calls queue and the depth is maxInFlight.
const maxLone = 8

// flusherIdle is how long an idle flusher goroutine waits for work before
// it exits; the next call starts a new one. It never delays a call.
const flusherIdle = time.Second

// call is one script run on behalf of one caller.
type call struct {
	ctx    context.Context
	script *script
	merged *script // a script that runs many such calls in one; nil: none
	keys   []string
	args   []any
	reply  any
	err    error
	done   chan struct{} // buffered: a flusher never blocks on it
	timer  *time.Timer   // the Limiter's timeout of a queued call (see await); nil until needed
}

// script is a Lua script and its source, which a pipeline sends again
// after NOSCRIPT, and its function's name in the store's library (see
// library).
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

// newBatcher returns the batcher of rdb, for decisions whose timeout is
// timeout (0: none).
func newBatcher(rdb redis.Scripter, timeout time.Duration) *batcher {
	b := &batcher{rdb: rdb, wake: make(chan struct{}, maxInFlight), work: make(chan *call), boundsReads: boundsReads(rdb), dials: newDialErrors(rdb), born: time.Now()}
	if c, ok := rdb.(*redis.Client); ok && !b.boundsReads && timeout > 0 {
		// nothing is added to c: its other commands cost what they did
		b.lone, b.loneTimeout = c.WithTimeout(timeout), timeout
	}
	if p, ok := rdb.(interface{ Pipeline() redis.Pipeliner }); ok {
		b.pipe = p.Pipeline
	}
	b.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	return b
}

// newCall returns a call with room for the keys and arguments of a call
// on limits limits.
func (b *batcher) newCall(limits int) *call {
	c := b.calls.Get().(*call)
	if cap(c.keys) < 1+limits {
		c.keys = make([]string, 0, 1+limits)
	}
	if cap(c.args) < 3+4*limits {
		c.args = make([]any, 0, 3+4*limits)
	}
	return c
}

// run sends c (filled by the caller) and returns the script's reply. c
// must not be used afterwards.
//
// A call that finds a free slot and no call queued is sent at once, with
// its own context: on its own goroutine where the client keeps its
// deadline (see directly), else by a sender. Calls that arrive while every
// slot is taken are queued; when a round trip ends, a flusher goroutine
// sends everything queued as one pipeline, and so on until the queue is
// empty.
func (b *batcher) run(ctx context.Context, c *call) (any, error) {
	sent := time.Since(b.born)
	reply, err := b.wait(ctx, c)
	if err != nil && timedOut(ctx) && !errors.Is(err, errStarved) && b.answeredSince(ctx, sent) {
		// Redis answered other calls while this one waited: its time ran
		// out in a queue (this process's, or Redis's under load), not
		// because Redis failed
		err = starvedError(err, true)
	}
	return reply, err
}

// answeredSince reports whether Redis answered this client in the second
// half of the wait of a call sent at sent (since born) whose ctx has ended:
// Redis was alive well after the call was sent.
func (b *batcher) answeredSince(ctx context.Context, sent time.Duration) bool {
	dl, ok := ctx.Deadline()
	if !ok {
		return false
	}
	half := sent + dl.Sub(b.born.Add(sent))/2
	return time.Duration(b.heard.Load()) > half
}

// answered notes when Redis answers: a reply, or an error reply of the
// server (not a network error or a timeout). It reports whether err was
// one.
func (b *batcher) answered(err error) bool {
	if err != nil {
		if re := redis.Error(nil); !errors.As(err, &re) {
			return false
		}
	}
	b.heard.Store(int64(time.Since(b.born)))
	return true
}

// wait sends c and waits for its reply, or for ctx.
func (b *batcher) wait(ctx context.Context, c *call) (any, error) {
	if err := ctx.Err(); err != nil {
		b.recycle(c)
		return nil, err
	}
	c.ctx = ctx
	b.mu.Lock()
	if len(b.queue) == 0 && (b.inflight < maxInFlight || b.flushing == 0 && b.inflight < maxLone) {
		b.inflight++
		b.mu.Unlock()
		if rdb, ok := b.directly(ctx); ok {
			reply, err := b.direct(ctx, rdb, c)
			if err == nil {
				return reply, nil
			}
			if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
				<-ctx.Done() // the read ended at the deadline; ctx's own timer may lag
			}
			if ctx.Err() != nil {
				// the process was starved when this goroutine saw the
				// deadline late, or with a crowd of runnable goroutines
				// ahead of the reply's reader
				starved := timedOut(ctx) && (seenLate(ctx) || busy())
				if starved {
					b.starved.Store(int64(time.Since(b.born)))
				}
				err = starvedError(b.noReply(ctx), starved)
			}
			return reply, err
		}
		return b.sendLone(ctx, c)
	}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	return b.await(ctx, c)
}

// directly reports whether a lone call with ctx is sent on its caller's
// goroutine, keeping ctx's deadline, and returns the client to send it
// with: the batcher's, or its lone clone, whose reads end at the Limiter's
// timeout. Otherwise the call goes to a sender (see sendLone).
//
// go-redis gives the clone none of the client's hooks, so the client's
// tracing and metrics do not see such a call (with ContextTimeoutEnabled
// every call goes through the client). Nothing is added to the client
// itself, so however many Limiters share it, its other commands cost what
// they did: a hook per Limiter (one that handed lone calls to the clone)
// took a PING from 21 µs to 410-708 µs with 30,000 Limiters.
func (b *batcher) directly(ctx context.Context) (redis.Scripter, bool) {
	if b.boundsReads {
		return b.rdb, true
	}
	dl, ok := ctx.Deadline() // before Done, which would make ctx's channel
	if !ok && ctx.Done() == nil {
		return b.rdb, true // it never ends
	}
	if b.lone == nil {
		return nil, false
	}
	if at := b.starved.Load(); at != 0 && time.Since(b.born)-time.Duration(at) < starvedPause {
		return nil, false // a sender waits for a late reply
	}
	// the Limiter's timeout is ctx's deadline (not a caller's sooner one,
	// nor a Wait's later one), to within an eighth: lone's reads end then
	if left := time.Until(dl); ok && left <= b.loneTimeout && left > b.loneTimeout-b.loneTimeout/8 {
		return b.lone, true
	}
	return nil, false
}

// await waits for c's reply, filled by a flusher or a sender, or for
// ctx's end (see awaitLate). A caller that leaves first leaves c to
// whoever fills it; it is not reused.
//
// The Limiter's timeout (a timeoutCtx) is waited for on a timer kept in
// c, reused from call to call, beside the caller's own context: ctx makes
// no Done channel and no timer of its own.
func (b *batcher) await(ctx context.Context, c *call) (any, error) {
	var ended <-chan struct{}
	var timeout <-chan time.Time
	if t, ok := ctx.(*timeoutCtx); ok {
		ended = t.Context.Done()
		if c.timer == nil {
			c.timer = time.NewTimer(time.Until(t.limit))
		} else {
			c.timer.Reset(time.Until(t.limit))
		}
		timeout = c.timer.C
	} else {
		ended = ctx.Done()
	}
	gone := false
	select {
	case <-c.done:
	case <-ended:
		gone = true
	case <-timeout:
		gone = true
	}
	if timeout != nil && !c.timer.Stop() {
		// fired, its value received or not: drained for the next Reset
		// (a program built with asynctimerchan=1 keeps a value sent
		// before Stop; since Go 1.23 nothing waits here)
		select {
		case <-c.timer.C:
		default:
		}
	}
	if gone {
		if _, ok, starved := awaitLate(ctx, c.done); !ok {
			return nil, starvedError(b.noReply(ctx), starved)
		}
	}
	reply, err := c.reply, c.err
	b.recycle(c)
	return reply, err
}

// errTimeout is the cause of a decision's context ending at the Limiter's
// timeout (see bounds), as opposed to the caller's own deadline.
var errTimeout = fmt.Errorf("%w", context.DeadlineExceeded)

// lateAllowance is how late a goroutine may see the Limiter's timeout and
// still be taken at its word: later than that, the process was starved of
// CPU (a flood of requests, a busy machine) while the reply may have been
// waiting for its reader just as long.
const lateAllowance = 25 * time.Millisecond

// awaitLate is called when ctx is done while a reply is awaited on done.
// When ctx ended at the Limiter's timeout and this goroutine saw it late,
// the process, not Redis, was slow: it waits on for as long as it was late,
// and again while it keeps waking late, so that a reply held up by the
// process's own overload is not taken for a Redis failure. It reports
// the value received and true, or false when none came, and whether it
// saw the process starved; a caller's own deadline or cancellation never
// waits.
func awaitLate[T any](ctx context.Context, done <-chan T) (v T, ok, starved bool) {
	select {
	case v := <-done: // the reply is in already
		return v, true, false
	default:
	}
	if !timedOut(ctx) {
		return v, false, false
	}
	late := lateBy(ctx)
	for late > lateAllowance {
		starved = true
		t := time.NewTimer(late)
		due := time.Now().Add(late)
		select {
		case v := <-done:
			t.Stop()
			return v, true, true
		case <-t.C:
		}
		late = time.Since(due)
	}
	select {
	case v := <-done:
		return v, true, starved
	default:
		return v, false, starved || busy()
	}
}

// lateBy returns how long ago ctx's deadline passed.
func lateBy(ctx context.Context) time.Duration {
	dl, _ := ctx.Deadline()
	return time.Since(dl)
}

// seenLate reports whether ctx's deadline passed more than lateAllowance
// ago.
func seenLate(ctx context.Context) bool { return lateBy(ctx) > lateAllowance }

// busyRunnable is how many runnable goroutines per P (GOMAXPROCS) make a
// process busy: its goroutines queue for the CPU, and a reply read by one
// of them waits its turn.
const busyRunnable = 8

// busy reports whether the process is saturated: more runnable goroutines
// than busyRunnable per P. A goroutine readied by the network waits behind
// them, while one readied by a timer runs first, so a timeout seen on time
// can still be the process's own delay. It reads the runtime's metrics,
// only when a call has timed out.
func busy() bool {
	s := []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return false
	}
	return s[0].Value.Uint64() > uint64(busyRunnable*runtime.GOMAXPROCS(0))
}

// errStarved marks a reply that did not come in time while the process
// was starved of CPU: the wait says nothing of Redis's health, so the
// circuit breaker does not count it (the failure mode still answers the
// call).
var errStarved = errors.New("this process was starved of CPU meanwhile")

// starvedError returns err, marked with errStarved when starved.
func starvedError(err error, starved bool) error {
	if !starved {
		return err
	}
	return fmt.Errorf("%w (%w)", err, errStarved)
}

// noReply is the error of a call that ctx ended before its reply: ctx's
// cause, and the client's last failed dial when there is a recent one (a
// probe is started to learn it; see dialErrors.suspect).
func (b *batcher) noReply(ctx context.Context) error {
	b.dials.suspect()
	return b.dials.explain(fmt.Errorf("no reply from redis: %w", cause(ctx)))
}

// runAlone runs c's script alone on the batcher's client (see runOn).
func (b *batcher) runAlone(ctx context.Context, c *call) (any, error) {
	return b.runOn(ctx, b.rdb, c)
}

// runOn runs c's script alone on rdb (the batcher's client or its lone
// clone), with ctx: FCALL when the library is loaded, else (or when the
// server lacks the function) Script.Run (EVALSHA, and EVAL when the server
// lacks the script). It notes whether Redis answered, and a failed dial.
func (b *batcher) runOn(ctx context.Context, rdb redis.Scripter, c *call) (any, error) {
	if b.lib != nil && b.lib.usable() {
		var reply any
		var err error
		if p, ok := rdb.(processor); ok && c.script.ints {
			reply, err = fcallInts(ctx, p, c)
		} else {
			reply, err = rdb.(functionCaller).FCall(ctx, c.script.fn, c.keys, c.args...).Result()
		}
		if !b.lib.refused(err) {
			b.answered(err)
			b.dials.note(ctx, err)
			return reply, err
		}
	}
	reply, err := c.script.Run(ctx, rdb, c.keys, c.args...).Result()
	b.answered(err)
	b.dials.note(ctx, err)
	return reply, err
}

// fcallInts runs c's function with FCALL, its reply read as []int64
// (script.ints), and returns the command (an *IntSliceCmd, whose Val is
// the reply; nil on error): FCall's generic reply would box every value,
// an allocation each for all but small ones.
func fcallInts(ctx context.Context, p processor, c *call) (any, error) {
	cmd := fcallIntsCmd(ctx, c.script, c.keys, c.args)
	if err := p.Process(ctx, cmd); err != nil {
		return nil, err
	}
	return cmd, nil
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

// direct sends c alone on rdb and gives its slot back when the reply is
// in.
func (b *batcher) direct(ctx context.Context, rdb redis.Scripter, c *call) (any, error) {
	reply, err := b.runOn(ctx, rdb, c)
	b.recycle(c)
	b.handOff()
	return reply, err
}

// sendLone sends c alone, as direct does, on a sender goroutine, and waits
// for its reply or ctx's end, whichever comes first: with a client that
// does not bound its reads by the context (go-redis's default), the caller
// still returns at its deadline. An idle sender takes c; when none is idle,
// a new one starts.
func (b *batcher) sendLone(ctx context.Context, c *call) (any, error) {
	select {
	case b.work <- c:
	default:
		go b.sender(c)
	}
	return b.await(ctx, c)
}

// sender is a goroutine that sends lone calls (see sendLone), the first
// one c, and exits after flusherIdle without one.
func (b *batcher) sender(c *call) {
	idle := time.NewTimer(flusherIdle)
	defer idle.Stop()
	for {
		c.reply, c.err = b.runAlone(c.ctx, c)
		b.handOff()
		c.done <- struct{}{} // buffered: the caller may be gone
		idle.Reset(flusherIdle)
		select {
		case c = <-b.work:
		case <-idle.C:
			return
		}
	}
}

// handOff ends a direct send: when calls queued meanwhile its slot goes
// to a flusher, an idle one or a new one, which sends them; unless
// maxInFlight flushers hold slots already, which send them in turn.
func (b *batcher) handOff() {
	b.mu.Lock()
	if len(b.queue) == 0 || b.flushing >= maxInFlight {
		b.inflight--
		b.mu.Unlock()
		return
	}
	b.flushing++ // the slot stays taken: a flusher sends next
	start := b.running < b.flushing
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start {
		go b.flush()
		return
	}
	b.wake <- struct{}{} // buffered for every slot
}

func (b *batcher) recycle(c *call) {
	clear(c.keys)
	clear(c.args)
	*c = call{keys: c.keys[:0], args: c.args[:0], done: c.done, timer: c.timer}
	b.calls.Put(c)
}

// flush is a flusher goroutine, started holding a slot: it sends whatever
// is queued, batch after batch; when the queue is empty it gives its slot
// back and waits to be handed one again (see handOff), and exits after
// flusherIdle without work. Several flushers send at once when direct sends
// hand their slots over while the queue fills.
func (b *batcher) flush() {
	idle := time.NewTimer(flusherIdle)
	defer idle.Stop()
	for {
		b.mu.Lock()
		batch := b.queue
		b.queue, b.spare = b.spare[:0], nil
		if len(batch) == 0 {
			b.flushing--
			b.inflight--
			b.mu.Unlock()
			idle.Reset(flusherIdle)
			select {
			case <-b.wake:
				continue
			case <-idle.C:
			}
			b.mu.Lock()
			if b.running > b.flushing {
				b.running--
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
			<-b.wake // a slot was handed over as the timer fired
			continue
		}
		b.mu.Unlock()
		b.send(batch)
		clear(batch)
		b.mu.Lock()
		if b.spare == nil {
			b.spare = batch[:0]
		}
		b.mu.Unlock()
	}
}

// maxMerged bounds the decisions merged into one script call, so that
// one call never holds the server for long.
const maxMerged = 256

// sent is one command of a batch's pipeline: one call's script, or the
// merged script of many calls.
type sent struct {
	cmd    redis.Cmder // a Cmd, or an IntSliceCmd (see script.ints)
	script *script
	keys   []string
	args   []any
	calls  []*call // more than one: merged
}

// send runs a batch and hands every caller its reply.
func (b *batcher) send(batch []*call) {
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			b.finish(c, nil, err) // its caller is gone: nothing is sent
			continue
		}
		live = append(live, c)
	}
	switch {
	case len(live) == 0:
		return
	case len(live) == 1 || b.pipe == nil:
		for _, c := range live {
			reply, err := b.runAlone(context.WithoutCancel(c.ctx), c)
			b.finish(c, reply, err)
		}
		return
	}
	// The batch is sent without a deadline (with the first caller's
	// values): each caller leaves at its own deadline, and the replies are
	// read to the end however late they come, so that a slow moment costs
	// no connection; the client's ReadTimeout ends a wait on a silent
	// server.
	ctx := context.WithoutCancel(live[0].ctx)
	cmds := b.plan(live)
	pipe := b.pipe()
	fcall := b.lib != nil && b.lib.usable()
	for _, s := range cmds {
		switch {
		case fcall && s.script.ints:
			s.cmd = fcallIntsCmd(ctx, s.script, s.keys, s.args)
			_ = pipe.Process(ctx, s.cmd)
		case fcall:
			s.cmd = pipe.FCall(ctx, s.script.fn, s.keys, s.args...)
		default:
			s.cmd = pipe.EvalSha(ctx, s.script.Hash(), s.keys, s.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	// NOSCRIPT, or an FCALL refused: the server lost the scripts (restart,
	// SCRIPT or FUNCTION FLUSH) or an ACL forbids FCALL; those commands did
	// not run, so they go again with the script's source.
	var again redis.Pipeliner
	for _, s := range cmds {
		// (nil first: HasErrorPrefix allocates even for a nil error)
		if err := s.cmd.Err(); err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || fcall && b.lib.refused(err)) {
			if again == nil {
				again = b.pipe()
			}
			s.cmd = again.Eval(ctx, s.script.src, s.keys, s.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for _, s := range cmds {
		if b.answered(s.cmd.Err()) {
			break
		}
	}
	b.dials.note(ctx, cmds[0].cmd.Err())
	var failed []*call // decisions of a merged call that failed: sent again alone
	for _, s := range cmds {
		reply, err := result(s.cmd)
		if s.script != s.calls[0].merged {
			b.finish(s.calls[0], reply, err)
			continue
		}
		total := 0
		for _, c := range s.calls {
			total += replySize(c)
		}
		if err == nil && replyLen(reply) != total {
			err = fmt.Errorf("%w: a merged call returned %T of %d values for %d calls", ErrUnexpectedReply, reply, replyLen(reply), len(s.calls))
		}
		at := 0
		var parts [][]int64 // the calls' answers read as integers (see share)
		if _, ints := reply.(*redis.IntSliceCmd); ints && err == nil {
			parts = make([][]int64, len(s.calls))
		}
		for i, c := range s.calls {
			if err != nil {
				b.finish(c, nil, err)
				continue
			}
			var part *[]int64
			if parts != nil {
				part = &parts[i]
			}
			v, ok := share(reply, at, replySize(c), part)
			at += replySize(c)
			if !ok {
				failed = append(failed, c)
				continue
			}
			b.finish(c, v, nil)
		}
	}
	b.again(failed)
}

// again sends the decisions that failed in a merged call (allow_batch.lua
// answers -1 for them: every value of its reply an integer) alone, one
// after another, so that each caller gets Redis's own error, such as
// WRONGTYPE. Decisions fail as they read, before they record anything;
// the decisions of one run (the same keys, one after another) fail alike,
// so the first one's error answers the rest, one round trip for them all.
func (b *batcher) again(failed []*call) {
	var keys []string
	var err error
	for _, c := range failed {
		if err != nil && slices.Equal(c.keys, keys) {
			b.finish(c, nil, err)
			continue
		}
		var reply any
		reply, err = b.runAlone(context.WithoutCancel(c.ctx), c)
		keys = c.keys
		b.finish(c, reply, err)
	}
}

// result returns cmd's reply: an IntSliceCmd itself (see parseAllow), else
// Cmd's.
func result(cmd redis.Cmder) (any, error) {
	switch cmd := cmd.(type) {
	case *redis.IntSliceCmd:
		if err := cmd.Err(); err != nil {
			return nil, err
		}
		return cmd, nil
	case *redis.Cmd:
		return cmd.Result()
	}
	return nil, fmt.Errorf("%w: %T", ErrUnexpectedReply, cmd)
}

// replyLen is the number of values of a merged call's reply; -1 for one
// that is not an array.
func replyLen(reply any) int {
	switch v := reply.(type) {
	case *redis.IntSliceCmd:
		return len(v.Val())
	case []any:
		return len(v)
	}
	return -1
}

// share returns the size values of a merged call's reply from at: one
// decision's answer, and false when the decision failed (-1). An answer
// read as integers is kept in *part and handed out as part (a pointer,
// boxed without an allocation; see parseAllow).
func share(reply any, at, size int, part *[]int64) (any, bool) {
	switch v := reply.(type) {
	case *redis.IntSliceCmd:
		*part = v.Val()[at : at+size : at+size]
		return part, (*part)[0] != -1
	case []any:
		part := v[at : at+size : at+size]
		n, isInt := part[0].(int64)
		return part, !isInt || n != -1
	}
	return nil, false
}

// plan turns a batch into pipeline commands: calls that name a merged
// script (allow.lua on a single server) go together, up to maxMerged per
// command (see merge); every other call is a command of its own.
func (b *batcher) plan(live []*call) []*sent {
	var cmds []*sent
	var group []*call
	for _, c := range live {
		if c.merged == nil {
			cmds = append(cmds, &sent{script: c.script, keys: c.keys, args: c.args, calls: []*call{c}})
			continue
		}
		if group = append(group, c); len(group) == maxMerged {
			cmds = append(cmds, merge(group))
			group = nil
		}
	}
	if len(group) > 0 {
		cmds = append(cmds, merge(group))
	}
	return cmds
}

// mergedHead is how many of a merged call's arguments (allow.lua's ARGV)
// differ from decision to decision: n and the time. The rest is its spec
// (commit, penalty, limits), which decisions that ask alike share.
const mergedHead = 2

// replySize is how many values a merged call's decision answers (see
// allow_batch.lua): allowed, blocked and now, then 3 per limit, of which
// its arguments hold 4 each after n, the time, commit and the penalty.
func replySize(c *call) int { return 3 + 3*(len(c.args)-mergedHead-4)/4 }

// merge makes one command of calls of the same merged script: the
// arguments allow_batch.lua takes, each distinct spec once. A lone call
// goes as it is, with its own script.
func merge(calls []*call) *sent {
	c := calls[0]
	if len(calls) == 1 {
		return &sent{script: c.script, keys: c.keys, args: c.args, calls: calls}
	}
	var specsBuf [8][]any
	specs := specsBuf[:0]
	nspec, nkeys := 0, 0
	index := make([]int, len(calls)) // each call's spec, from 1
	for i, c := range calls {
		spec := c.args[mergedHead:]
		index[i] = slices.IndexFunc(specs, func(s []any) bool { return slices.Equal(s, spec) }) + 1
		if index[i] == 0 {
			specs = append(specs, spec)
			nspec += 1 + len(spec)
			index[i] = len(specs)
		}
		nkeys += len(c.keys)
	}
	g := &sent{script: c.merged, calls: calls, keys: make([]string, 0, nkeys),
		args: make([]any, 0, 2+nspec+(1+mergedHead)*len(calls))}
	g.args = append(g.args, len(calls), len(specs))
	for _, spec := range specs {
		g.args = append(g.args, len(spec))
		g.args = append(g.args, spec...)
	}
	for i, c := range calls {
		g.keys = append(g.keys, c.keys...)
		g.args = append(g.args, index[i])
		g.args = append(g.args, c.args[:mergedHead]...)
	}
	return g
}

func (b *batcher) finish(c *call, reply any, err error) {
	if err != nil && timedOut(c.ctx) && errors.Is(err, context.DeadlineExceeded) {
		// the call's time ran out in this process's queue, before or
		// while it was sent: the process's overload, not Redis's
		err = starvedError(err, true)
	}
	c.reply, c.err = reply, err
	c.done <- struct{}{}
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
