// Package redisstore is the Redis backend of a Limiter: the algorithms as
// Lua scripts of one function library (FCALL, else EVALSHA), their storage
// keys, Check, and the transport that merges contended decisions.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
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
	//go:embed lua/own.lua
	ownLua string
)

// Store runs the algorithms as Lua scripts (FCALL once the library is
// loaded, else EVALSHA, EVAL after NOSCRIPT) through a transport.
type Store struct {
	prefix    string
	t         *transport
	limitArgs limitArgs
	scripts   []*script // every script below, in the library's order

	allowS, allowBatchS, reserveS, releaseS, resetS, blockS, refundS, ownS *script
}

var _ store.Remote = (*Store)(nil)

// New returns the store of rdb (a *redis.Client, *redis.ClusterClient,
// *redis.Ring or failover client), its keys under prefix.
func New(rdb redis.Scripter, prefix string) *Store {
	s := &Store{prefix: prefix, t: newTransport(rdb)}
	add := func(name, body string, algorithms bool) *script {
		src := body
		if algorithms {
			src = algorithmsLua + body
		}
		sc := &script{Script: redis.NewScript(src), name: name, body: body, algorithms: algorithms}
		s.scripts = append(s.scripts, sc)
		return sc
	}
	s.allowS = add("allow", allowLua, true)
	s.allowS.ints = true
	s.reserveS = add("reserve", reserveLua, true)
	s.releaseS = add("release", releaseLua, true)
	s.resetS = add("reset", resetLua, true)
	s.blockS = add("block", blockLua, true)
	s.refundS = add("refund", refundLua, true)
	s.allowBatchS = add("allow_batch", allowBatchLua, true)
	s.allowBatchS.ints = true
	s.ownS = add("own", ownLua, true)
	s.t.lib = newLibrary(rdb, algorithmsLua, s.scripts)
	return s
}

// Node names the node serving key (a Cluster's master, a Ring's shard) as
// the client knows it without a round trip; "" for a single server, or
// when unknown.
func (s *Store) Node(key string) string {
	if s.t.laneOf == nil {
		return ""
	}
	var buf [256]byte
	return s.t.laneOf(string(appendTag(buf[:0], s.prefix, key)))
}

// newCall returns a pooled call of sc with r's storage keys (see
// appendKeys) and room for its arguments.
func (s *Store) newCall(sc *script, r store.Request, own int) *call {
	c, n := s.t.calls.Get().(*call), len(r.Limits)
	if cap(c.keys) < 2+n {
		c.keys = make([]string, 0, 2+n)
	}
	if cap(c.args) < 3+2*n {
		c.args = make([]any, 0, 3+2*n)
	}
	c.script = sc
	c.keys = appendKeys(c.keys, s.prefix, r.Key, r.Limits, own)
	return c
}

// Allow decides r (allow.lua, or merged with others in allow_batch.lua).
func (s *Store) Allow(ctx context.Context, r store.Request) (store.Decision, error) {
	own := withBlock
	if r.Penalty.Denials > 0 {
		own |= withPenalty
	}
	c := s.newCall(s.allowS, r, own)
	c.merged, c.answers = s.allowBatchS, 3+3*len(r.Limits)
	c.args = append(c.args, s.spec(r), r.N)
	if r.Now != 0 {
		c.args = append(c.args, r.Now)
	}
	reply, err := s.t.route(ctx, c, r.Deadline) // not runScript: a frame fewer on every decision's way
	if err != nil {
		return store.Decision{}, s.scriptError(ctx, "allow", err)
	}
	return parseAllow(reply, r.Room())
}

// overridden is the bit of allow.lua's blocked value that says its reply
// carries the override's Counts.
const overridden = 4

// allowSize returns the length of allow.lua's reply for n limits whose
// blocked value is blocked.
func allowSize(n int, blocked int64) int {
	if blocked&overridden != 0 {
		return 3 + 4*n
	}
	return 3 + 3*n
}

// parseAllow reads allow.lua's reply {allowed, blocked, now, then per
// limit remaining, retry, reset, then under an override per limit its
// Count} into a Decision with states.
func parseAllow(reply any, states []store.State) (store.Decision, error) {
	n := len(states)
	var buf [3 + 4*4]int64
	ints, err := replyInts("allow", reply, buf[:0])
	if err != nil {
		return store.Decision{}, err
	}
	if len(ints) < 3 || len(ints) != allowSize(n, ints[1]) {
		return store.Decision{}, fmt.Errorf("%w: allow returned %d values for %d limits", store.ErrUnexpectedReply, len(ints), n)
	}
	blocked := ints[1] &^ overridden
	d := store.Decision{Allowed: ints[0] == 1, Blocked: blocked > 0, Banned: blocked == 2, At: ints[2], States: states}
	for i := range n {
		d.States[i] = store.State{Remaining: ints[3+3*i], Retry: ints[4+3*i], Reset: ints[5+3*i]}
		if ints[1]&overridden != 0 {
			d.States[i].Count = ints[3+3*n+i]
		}
	}
	return d, nil
}

// Reserve makes a reservation (reserve.lua).
func (s *Store) Reserve(ctx context.Context, r store.Request, longest int64) (store.Reservation, error) {
	c := s.newCall(s.reserveS, r, withBlock)
	c.args = append(c.args, r.N, r.Now, longest, max(r.Lead, 0), max(r.From, 0))
	for _, l := range r.Limits {
		c.args = append(c.args, l.Count, micros(l.Window))
	}
	reply, err := s.runScript(ctx, c, r.Deadline)
	if err != nil {
		return store.Reservation{}, err
	}
	ints, err := replyInts("reserve", reply, nil)
	switch {
	case err != nil:
		return store.Reservation{}, err
	case len(ints) < 2 || ints[0] == 1 && len(ints) != 3:
		return store.Reservation{}, fmt.Errorf("%w: reserve returned %d values", store.ErrUnexpectedReply, len(ints))
	}
	res := store.Reservation{OK: ints[0] == 1, Wait: ints[1]}
	if res.OK {
		res.At = ints[2]
	}
	return res, nil
}

// Release gives a reservation back (release.lua).
func (s *Store) Release(ctx context.Context, r store.Request, res store.Reservation) error {
	c := s.newCall(s.releaseS, r, 0)
	c.args = append(c.args, r.N, res.At, r.Now)
	for _, l := range r.Limits {
		c.args = append(c.args, micros(l.Window))
	}
	_, err := s.runScript(ctx, c, r.Deadline)
	return err
}

// Reset forgets r.Key under r.Limits, its block and penalty, not its
// override (reset.lua).
func (s *Store) Reset(ctx context.Context, r store.Request) error {
	c := s.newCall(s.resetS, r, withBlock|withPenalty)
	c.args = append(c.args, r.Now)
	_, err := s.runScript(ctx, c, r.Deadline)
	return err
}

// Block blocks r.Key for d (block.lua).
func (s *Store) Block(ctx context.Context, r store.Request, d time.Duration) error {
	c := s.newCall(s.blockS, store.Request{Key: r.Key}, withBlock)
	c.args = append(c.args, r.Now, micros(d))
	_, err := s.runScript(ctx, c, r.Deadline)
	return err
}

// Refund gives back units (refund.lua).
func (s *Store) Refund(ctx context.Context, r store.Request) error {
	c := s.newCall(s.refundS, r, 0)
	c.args = append(c.args, r.N, r.Now, r.At)
	for _, l := range r.Limits {
		c.args = append(c.args, s.limitArgs.entry(l).args[:]...) // algorithm, count, window, precision
	}
	reply, err := s.runScript(ctx, c, r.Deadline)
	if err != nil {
		return err
	}
	if vals, ok := reply.([]any); !ok || len(vals) != len(r.Limits) {
		return fmt.Errorf("%w: refund returned %v for %d limits", store.ErrUnexpectedReply, reply, len(r.Limits))
	}
	return nil
}

func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// runScript has the transport send c (see transport.route), by deadline at
// the latest, and returns its script's reply. It fails with the caller's
// context's end as it is, else a *store.Error, one without a reply
// explained (see checkDial).
func (s *Store) runScript(ctx context.Context, c *call, deadline time.Time) (any, error) {
	op := c.script.name // read now: c goes back to the pool in t.route
	reply, err := s.t.route(ctx, c, deadline)
	return reply, s.scriptError(ctx, op, err)
}

// scriptError returns err, the failure of the script op, as a store.Error
// (nil for none; the caller's own context's end as it is).
func (s *Store) scriptError(ctx context.Context, op string, err error) error {
	switch {
	case err == nil || ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return err
	case replied(err):
		return &store.Error{Replied: true, Err: fmt.Errorf("ratewindow: %s script: %w", op, explainRefusal(err))}
	}
	s.t.checkDial(err)
	return &store.Error{Err: s.t.explain(fmt.Errorf("ratewindow: %s script: %w", op, err))}
}

// explainRefusal wraps err with what to do when it is an error reply that
// fails every decision until someone acts on Redis; else it returns err.
func explainRefusal(err error) error {
	for _, r := range refusals {
		if redis.HasErrorPrefix(err, r.prefix) {
			return &refusal{sentinel: r.sentinel, what: r.what, err: err}
		}
	}
	return err
}

// refusals are the error replies explainRefusal explains, by prefix; a
// refused write matches store.ErrNoWrites.
var refusals = [...]struct {
	prefix, what string
	sentinel     error
}{
	{"OOM", "redis refuses writes: its used memory is above maxmemory, and its maxmemory-policy (noeviction, as the Limiter needs) evicts nothing: raise maxmemory or free memory", store.ErrNoWrites},
	{"READONLY", "redis refuses writes: the server is a read-only replica: connect to the master (a failover or Cluster client follows it)", store.ErrNoWrites},
	{"MISCONF", "redis refuses writes: its last RDB save failed and stop-writes-on-bgsave-error is yes: fix the save (disk space, permissions of dir)", store.ErrNoWrites},
	{"NOREPLICAS", "redis refuses writes: fewer replicas are connected than min-replicas-to-write requires", store.ErrNoWrites},
	{"NOPERM this user has no permissions to access one of the keys", noKeys, nil}, // Redis 7
	{"NOPERM No permissions to access a key", noKeys, nil},
	{"NOAUTH", "redis requires authentication (NOAUTH): set the client's Password (and Username for an ACL user)", nil},
	{"Protocol error: unauthenticated", "redis requires authentication (NOAUTH): set the client's Password (and Username for an ACL user)", nil}, // a command of over 10 arguments without the password
}

const noKeys = "this user's ACL does not give it the Limiter's keys: allow reading and writing ~<prefix>* (~rw:* with the default prefix; the ACL line in docs/redis.md)"

// refusal is an error reply of Redis explained by explainRefusal.
type refusal struct {
	sentinel error // store.ErrNoWrites, or nil
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

// spec returns allow.lua's ARGV[1] for r (see appendSpec); a single
// limit's without penalty, nearly every decision's, made once (see limitArgs).
func (s *Store) spec(r store.Request) any {
	if len(r.Limits) == 1 && r.Penalty.Denials == 0 {
		a := s.limitArgs.entry(r.Limits[0])
		if r.Commit {
			return a.commit
		}
		return a.peek
	}
	return string(appendSpec(make([]byte, 0, 16+32*len(r.Limits)), r.Commit, r.Penalty, r.Limits))
}

// appendSpec appends allow.lua's spec (see spec_of there): commit, the
// penalty, then each limit's 4 values.
func appendSpec(b []byte, commit bool, p store.Penalty, limits []store.Limit) []byte {
	c := byte('0')
	if commit {
		c = '1'
	}
	b = appendSpaced(append(b, c), p.Denials, micros(p.Within), micros(p.Ban))
	for _, l := range limits {
		b = appendSpaced(b, int64(l.Algorithm), l.Count, micros(l.Window), micros(l.Step()))
	}
	return b
}

// appendSpaced appends " <v>" for each of vs.
func appendSpaced(b []byte, vs ...int64) []byte {
	for _, v := range vs {
		b = strconv.AppendInt(append(b, ' '), v, 10)
	}
	return b
}

// limitArgs caches the boxed script arguments and single-limit specs of
// recent limits: a slot a limit, by its hash, taken over on a miss; no lock.
type limitArgs [limitArgSlots]atomic.Pointer[limitArg]

const limitArgSlots = 32 // a service's rules use a few limits

type limitArg struct {
	limit        store.Limit
	args         [4]any
	commit, peek any // the spec of a decision under this limit alone
}

func (c *limitArgs) entry(l store.Limit) *limitArg {
	h := uint64(l.Count)*0x9e3779b97f4a7c15 ^ uint64(l.Window)*0xbf58476d1ce4e5b9 ^
		uint64(l.Precision)*0x94d049bb133111eb ^ uint64(l.Algorithm)
	slot := &c[(h>>32)%limitArgSlots]
	if a := slot.Load(); a != nil && a.limit == l {
		return a
	}
	a := &limitArg{limit: l, args: [4]any{int(l.Algorithm), l.Count, micros(l.Window), micros(l.Step())}}
	commit := string(appendSpec(nil, true, store.Penalty{}, []store.Limit{l}))
	a.commit, a.peek = commit, "0"+commit[1:]
	slot.Store(a)
	return a
}

// replyInts returns script op's reply as integers: an IntSliceCmd (FCALL
// with script.ints), *[]int64 (a merged call's share), or []any (EVALSHA)
// appended to buf; anything but numbers is an unexpected reply, never a panic.
func replyInts(op string, reply any, buf []int64) ([]int64, error) {
	switch reply := reply.(type) {
	case *redis.IntSliceCmd:
		return reply.Val(), nil
	case *[]int64:
		return *reply, nil
	case []any:
		for i, v := range reply {
			switch v := v.(type) {
			case int64:
				buf = append(buf, v)
			case string:
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: value %d is %q", store.ErrUnexpectedReply, i, v)
				}
				buf = append(buf, n)
			default:
				return nil, fmt.Errorf("%w: value %d is %T", store.ErrUnexpectedReply, i, v)
			}
		}
		return buf, nil
	}
	return nil, fmt.Errorf("%w: %s returned %T", store.ErrUnexpectedReply, op, reply)
}
