// Package memstore is a Limiter's memory backend (a store.Store): the
// algorithms of redisstore/lua/algorithms.lua in Go, with the same numbers
// (package storetest is the suite both backends pass).
package memstore

import (
	"cmp"
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// Store is safe for concurrent use: keys, held in store.HeldKey's form, are
// spread over mutex-guarded shards. Expired state is dropped when a key is
// touched, and a few keys of a shard every sweepEvery-th call, so memory
// follows the live keys. It never waits and its methods return no error.
type Store struct {
	seed   maphash.Seed
	clock  func() int64 // µs since the epoch
	calls  atomic.Uint64
	shards [memShards]memShard
	ops    ops // what the operating methods keep beside the keys (operate.go)
}

const (
	memShards   = 64
	sweepEvery  = 64 // calls between two sweeps (of the next shard in turn)
	sweepKeys   = 16 // keys checked by one sample
	sweepRounds = 16 // samples in one sweep, at most
)

type memShard struct {
	mu   sync.Mutex
	keys map[string]*memKey
}

// memKey holds the state of every limit used with one key; times in µs.
type memKey struct {
	states              []*memState
	blocked             int64 // the end of the key's block (none: 0 or past)
	denials, denialsEnd int64 // the penalty's count, until denialsEnd
	expires             int64 // the latest of its states', block's and denials' ends
	override            *override
}

// memState is one limit's state: buckets of prec µs. A sliding log's are
// 1µs, its units at t in the one ending at t (see bucketOf); a sliding
// counter's are its fixed windows, the previous and the current one. So
// every algorithm is added to, refunded and expired alike.
type memState struct {
	alg          store.Algorithm
	span, step   time.Duration // the exact window and bucket: the state's identity, as the Redis key's
	window, prec int64         // µs
	buckets      []bucket      // ascending by index
	w            int64         // a sliding counter's window at its last write, as the script stores it
}

type bucket struct{ index, count int64 }

// New returns an empty memory store; clock (µs since the epoch) is read for
// a Request whose Now is 0.
func New(clock func() int64) *Store {
	s := &Store{seed: maphash.MakeSeed(), clock: clock}
	for i := range s.shards {
		s.shards[i].keys = make(map[string]*memKey)
	}
	return s
}

func (s *Store) shard(key string) *memShard {
	return &s.shards[maphash.String(s.seed, key)%memShards]
}

// lock returns key's shard locked, the key held, and the call's time (now,
// or the clock's); every sweepEvery-th call first sweeps the next shard.
func (s *Store) lock(key string, now int64) (*memShard, string, int64) {
	key = store.HeldKey(key)
	if now == 0 {
		now = s.clock()
	}
	if n := s.calls.Add(1); n%sweepEvery == 0 {
		if sh := &s.shards[(n/sweepEvery)%memShards]; sh.mu.TryLock() {
			sh.sweep(now)
			sh.mu.Unlock()
		}
	}
	sh := s.shard(key)
	sh.mu.Lock()
	return sh, key, now
}

// sweep drops expired keys as Redis's active expiry does: sweepKeys keys
// at a time, again while over a quarter had expired, at most sweepRounds times.
func (sh *memShard) sweep(now int64) {
	for range sweepRounds {
		sampled, expired := 0, 0
		for k, mk := range sh.keys {
			if mk.expires <= now {
				delete(sh.keys, k)
				expired++
			}
			if sampled++; sampled == sweepKeys {
				break
			}
		}
		if expired*4 <= sampled {
			return
		}
	}
}

// states returns the state of each limit of key (a held key), created when
// missing, and the µs the key stays blocked (0: not blocked).
func (sh *memShard) states(key string, limits []store.Limit, now int64, dst []*memState) ([]*memState, int64) {
	mk := sh.key(key)
	blocked := max(mk.blocked-now, 0)
	for _, l := range limits {
		st := mk.find(l)
		if st == nil {
			st = &memState{alg: l.Algorithm, span: l.Window, step: stateStep(l), window: l.Window.Microseconds()}
			st.prec = st.step.Microseconds()
			mk.states = append(mk.states, st)
		}
		dst = append(dst, st) // expired buckets go in check, which every caller runs
	}
	return dst, blocked
}

// key returns the state of key (a held key), created when missing.
func (sh *memShard) key(key string) *memKey {
	mk := sh.keys[key]
	if mk == nil {
		mk = &memKey{}
		sh.keys[store.OwnKey(key)] = mk
	}
	return mk
}

// find returns the state of limit l, or nil (always for a nil mk).
func (mk *memKey) find(l store.Limit) *memState {
	if mk == nil {
		return nil
	}
	step := stateStep(l)
	for _, st := range mk.states {
		if st.alg == l.Algorithm && st.span == l.Window && st.step == step {
			return st
		}
	}
	return nil
}

// stateStep is the bucket length of l's state: 1µs for SlidingLog, the
// window for SlidingCounter. With the algorithm and the window it tells
// limits' states apart (not their µs: windows a nanosecond apart have keys
// of their own in Redis).
func stateStep(l store.Limit) time.Duration {
	switch l.Algorithm {
	case store.SlidingLog:
		return time.Microsecond
	case store.SlidingBuckets:
		return l.Step()
	}
	return l.Window
}

// bucketOf returns the index of the bucket of the µs t, which is after the
// epoch (as in Redis, which takes its TIME for a Now of 0 or less).
func (st *memState) bucketOf(t int64) int64 {
	if st.alg == store.SlidingLog {
		t-- // the bucket ending at t
	}
	return t / st.prec
}

// unlock ends every call that locked the shard: it updates key's expiry
// after its states changed, forgetting it once all of it has ended, and unlocks.
func (sh *memShard) unlock(key string, now int64) {
	if mk := sh.keys[key]; mk != nil {
		mk.expires = max(mk.blocked, mk.denialsEnd, mk.override.end())
		for _, st := range mk.states {
			mk.expires = max(mk.expires, st.end())
		}
		if mk.expires <= now {
			delete(sh.keys, key)
		}
	}
	sh.mu.Unlock()
}

// check mirrors the *_check functions of algorithms.lua.
func (st *memState) check(count, n, now int64) (free, retry, reset int64) {
	st.drop(now)
	if st.alg == store.SlidingCounter {
		free, retry = st.counterCheck(count, n, now)
	} else {
		free, retry = st.bucketsCheck(count, n, now)
	}
	return free, retry, max(st.end()-now, 0)
}

// add mirrors the *_add functions of algorithms.lua; it returns the reset.
func (st *memState) add(n, t, now int64) int64 {
	st.wrote(now)
	b := st.bucketOf(t)
	i, found := slices.BinarySearchFunc(st.buckets, b, func(x bucket, b int64) int { return cmp.Compare(x.index, b) })
	if found {
		st.buckets[i].count += n
	} else {
		st.buckets = slices.Insert(st.buckets, i, bucket{b, n})
	}
	return st.end() - now
}

// end returns when the state is empty again (µs): the end of its newest
// bucket's window, 0 when it holds nothing.
func (st *memState) end() int64 {
	if len(st.buckets) == 0 {
		return 0
	}
	return (st.buckets[len(st.buckets)-1].index+1)*st.prec + st.window
}

// wrote notes a counter's write at now (see drop).
func (st *memState) wrote(now int64) {
	if st.alg == store.SlidingCounter {
		st.w = st.bucketOf(now)
	}
}

// drop forgets the buckets that left the window at now. A counter last
// written in a later window than now's (the clock went back) starts afresh.
func (st *memState) drop(now int64) {
	// Scan from the front rather than bisect: usually no bucket or one has
	// left since the last call.
	i := 0
	for i < len(st.buckets) && (st.buckets[i].index+1)*st.prec <= now-st.window {
		i++
	}
	st.buckets = slices.Delete(st.buckets, 0, i)
	if st.alg == store.SlidingCounter && st.w > st.bucketOf(now) {
		st.buckets = st.buckets[:0]
	}
}

// bucketsCheck and counterCheck return the units free and the retry of
// what drop left.
func (st *memState) bucketsCheck(count, n, now int64) (free, retry int64) {
	var used int64
	for _, b := range st.buckets {
		used += b.count
	}
	if n > count {
		retry = -1
	} else if over := used + n - count; over > 0 {
		for _, b := range st.buckets {
			if over -= b.count; over <= 0 {
				retry = (b.index+1)*st.prec + st.window - now
				break
			}
		}
	}
	return max(count-used, 0), retry
}

// counterCheck computes in float64, as the Lua script does in its doubles:
// Count × Window in µs overflows int64 for large limits.
func (st *memState) counterCheck(count, n, now int64) (free, retry int64) {
	c, w := st.bucketOf(now), st.window
	var prev, cur int64
	for _, b := range st.buckets { // the windows c-1 and c
		if b.index == c {
			cur = b.count
		} else {
			prev = b.count
		}
	}
	elapsed := now - c*w
	fw, fcount := float64(w), float64(count)
	weighted := float64(prev) * float64(w-elapsed)
	free = int64(max(min(math.Floor((fcount*fw-weighted-float64(cur)*fw)/fw), fcount), 0))
	switch {
	case n > count:
		retry = -1
	case weighted+float64(cur+n)*fw <= fcount*fw:
	case cur+n <= count:
		// later in this window: prev×(w−e) ≤ (count−n−cur)×w
		e := w - int64(math.Floor(float64(count-n-cur)*fw/float64(prev)))
		retry = e - elapsed
	default:
		// in the next window, where this one's count is the previous one
		e := w - int64(math.Floor(float64(count-n)*fw/float64(cur)))
		retry = (c+1)*w - now + e
	}
	return free, retry
}

// Allow mirrors decide in algorithms.lua: a blocked key is denied under
// every limit, with a retry and reset of at least the block's time left.
func (s *Store) Allow(_ context.Context, r store.Request) (store.Decision, error) {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	var buf [4]*memState
	mstates, blocked := sh.states(key, r.Limits, now, buf[:0])
	d := store.Decision{Allowed: blocked == 0, Blocked: blocked > 0, At: now, States: r.Room()}
	mk := sh.keys[key]
	for i, st := range mstates {
		count, over := mk.override.count(r.Limits[i], now)
		f, retry, z := st.check(count, r.N, now)
		d.States[i] = store.State{Remaining: f, Retry: retry, Reset: z, Count: over}
		d.Allowed = d.Allowed && retry == 0
	}
	if p := r.Penalty; p.Denials > 0 && !d.Allowed && r.Commit && blocked == 0 {
		if blocked = sh.penalize(key, p, now); blocked > 0 {
			d.Blocked, d.Banned = true, true
		}
	}
	for i, st := range mstates {
		ls := &d.States[i]
		if d.Allowed && r.Commit {
			ls.Reset = st.add(r.N, now, now)
			ls.Remaining -= r.N
		}
		if blocked > 0 {
			ls.Remaining = 0
			if ls.Retry >= 0 {
				ls.Retry = max(ls.Retry, blocked)
			}
			ls.Reset = max(ls.Reset, blocked)
		}
	}
	return d, nil
}

// penalize mirrors penalize in algorithms.lua; it returns the ban's µs (0: none).
func (sh *memShard) penalize(key string, p store.Penalty, now int64) int64 {
	mk := sh.keys[key]
	if mk.denialsEnd <= now {
		mk.denials, mk.denialsEnd = 0, now+p.Within.Microseconds()
	}
	if mk.denials++; mk.denials < p.Denials {
		return 0
	}
	mk.denials, mk.denialsEnd = 0, 0
	mk.blocked = max(mk.blocked, now+p.Ban.Microseconds())
	return mk.blocked - now
}

// Refund mirrors refund.lua.
func (s *Store) Refund(_ context.Context, r store.Request) error {
	return s.refund(r, r.At, false)
}

// refund gives back up to r.N units of each limit, the newest first: those
// at at (0: any), and none ahead of now unless reserved (see Release).
func (s *Store) refund(r store.Request, at int64, reserved bool) error {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	sh.refund(key, r, at, now, reserved)
	return nil
}

// refund is Store.refund, the key locked.
func (sh *memShard) refund(key string, r store.Request, at, now int64, reserved bool) {
	for _, l := range r.Limits {
		st, n := sh.keys[key].find(l), r.N
		if st == nil {
			continue
		}
		st.drop(now)
		for i := len(st.buckets) - 1; i >= 0 && n > 0; i-- {
			b := &st.buckets[i]
			if (reserved || b.index <= st.bucketOf(now)) && (at == 0 || b.index == st.bucketOf(at)) {
				took := min(n, b.count)
				if b.count -= took; b.count == 0 {
					st.buckets = slices.Delete(st.buckets, i, i+1)
				}
				n -= took
				st.wrote(now)
			}
		}
	}
}

// Reserve mirrors reserve.lua: the units wait for any block of the key too.
func (s *Store) Reserve(_ context.Context, r store.Request, longest int64) (store.Reservation, error) {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	if r.From > 0 {
		sh.refund(key, r, r.From, now, true)
	}
	var buf [4]*memState
	states, blocked := sh.states(key, r.Limits, now, buf[:0])
	at, mk := now+max(blocked, r.Lead), sh.keys[key]
	for i, st := range states {
		count, _ := mk.override.count(r.Limits[i], now)
		_, retry, _ := st.check(count, r.N, now)
		if retry < 0 {
			return store.Reservation{Wait: -1}, nil
		}
		at = max(at, now+retry)
	}
	if longest >= 0 && at-now > longest {
		return store.Reservation{Wait: at - now}, nil
	}
	for _, st := range states {
		st.add(r.N, at, now)
	}
	return store.Reservation{OK: true, Wait: at - now, At: at}, nil
}

// Release mirrors release.lua: refund.lua's path, for the units reserved
// at res.At.
func (s *Store) Release(_ context.Context, r store.Request, res store.Reservation) error {
	return s.refund(r, res.At, true)
}

// Block mirrors block.lua.
func (s *Store) Block(_ context.Context, r store.Request, d time.Duration) error {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	mk := sh.key(key)
	mk.blocked = max(mk.blocked, now+d.Microseconds())
	return nil
}

// Reset mirrors reset.lua.
func (s *Store) Reset(_ context.Context, r store.Request) error {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	mk := sh.key(key) // a key created here has nothing: unlock forgets it
	mk.blocked, mk.denials, mk.denialsEnd = 0, 0, 0
	for _, l := range r.Limits {
		if st := mk.find(l); st != nil {
			st.buckets, st.w = st.buckets[:0], 0
		}
	}
	return nil
}

// Keys returns, for tests, the held keys live at now (µs; math.MinInt64:
// every key held, expired ones not yet dropped included).
func (s *Store) Keys(now int64) []string {
	var keys []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, mk := range sh.keys {
			if mk.expires > now {
				keys = append(keys, k)
			}
		}
		sh.mu.Unlock()
	}
	return keys
}

// Units returns, for tests, the units of key's sliding log of l, reserved
// and expired ones included.
func (s *Store) Units(key string, l store.Limit) int64 {
	key = store.HeldKey(key)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var units int64
	if st := sh.keys[key].find(l); st != nil {
		for _, b := range st.buckets {
			units += b.count
		}
	}
	return units
}

// Check reports nil: the memory store has nothing to check.
func (s *Store) Check(context.Context) error { return nil }

var _ store.Store = (*Store)(nil)
