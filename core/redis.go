package core

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/algorithms.lua
	algorithmsLua string
	//go:embed lua/allow.lua
	allowLua string
	//go:embed lua/allow_batch.lua
	allowBatchLua string
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/reset.lua
	resetLua string
	//go:embed lua/block.lua
	blockLua string
	//go:embed lua/refund.lua
	refundLua string
)

// redisStore runs the algorithms as Lua scripts: one FCALL per call once
// their function library is loaded (see library), else one EVALSHA, with an
// EVAL when the server has not cached the script (NOSCRIPT). Calls from
// concurrent goroutines share round trips through the transport.
type redisStore struct {
	rdb                                                 redis.Scripter
	prefix                                              string
	allowS, reserveS, releaseS, resetS, blockS, refundS *script
	t                                                   *transport
	// allowBatchS runs the allow calls of one batch in one script call; nil
	// unless rdb is a single server (a Cluster or Ring spreads the keys).
	allowBatchS *script
	limitArgs   limitArgs
	// known is a context that has ended: a lookup with it answers from
	// the client's state, sending nothing (see masterOf)
	known context.Context
}

// newRedisStore returns the scripts' store on rdb, for calls bounded by
// the given timeouts (0: none).
func newRedisStore(rdb redis.Scripter, prefix string, timeouts ...time.Duration) *redisStore {
	s := &redisStore{rdb: rdb, prefix: prefix, t: newTransport(rdb, timeouts...)}
	known, cancel := context.WithCancel(context.Background())
	cancel()
	s.known = known
	var scripts []libraryScript
	add := func(name, body string, algorithms bool) *script {
		src := body
		if algorithms {
			src = algorithmsLua + body
		}
		sc := newScript(src)
		scripts = append(scripts, libraryScript{sc, name, body, algorithms})
		return sc
	}
	s.allowS = add("allow", allowLua, true)
	s.allowS.ints = true
	s.reserveS = add("reserve", reserveLua, true)
	s.releaseS = add("release", releaseLua, true)
	s.resetS = add("reset", resetLua, false)
	s.blockS = add("block", blockLua, true)
	s.refundS = add("refund", refundLua, true)
	allowBatch := add("allow_batch", allowBatchLua, true)
	allowBatch.ints = true
	if _, single := rdb.(*redis.Client); single { // also NewFailoverClient
		s.allowBatchS = allowBatch
	}
	if _, ok := rdb.(functionCaller); ok {
		s.t.lib = newLibrary(rdb, algorithmsLua, scripts)
	}
	return s
}

// masterOf returns the address of the master that serves key's hash slot
// on a Cluster, as far as the client knows it without a round trip (see
// known); "" when it does not.
func (s *redisStore) masterOf(key string) string {
	var buf [256]byte
	m, err := s.rdb.(*redis.ClusterClient).MasterForKey(s.known, string(appendTag(buf[:0], s.prefix, key)))
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

// newCall returns a transport call of script s with the storage keys of q's
// limits, after q's own keys named by own (see appendKeys).
func (s *redisStore) newCall(sc *script, q *query, own int) *call {
	c := s.t.newCall(len(q.limits))
	c.script = sc
	c.keys = appendKeys(c.keys, s.prefix, q.key, q.limits, own)
	return c
}

func (s *redisStore) allow(ctx context.Context, q *query) error { return s.allowWithin(ctx, q, 0) }

// allowWithin is allow, bounded by d as well (0: ctx alone) without a
// context of its own for a queued call (see transport.run).
func (s *redisStore) allowWithin(ctx context.Context, q *query, d time.Duration) error {
	reply, err := s.t.run(ctx, s.allowCall(q), d)
	if err != nil {
		return scriptError("allow", err)
	}
	return parseAllow(reply, q)
}

// allowCall builds the transport call of q's decision (allow.lua, or merged
// with others in allow_batch.lua).
func (s *redisStore) allowCall(q *query) *call {
	own := withBlock
	if q.penalty != nil {
		own |= withPenalty
	}
	c := s.newCall(s.allowS, q, own)
	c.merged = s.allowBatchS
	commit := 0
	if q.commit {
		commit = 1
	}
	c.args = append(c.args, q.n, q.now, commit)
	if p := q.penalty; p != nil {
		c.args = append(c.args, p.Denials, micros(p.Within), micros(p.Ban))
	} else {
		c.args = append(c.args, 0, 0, 0)
	}
	c.args = s.appendLimitArgs(c.args, q.limits)
	return c
}

// parseAllow reads allow.lua's reply into q: {allowed, blocked, now, then
// per limit remaining, retry, reset}. FCALL reads it as integers (see
// script.ints): a single call's comes as its IntSliceCmd, a merged call's
// share as *[]int64 (pointers: boxed without an allocation); EVALSHA's
// comes as []any.
func parseAllow(reply any, q *query) error {
	var buf [3 + 3*4]int64
	var ints []int64
	switch vals := reply.(type) {
	case *redis.IntSliceCmd:
		ints = vals.Val()
	case *[]int64:
		ints = *vals
	case []any:
		var err error
		if ints, err = appendInts(buf[:0], vals); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: allow returned %T", ErrUnexpectedReply, reply)
	}
	if len(ints) != 3+3*len(q.limits) {
		return fmt.Errorf("%w: allow returned %d values for %d limits", ErrUnexpectedReply, len(ints), len(q.limits))
	}
	states := q.decided(ints[0] == 1)
	q.blocked, q.banned, q.at = ints[1] > 0, ints[1] == 2, ints[2]
	for i := range states {
		states[i] = limitState{remaining: ints[3+3*i], retry: ints[4+3*i], reset: ints[5+3*i]}
	}
	return nil
}

func (s *redisStore) reserve(ctx context.Context, q *query, longest int64) (reservation, error) {
	c := s.newCall(s.reserveS, q, withBlock)
	c.args = append(c.args, q.n, q.now, longest)
	for _, l := range q.limits {
		c.args = append(c.args, l.Count, micros(l.Window))
	}
	reply, err := s.t.run(ctx, c, 0)
	if err != nil {
		return reservation{}, scriptError("reserve", err)
	}
	vals, ok := reply.([]any)
	if !ok {
		return reservation{}, fmt.Errorf("%w: reserve returned %T", ErrUnexpectedReply, reply)
	}
	ints, err := appendInts(nil, vals)
	if err != nil {
		return reservation{}, err
	}
	if len(ints) < 2 {
		return reservation{}, fmt.Errorf("%w: reserve returned %d values", ErrUnexpectedReply, len(ints))
	}
	r := reservation{ok: ints[0] == 1, wait: ints[1]}
	if r.ok {
		if len(ints) != 3 {
			return reservation{}, fmt.Errorf("%w: reserve returned %d values", ErrUnexpectedReply, len(ints))
		}
		r.at = ints[2]
	}
	return r, nil
}

func (s *redisStore) release(ctx context.Context, q *query, r reservation) error {
	c := s.newCall(s.releaseS, q, 0)
	c.args = append(c.args, q.n, r.at, q.now)
	for _, l := range q.limits {
		c.args = append(c.args, micros(l.Window))
	}
	if _, err := s.t.run(ctx, c, 0); err != nil {
		return scriptError("release", err)
	}
	return nil
}

func (s *redisStore) reset(ctx context.Context, q *query) error {
	if _, err := s.t.run(ctx, s.newCall(s.resetS, q, withBlock|withPenalty), 0); err != nil {
		return scriptError("reset", err)
	}
	return nil
}

func (s *redisStore) block(ctx context.Context, q *query, d int64) error {
	c := s.newCall(s.blockS, q, withBlock)
	c.args = append(c.args, q.now, d)
	if _, err := s.t.run(ctx, c, 0); err != nil {
		return scriptError("block", err)
	}
	return nil
}

func (s *redisStore) refund(ctx context.Context, q *query) error {
	c := s.newCall(s.refundS, q, 0)
	c.args = append(c.args, q.n, q.now, q.at)
	c.args = s.appendLimitArgs(c.args, q.limits)
	reply, err := s.t.run(ctx, c, 0)
	if err != nil {
		return scriptError("refund", err)
	}
	if vals, ok := reply.([]any); !ok || len(vals) != len(q.limits) {
		return fmt.Errorf("%w: refund returned %v for %d limits", ErrUnexpectedReply, reply, len(q.limits))
	}
	return nil
}

// scriptError is the error of a script call named op that failed with err.
func scriptError(op string, err error) error {
	return fmt.Errorf("ratewindow: %s script: %w", op, explainRefusal(err))
}

// explainRefusal returns err with what it means and what to do when it is
// one of Redis's error replies that fail every decision until someone acts
// on Redis: a write refused (see ErrNoWrites, which the result matches),
// or a client without the password Redis requires, which Redis answers
// with NOAUTH, or for a command of more than 10 arguments (a decision's)
// with "Protocol error: unauthenticated multibulk length". Any other error
// is returned as it is. Redis's reply stays in the chain.
func explainRefusal(err error) error {
	for _, r := range refusals {
		if redis.HasErrorPrefix(err, r.prefix) {
			return &refusal{sentinel: r.sentinel, what: r.what, err: err}
		}
	}
	return err
}

// refusals are the error replies explainRefusal explains, by prefix.
var refusals = [...]struct {
	prefix, what string
	sentinel     error
}{
	{"OOM", "redis refuses writes: its used memory is above maxmemory, and its maxmemory-policy (noeviction, as the Limiter needs) evicts nothing: raise maxmemory or free memory", ErrNoWrites},
	{"READONLY", "redis refuses writes: the server is a read-only replica: connect to the master (a failover or Cluster client follows it)", ErrNoWrites},
	{"MISCONF", "redis refuses writes: its last RDB save failed and stop-writes-on-bgsave-error is yes: fix the save (disk space, permissions of dir)", ErrNoWrites},
	{"NOREPLICAS", "redis refuses writes: fewer replicas are connected than min-replicas-to-write requires", ErrNoWrites},
	{"NOAUTH", "redis requires authentication (NOAUTH): set the client's Password (and Username for an ACL user)", nil},
	{"Protocol error: unauthenticated", "redis requires authentication (NOAUTH): set the client's Password (and Username for an ACL user)", nil},
}

// refusal is an error reply of Redis explained by explainRefusal.
type refusal struct {
	sentinel error // ErrNoWrites, or nil
	what     string
	err      error // Redis's reply
}

func (e *refusal) Error() string { return e.what + ": " + e.err.Error() }

func (e *refusal) Unwrap() []error {
	if e.sentinel == nil {
		return []error{e.err}
	}
	return []error{e.sentinel, e.err}
}

// appendLimitArgs appends the 4 script arguments of each limit, as
// allow.lua and refund.lua take them: algorithm (0 log, 1 buckets, 2
// counter), count, window µs, precision µs. They come boxed from
// s.limitArgs.
func (s *redisStore) appendLimitArgs(args []any, limits []Limit) []any {
	for _, l := range limits {
		args = append(args, s.limitArgs.of(l)[:]...)
	}
	return args
}

// limitArgs keeps the script arguments of the limits used lately, boxed
// once: boxing a number into an argument allocates (for all but small
// ones), three times a limit on every call otherwise. A limit has one
// slot, by a hash of it, and takes it over on a miss; the slots are read
// and written without a lock.
type limitArgs [limitArgSlots]atomic.Pointer[limitArg]

// limitArgSlots is how many limits limitArgs holds at most: a service's
// rules use a few.
const limitArgSlots = 32

// limitArg is a limit (what its arguments depend on) and its arguments.
type limitArg struct {
	count             int64
	window, precision time.Duration
	algorithm         Algorithm
	args              [4]any
}

// of returns l's arguments.
func (c *limitArgs) of(l Limit) *[4]any {
	h := uint64(l.Count)*0x9e3779b97f4a7c15 ^ uint64(l.Window)*0xbf58476d1ce4e5b9 ^
		uint64(l.Precision)*0x94d049bb133111eb ^ uint64(l.Algorithm)
	slot := &c[(h>>32)%limitArgSlots]
	if a := slot.Load(); a != nil && a.count == l.Count && a.window == l.Window && a.precision == l.Precision && a.algorithm == l.Algorithm {
		return &a.args
	}
	a := &limitArg{count: l.Count, window: l.Window, precision: l.Precision, algorithm: l.Algorithm,
		args: [4]any{int(l.Algorithm), l.Count, micros(l.Window), micros(l.precision())}}
	slot.Store(a)
	return &a.args
}

// appendInts appends a script's reply, converted to integers, to dst. Lua
// numbers arrive as int64; anything else is an unexpected reply, never a
// panic.
func appendInts(dst []int64, reply []any) ([]int64, error) {
	for i, v := range reply {
		switch v := v.(type) {
		case int64:
			dst = append(dst, v)
		case string:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: value %d is %q", ErrUnexpectedReply, i, v)
			}
			dst = append(dst, n)
		default:
			return nil, fmt.Errorf("%w: value %d is %T", ErrUnexpectedReply, i, v)
		}
	}
	return dst, nil
}
