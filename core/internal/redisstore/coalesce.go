package redisstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// maxMerged bounds a merged call, so that it never holds the server long.
const maxMerged = 256

// sent is one command of a batch: one caller's call, or many merged.
type sent struct {
	cmd   redis.Cmder // a Cmd, or an IntSliceCmd (see script.ints)
	out   *call       // what goes out: calls[0], or an allow_batch call merging calls
	calls []*call
}

// live returns, in batch's array, the calls still awaited; it answers the rest.
func (t *transport) live(batch []*call) []*call {
	live, now := batch[:0], time.Now()
	for _, c := range batch {
		if err := ended(c.ctx, c.limit, now); err != nil {
			t.finish(c, nil, err)
		} else {
			live = append(live, c)
		}
	}
	return live
}

// send runs a batch and hands every caller its reply.
func (t *transport) send(batch []*call) {
	live := t.live(batch)
	if len(live) == 0 {
		return
	}
	// No deadline: each caller leaves at its own, and the replies are read
	// to the end so that a slow moment costs no connection; the client's
	// ReadTimeout ends a wait on a silent server.
	ctx := context.WithoutCancel(live[0].ctx)
	if len(live) == 1 { // no plan: 3 allocations fewer a decision at 3 goroutines (13-14 against 16-17)
		reply, err := t.runOne(ctx, t.rdb, live[0])
		t.finish(live[0], reply, err)
		return
	}
	cmds := t.plan(live)
	if len(cmds) == 1 || t.pipe == nil { // one command, or a Scripter without pipelines: each alone
		for _, s := range cmds {
			reply, err := t.runOne(ctx, t.rdb, s.out)
			t.again(t.answer(s, reply, err))
		}
		return
	}
	pipe, err := t.pipe(tag(live[0]))
	if err != nil { // a Ring closed, or its shards down
		for _, c := range live {
			t.finish(c, nil, err)
		}
		return
	}
	lib := t.lib != nil && t.lib.usable()
	for _, s := range cmds {
		if lib {
			s.cmd = fcall(ctx, pipe, s.out)
		} else {
			s.cmd = pipe.EvalSha(ctx, s.out.script.Hash(), s.out.keys, s.out.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	// NOSCRIPT, or an FCALL refused: those commands did not run, so they go
	// again as EVAL (nil first: HasErrorPrefix allocates even for a nil error).
	var again redis.Pipeliner
	for _, s := range cmds {
		if err := s.cmd.Err(); err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || lib && t.lib.refused(err)) {
			if again == nil {
				if again, err = t.pipe(tag(live[0])); err != nil {
					break // the ring closed since: the commands keep their errors
				}
			}
			s.cmd = s.out.script.Eval(ctx, again, s.out.keys, s.out.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	var failed []*call // decisions of a merged call that failed: sent again alone
	for _, s := range cmds {
		reply, err := result(s.cmd)
		failed = append(failed, t.answer(s, reply, err)...)
	}
	t.again(failed)
}

// answer hands s's callers their replies; it returns the merged ones that
// failed, each to be sent again alone.
func (t *transport) answer(s *sent, reply any, err error) (failed []*call) {
	if s.out == s.calls[0] { // not merged
		t.finish(s.calls[0], reply, err)
		return nil
	}
	var ints []int64 // the calls' answers, in turn
	if err == nil {
		ints, err = replyInts("a merged call", reply, nil)
	}
	at := 0 // where the next call's answer starts: one under an override is longer (allowSize)
	for _, c := range s.calls {
		if at+3 > len(ints) {
			at = -1 // too short
			break
		}
		at += allowSize((c.answers-3)/3, ints[at+1])
	}
	if err == nil && at != len(ints) {
		err = fmt.Errorf("%w: a merged call returned %T of %d values for %d calls", store.ErrUnexpectedReply, reply, len(ints), len(s.calls))
	}
	switch {
	case err != nil && redis.HasErrorPrefix(err, "NOPERM"):
		return s.calls // the ACL refused a key of the call, not each: each goes alone
	case err != nil:
		for _, c := range s.calls {
			t.finish(c, nil, err)
		}
		return nil
	}
	parts := make([][]int64, len(s.calls)) // a call's reply is &parts[i]: a pointer boxes without allocating
	for i, c := range s.calls {
		n := allowSize((c.answers-3)/3, ints[1])
		parts[i], ints = ints[:n:n], ints[n:]
		if parts[i][0] == -1 { // it failed
			failed = append(failed, c)
		} else {
			t.finish(c, &parts[i], nil)
		}
	}
	return failed
}

// again sends alone the decisions that failed in a merged call (-1:
// WRONGTYPE..., or the whole call's NOPERM), for Redis's own error. A
// decision fails before it records anything, and alike on the same keys: a
// run's first error answers the rest.
func (t *transport) again(failed []*call) {
	var keys []string // the last call's, copied: a finished call is its caller's to reuse
	var err error
	for _, c := range failed {
		if err != nil && slices.Equal(c.keys, keys) {
			t.finish(c, nil, err)
			continue
		}
		var reply any
		reply, err = t.runOne(context.WithoutCancel(c.ctx), t.rdb, c)
		keys = append(keys[:0], c.keys...)
		t.finish(c, reply, err)
	}
}

// result returns cmd's reply: a Cmd's value, an IntSliceCmd itself (see parseAllow).
func result(cmd redis.Cmder) (any, error) {
	if c, ok := cmd.(*redis.Cmd); ok {
		return c.Result()
	}
	if err := cmd.Err(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// plan turns a batch into commands, sent in one pipeline: the decisions
// merged into allow_batch.lua calls of maxMerged at most (which answer a run
// on one hot key by one check; on a Cluster or Ring, a group per hash tag: a
// script touches one slot), every other call alone.
func (t *transport) plan(live []*call) []*sent {
	var cmds []*sent
	groups := [][]*call{nil} // one server: one group
	var at map[string]int    // a tag's group
	for _, c := range live {
		if c.merged == nil {
			cmds = append(cmds, &sent{out: c, calls: []*call{c}})
			continue
		}
		i := 0
		if t.laneOf != nil {
			var ok bool
			if i, ok = at[tag(c)]; !ok {
				if at == nil {
					at = map[string]int{}
				}
				i, groups = len(groups), append(groups, nil)
				at[tag(c)] = i
			}
		}
		if groups[i] = append(groups[i], c); len(groups[i]) == maxMerged {
			cmds = append(cmds, merge(groups[i]))
			groups[i] = nil
		}
	}
	for _, g := range groups {
		if len(g) > 0 {
			cmds = append(cmds, merge(g))
		}
	}
	return cmds
}

// merge makes one allow_batch.lua command of calls; a single call goes as is.
func merge(calls []*call) *sent {
	c := calls[0]
	if len(calls) == 1 {
		return &sent{out: c, calls: calls}
	}
	var specsBuf [8]any
	specs := specsBuf[:0] // allow.lua's ARGV[1], each once
	nkeys := 0
	index := make([]int, len(calls)) // each call's spec, from 1
	for i, c := range calls {
		index[i] = slices.Index(specs, c.args[0]) + 1
		if index[i] == 0 {
			specs = append(specs, c.args[0])
			index[i] = len(specs)
		}
		nkeys += len(c.keys)
	}
	g := &call{script: c.merged, keys: make([]string, 0, nkeys), args: make([]any, 0, 2+len(specs)+3*len(calls))}
	g.args = append(g.args, len(calls), len(specs))
	g.args = append(g.args, specs...)
	for i, c := range calls {
		g.keys = append(g.keys, c.keys...)
		now := any(0) // allow.lua's ARGV[3], absent: the server's TIME
		if len(c.args) > 2 {
			now = c.args[2]
		}
		g.args = append(g.args, index[i], c.args[1], now)
	}
	return &sent{out: g, calls: calls}
}
