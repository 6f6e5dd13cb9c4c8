package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testPrefix is the prefix of the storage keys in the key tests (core's
// DefaultPrefix).
const testPrefix = "rw:"

var testPrefixes sync.Map

// uniquePrefix isolates tests that share one Redis.
func uniquePrefix(t *testing.T) string {
	p := fmt.Sprintf("t%d:", time.Now().UnixNano())
	for {
		if _, dup := testPrefixes.LoadOrStore(p, true); !dup {
			return p
		}
		p += "x"
	}
}

// per is a SlidingLog limit of count units per window (core.Per).
func per(count int64, window time.Duration) store.Limit {
	return store.Limit{Count: count, Window: window}
}

func perSecond(count int64) store.Limit { return per(count, time.Second) }
func perMinute(count int64) store.Limit { return per(count, time.Minute) }
func perHour(count int64) store.Limit   { return per(count, time.Hour) }

// with returns l counted by algorithm a (core.Limit.With).
func with(l store.Limit, a store.Algorithm) store.Limit {
	l.Algorithm = a
	return l
}

// decision is a Request of one unit of key under limits, recorded when
// admitted (core.Limiter.Allow).
func decision(key string, limits ...store.Limit) store.Request {
	return store.Request{Key: key, N: 1, Limits: limits, Commit: true}
}

// peek is a Request of one unit of key under limits that records nothing
// (core.Limiter.Peek).
func peek(key string, limits ...store.Limit) store.Request {
	return store.Request{Key: key, N: 1, Limits: limits}
}

// within returns r bounded by d from now (the Limiter's timeout).
func within(r store.Request, d time.Duration) store.Request {
	r.Deadline = time.Now().Add(d)
	return r
}

// hookClones adds h to the client clone that s's transport sends unbatched
// calls through, which runs none of the client's hooks: a test's hook on
// the client then sees every call of s.
func hookClones(s *Store, h redis.Hook) { s.t.hookDeadlineClient(h) }

// outcome is what a Store's Allow returned.
type outcome struct {
	d   store.Decision
	err error
}

// holdSends takes every slot of s's in-flight limit, as flushers at work
// would (none is), so that calls queue and nothing sends them but
// sendQueued, until release gives the slots back. A test builds a batch
// with queueAllow, in the order it chooses, and sends it as a flusher
// would.
func holdSends(s *Store) (release func()) { return s.t.holdSlots() }

// queueAllow starts s.Allow(ctx, r) on a goroutine of its own, and returns
// once its call is queued (s held by holdSends) with the channel its
// outcome arrives on.
func queueAllow(ctx context.Context, s *Store, r store.Request) <-chan outcome {
	n := s.t.queued()
	out := make(chan outcome, 1)
	go func() {
		d, err := s.Allow(ctx, r)
		out <- outcome{d, err}
	}()
	for { // set-up: wait until the call is queued
		if s.t.queued() > n {
			return out
		}
		runtime.Gosched()
	}
}

// sendQueued sends the calls queued in s as one batch, as a flusher would.
func sendQueued(s *Store) {
	s.t.send(s.t.takeQueued())
}

// allowEach makes the decisions rs one after another.
func allowEach(s *Store, rs []store.Request) []outcome {
	outs := make([]outcome, len(rs))
	for i, r := range rs {
		outs[i].d, outs[i].err = s.Allow(context.Background(), r)
	}
	return outs
}

// allowBatch makes the decisions rs as one batch of s, in their order
// (the calls a flusher finds queued), and returns their outcomes.
func allowBatch(s *Store, rs []store.Request) []outcome {
	defer holdSends(s)()
	ctx := context.Background()
	chans := make([]<-chan outcome, len(rs))
	for i, r := range rs {
		chans[i] = queueAllow(ctx, s, r)
	}
	sendQueued(s)
	outs := make([]outcome, len(rs))
	for i, ch := range chans {
		outs[i] = <-ch
	}
	return outs
}

// beyond fails t when d, the time something took, passed bound by more
// than the worst stall of this process that m has seen: a process that
// stood still (a loaded machine, the race detector's GC) moves every time
// it records by as much, and such a delay is not the code's. A hang of the
// code under test is no stall of the process: m does not see it.
func beyond(t *testing.T, m *stall.Meter, d, bound time.Duration, what string) {
	t.Helper()
	stalled := m.Worst()
	switch {
	case d <= bound:
	case d <= bound+stalled:
		t.Logf("%s took %v, over %v, but this process stalled for %v: inconclusive", what, d, bound, stalled)
	default:
		t.Errorf("%s took %v, want < %v (the worst stall of the process: %v)", what, d, bound, stalled)
	}
}

// storedLog returns the times in µs of the units held in a sliding log's
// stored value, oldest first, as algorithms.lua lays it out (compact or
// ring); none for a missing key.
func storedLog(ctx context.Context, rdb redis.Cmdable, key string) ([]int64, error) {
	v, err := rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeLog(v)
}

// decodeLog reads a sliding log's value (see algorithms.lua).
func decodeLog(v []byte) ([]int64, error) {
	uint := func(b []byte) int64 {
		var x int64
		for _, c := range b {
			x = x<<8 | int64(c)
		}
		return x
	}
	if len(v) < 8 {
		return nil, fmt.Errorf("log value of %d bytes", len(v))
	}
	base := uint(v[1:8])
	if w := int(v[0]); w < 16 { // compact
		if w < 1 || w > 7 || (len(v)-8)%w != 0 {
			return nil, fmt.Errorf("compact log: width %d, %d bytes", w, len(v))
		}
		var out []int64
		for i := 8; i < len(v); i += w {
			out = append(out, base+uint(v[i:i+w]))
		}
		return out, nil
	}
	const header = 31
	w := int(v[0]) - 16
	if len(v) < header || w < 1 || w > 7 {
		return nil, fmt.Errorf("ring log: width %d, %d bytes", w, len(v))
	}
	capacity, head, used := int(uint(v[8:11])), int(uint(v[11:14])), int(uint(v[14:17]))
	newest := uint(v[17:24])
	if len(v) != header+capacity*w || head >= capacity || used > capacity || used == 0 {
		return nil, fmt.Errorf("ring log: %d bytes, cap %d, head %d, used %d, width %d", len(v), capacity, head, used, w)
	}
	out := make([]int64, used)
	for i := range out {
		p := header + (head+i)%capacity*w
		out[i] = base + uint(v[p:p+w])
	}
	if out[used-1] != newest {
		return nil, fmt.Errorf("ring log: newest unit at %d, header says %d", out[used-1], newest)
	}
	return out, nil
}
