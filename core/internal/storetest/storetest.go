// Package storetest is the conformance suite of the Limiter's backends: Run
// drives a store.Store through the seam alone, on a controlled clock
// (Request.Now), and asserts the exact Decision, Reservation and state of
// each step, as the Lua scripts (redisstore/lua) compute them. Every backend
// (package memstore, package redisstore) passes it. It is a test helper:
// only tests import it.
package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// Times in µs, as the seam takes them.
const (
	us  = int64(1)
	ms  = 1000 * us
	sec = 1000 * ms
)

// t0 is where each case's clock starts: a whole hour (so a whole second,
// minute and bucket of every window used here), in µs since the epoch.
var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC).UnixMicro()

// algorithms are the algorithms in their order, with the names used for
// subtests.
var algorithms = []struct {
	alg  store.Algorithm
	name string
}{
	{store.SlidingLog, "sliding-log"},
	{store.SlidingBuckets, "sliding-buckets"},
	{store.SlidingCounter, "sliding-counter"},
}

// full is the Reset of a limit of one minute that admitted units at t0, for
// each algorithm: the log's unit leaves at t0+60s; the bucket's (1s) at its
// end plus the window; the counter's window is counted for two windows.
var full = [...]int64{60 * sec, 61 * sec, 120 * sec}

// runs counts the calls of Run in this process, so that two calls never
// share keys on one server.
var runs atomic.Int64

// Run runs the conformance suite against the backend that open returns: one
// subtest per case, each with a store of its own from open, which may share
// its server with other cases: every case uses keys of its own, whose names
// start with a prefix unique to this process, Run call and case. Times are
// given in every Request (Request.Now), starting from a whole hour; a
// backend must take them (the Redis scripts do when Now is not 0).
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	prefix := fmt.Sprintf("storetest:%d:%d:", time.Now().UnixNano(), runs.Add(1))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(&kit{t: t, s: open(t), prefix: prefix + c.name + ":"})
		})
	}
}

// kit is one case's store and keys.
type kit struct {
	t      *testing.T
	s      store.Store
	prefix string
}

// key is the case's key named name.
func (k *kit) key(name string) string { return k.prefix + name }

// req is a Request for key (its name in the case) of n units under limits
// at now.
func (k *kit) req(key string, n int64, now int64, limits ...store.Limit) store.Request {
	return store.Request{Key: k.key(key), N: n, Limits: limits, Now: now, Commit: true}
}

// allow calls Allow and fails unless it answers want.
func (k *kit) allow(step string, r store.Request, want store.Decision) store.Decision {
	k.t.Helper()
	d, err := k.s.Allow(context.Background(), r)
	if err != nil {
		k.t.Fatalf("%s: Allow: %v", step, err)
	}
	if !Same(d, want, len(r.Limits)) {
		k.t.Fatalf("%s: Allow answered\n%s\nwant\n%s", step, show(d), show(want))
	}
	return d
}

// peek is allow without recording.
func (k *kit) peek(step string, r store.Request, want store.Decision) {
	k.t.Helper()
	r.Commit = false
	k.allow(step, r, want)
}

// reserve calls Reserve and fails unless it answers want.
func (k *kit) reserve(step string, r store.Request, longest int64, want store.Reservation) store.Reservation {
	k.t.Helper()
	res, err := k.s.Reserve(context.Background(), r, longest)
	if err != nil {
		k.t.Fatalf("%s: Reserve: %v", step, err)
	}
	if res != want {
		k.t.Fatalf("%s: Reserve answered %+v, want %+v", step, res, want)
	}
	return res
}

// do fails the case on err, the error of the call named step.
func (k *kit) do(step string, err error) {
	k.t.Helper()
	if err != nil {
		k.t.Fatalf("%s: %v", step, err)
	}
}

// Same reports whether a and b are the same decision on n limits: the
// states past the end of either's States are zero.
func Same(a, b store.Decision, n int) bool {
	if a.Allowed != b.Allowed || a.Blocked != b.Blocked || a.Banned != b.Banned || a.At != b.At {
		return false
	}
	for i := range n {
		if stateOf(a, i) != stateOf(b, i) {
			return false
		}
	}
	return len(a.States) <= n && len(b.States) <= n
}

func stateOf(d store.Decision, i int) store.State {
	if i < len(d.States) {
		return d.States[i]
	}
	return store.State{}
}

// show writes d.
func show(d store.Decision) string {
	return fmt.Sprintf("{Allowed:%v Blocked:%v Banned:%v At:%d States:%+v}", d.Allowed, d.Blocked, d.Banned, d.At, d.States)
}

// decision is a Decision at now, not blocked, with states.
func decision(allowed bool, now int64, states ...store.State) store.Decision {
	return store.Decision{Allowed: allowed, At: now, States: states}
}

// blocked is a Decision at now denied under a block (banned: by this
// denial's penalty).
func blocked(banned bool, now int64, states ...store.State) store.Decision {
	d := decision(false, now, states...)
	d.Blocked, d.Banned = true, banned
	return d
}

// state is a State.
func state(remaining, retry, reset int64) store.State {
	return store.State{Remaining: remaining, Retry: retry, Reset: reset}
}

// limit is a Limit of count per window.
func limit(a store.Algorithm, count int64, window time.Duration) store.Limit {
	return store.Limit{Algorithm: a, Count: count, Window: window}
}

var cases = []struct {
	name string
	run  func(k *kit)
}{
	{"exact counts", exactCounts},
	{"sliding log retry and reset", logTimes},
	{"sliding buckets retry and reset", bucketsTimes},
	{"sliding counter weighs the previous window", counterTimes},
	{"all or none", allOrNone},
	{"cost above Count", costAboveCount},
	{"peek records nothing", peek},
	{"Block", block},
	{"Reset", reset},
	{"Refund", refund},
	{"Refund at a time", refundAt},
	{"Reserve and Release", reserve},
	{"Penalty", penalty},
	{"keys", keys},
	{"huge limits", hugeLimits},
	{"concurrency", concurrency},
	{"overrides", overrides},
	{"Unblock", unblock},
	{"block and override", blockAndOverride},
	{"denied keys", deniedKeys},
	{"published rules", published},
}

// exactCounts: five units of five per minute are admitted one by one at
// t0, then every request is denied until the oldest unit leaves.
func exactCounts(k *kit) {
	retry := [...]int64{60 * sec, 61 * sec, 72 * sec} // counter: 4 of 5 in the next window fit 12s in
	for _, a := range algorithms {
		k.t.Run(a.name, func(t *testing.T) {
			k := &kit{t: t, s: k.s, prefix: k.prefix}
			lim := limit(a.alg, 5, time.Minute)
			r := k.req(a.name, 1, t0, lim)
			for i := int64(1); i <= 5; i++ {
				k.allow(fmt.Sprint("request ", i), r, decision(true, t0, state(5-i, 0, full[a.alg])))
			}
			for i := 0; i < 3; i++ {
				k.allow("over the limit", r, decision(false, t0, state(0, retry[a.alg], full[a.alg])))
			}
		})
	}
}

// logTimes: a sliding log's retry is the exact time until the oldest unit
// leaves, and its reset the time until the newest does.
func logTimes(k *kit) {
	lim := limit(store.SlidingLog, 3, 10*time.Second)
	now := t0
	at := func(d int64) store.Request { now += d; return k.req("k", 1, now, lim) }
	k.allow("first", at(0), decision(true, now, state(2, 0, 10*sec)))
	k.allow("second", at(sec), decision(true, now, state(1, 0, 10*sec)))
	k.allow("third", at(sec+500*us), decision(true, now, state(0, 0, 10*sec)))
	// the oldest (t0) leaves at t0+10s; now is t0+3.0005s
	k.allow("denied", at(sec), decision(false, now, state(0, 6*sec+999500*us, 9*sec)))
	k.allow("1µs early", at(6*sec+999500*us-us), decision(false, now, state(0, us, 2*sec+500*us+us)))
	k.allow("on time", at(us), decision(true, now, state(0, 0, 10*sec)))
}

// bucketsTimes: a sliding bucket's units count until the bucket's end plus
// the window.
func bucketsTimes(k *kit) {
	lim := limit(store.SlidingBuckets, 3, time.Minute) // 1s buckets
	now := t0
	at := func(d int64) store.Request { now += d; return k.req("k", 1, now, lim) }
	k.allow("request 0", at(500*ms), decision(true, now, state(2, 0, 60*sec+500*ms)))
	k.allow("request 1", at(sec), decision(true, now, state(1, 0, 60*sec+500*ms)))
	k.allow("request 2", at(sec), decision(true, now, state(0, 0, 60*sec+500*ms)))
	// now t0+3.5s: the first bucket (t0..t0+1s) leaves at t0+61s
	k.allow("denied", at(sec), decision(false, now, state(0, 57*sec+500*ms, 59*sec+500*ms)))
	k.allow("1ms early", at(57*sec+500*ms-ms), decision(false, now, state(0, ms, 2*sec+ms)))
	// at a bucket's start, its end is a whole bucket away
	k.allow("on time", at(ms), decision(true, now, state(0, 0, 61*sec)))
	// an explicit Precision: 100ms buckets, the unit counts until t0+62.1s
	fine := store.Limit{Algorithm: store.SlidingBuckets, Count: 1, Window: time.Minute, Precision: 100 * time.Millisecond}
	k.allow("precision", k.req("fine", 1, t0+2*sec+50*ms, fine), decision(true, t0+2*sec+50*ms, state(0, 0, 60*sec+50*ms)))
	k.allow("precision denied", k.req("fine", 1, t0+3*sec, fine), decision(false, t0+3*sec, state(0, 59*sec+100*ms, 59*sec+100*ms)))
}

// counterTimes: a sliding counter weighs the previous window's count by
// the part of it still in the sliding window.
func counterTimes(k *kit) {
	lim := limit(store.SlidingCounter, 10, 10*time.Second)
	now := t0
	at := func(d int64) store.Request { now += d; return k.req("k", 1, now, lim) }
	at(sec)
	for i := int64(0); i < 10; i++ {
		k.allow(fmt.Sprint("request ", i), at(0), decision(true, now, state(9-i, 0, 19*sec)))
	}
	// next window: the previous 10, weighted by 0.9 at 1s in, and 1 fit
	k.allow("denied", at(0), decision(false, now, state(0, 10*sec, 19*sec)))
	k.allow("1ms early", at(10*sec-ms), decision(false, now, state(0, ms, 9*sec+ms)))
	k.allow("on time", at(ms), decision(true, now, state(0, 0, 19*sec)))
	// 5s in: 10×0.5 + 1 counted, 1 more recorded
	k.allow("half way", at(4*sec), decision(true, now, state(3, 0, 15*sec)))
}

// allOrNone: a request under two limits is admitted under both or under
// none; a denied one records nothing under the limit that admitted it.
func allOrNone(k *kit) {
	for _, a := range algorithms {
		k.t.Run(a.name, func(t *testing.T) {
			k := &kit{t: t, s: k.s, prefix: k.prefix}
			sec2 := limit(a.alg, 2, time.Second)
			if a.alg == store.SlidingBuckets {
				sec2.Precision = 100 * time.Millisecond
			}
			min3 := limit(a.alg, 3, time.Minute)
			key := a.name
			// the states at each step, by algorithm
			type step struct{ sec, min store.State }
			denied := [...]step{ // at t0, 2 recorded: denied by sec2
				{state(0, sec, sec), state(1, 0, 60*sec)},
				{state(0, 1100*ms, 1100*ms), state(1, 0, 61*sec)},
				{state(0, 1500*ms, 2*sec), state(1, 0, 120*sec)},
			}[a.alg]
			third := [...]step{ // at t0+2s: admitted, min3 full
				{state(1, 0, sec), state(0, 0, 60*sec)},
				{state(1, 0, 1100*ms), state(0, 0, 61*sec)},
				{state(1, 0, 2*sec), state(0, 0, 118*sec)},
			}[a.alg]
			last := [...]step{ // at t0+2s: denied by min3
				{state(1, 0, sec), state(0, 58*sec, 60*sec)},
				{state(1, 0, 1100*ms), state(0, 59*sec, 61*sec)},
				{state(1, 0, 2*sec), state(0, 78*sec, 118*sec)},
			}[a.alg]
			r := k.req(key, 1, t0, sec2, min3)
			k.allow("first", r, decision(true, t0, state(1, 0, denied.sec.Reset), state(2, 0, denied.min.Reset)))
			k.allow("second", r, decision(true, t0, state(0, 0, denied.sec.Reset), state(1, 0, denied.min.Reset)))
			k.allow("denied by the first limit", r, decision(false, t0, denied.sec, denied.min))
			k.peek("the second limit after the denial", k.req(key, 1, t0, min3), decision(true, t0, denied.min))
			r.Now = t0 + 2*sec
			k.allow("third", r, decision(true, r.Now, third.sec, third.min))
			k.allow("denied by the second limit", r, decision(false, r.Now, last.sec, last.min))
			k.peek("the first limit after the denial", k.req(key, 1, r.Now, sec2), decision(true, r.Now, last.sec))
		})
	}
}

// costAboveCount: n units fit when n fit under every limit; a cost above a
// limit's Count never fits (Retry -1) and records nothing.
func costAboveCount(k *kit) {
	for _, a := range algorithms {
		k.t.Run(a.name, func(t *testing.T) {
			k := &kit{t: t, s: k.s, prefix: k.prefix}
			lim := limit(a.alg, 10, time.Minute)
			n := func(n int64) store.Request { return k.req(a.name, n, t0, lim) }
			z := full[a.alg]
			// counter: 4 more fit in the next window when this one's 7
			// weigh 6 at most, w/7 in (rounded up to a µs); 1 more after
			// 10, when they weigh 9, w/10 in
			retry4 := [...]int64{60 * sec, 61 * sec, 60*sec + 8571429*us}[a.alg]
			retry1 := [...]int64{60 * sec, 61 * sec, 66 * sec}[a.alg]
			k.allow("7", n(7), decision(true, t0, state(3, 0, z)))
			k.allow("4", n(4), decision(false, t0, state(3, retry4, z)))
			k.allow("3", n(3), decision(true, t0, state(0, 0, z)))
			k.allow("11", n(11), decision(false, t0, state(0, -1, z)))
			k.allow("1", n(1), decision(false, t0, state(0, retry1, z)))
			k.do("Reset", k.s.Reset(context.Background(), n(1)))
			k.allow("11 on an empty key", n(11), decision(false, t0, state(10, -1, 0)))
			k.allow("10 on an empty key", n(10), decision(true, t0, state(0, 0, z)))
		})
	}
}

// peek: a request that does not commit records nothing.
func peek(k *kit) {
	for _, a := range algorithms {
		k.t.Run(a.name, func(t *testing.T) {
			k := &kit{t: t, s: k.s, prefix: k.prefix}
			lim := limit(a.alg, 2, time.Minute)
			r := k.req(a.name, 1, t0, lim)
			for i := 0; i < 3; i++ {
				k.peek(fmt.Sprint("peek ", i), r, decision(true, t0, state(2, 0, 0)))
			}
			r.N = 2
			k.allow("2 units", r, decision(true, t0, state(0, 0, full[a.alg])))
			r.N = 1
			retry := [...]int64{60 * sec, 61 * sec, 90 * sec}[a.alg]
			k.peek("peek when full", r, decision(false, t0, state(0, retry, full[a.alg])))
		})
	}
}

// block: a blocked key is denied under any limits with a retry and reset of
// at least the block's time left; a later shorter Block does not shorten
// it; the units are untouched.
func block(k *kit) {
	ctx := context.Background()
	lim := limit(store.SlidingLog, 5, time.Minute)
	counter := limit(store.SlidingCounter, 5, time.Minute)
	blockAt := func(now int64, d time.Duration) {
		k.t.Helper()
		k.do("Block", k.s.Block(ctx, store.Request{Key: k.key("k"), Now: now}, d))
	}
	k.allow("before", k.req("k", 1, t0, lim, counter), decision(true, t0, state(4, 0, 60*sec), state(4, 0, 120*sec)))
	blockAt(t0, 10*time.Second)
	k.allow("blocked", k.req("k", 1, t0, lim, counter), blocked(false, t0, state(0, 10*sec, 60*sec), state(0, 10*sec, 120*sec)))
	k.peek("blocked peek", k.req("k", 1, t0, lim), blocked(false, t0, state(0, 10*sec, 60*sec)))
	blockAt(t0+sec, 5*time.Second)
	k.allow("a shorter block does not shorten", k.req("k", 1, t0+sec, lim), blocked(false, t0+sec, state(0, 9*sec, 59*sec)))
	blockAt(t0+sec, 70*time.Second)
	k.allow("a longer block lengthens", k.req("k", 1, t0+sec, lim), blocked(false, t0+sec, state(0, 70*sec, 70*sec)))
	k.allow("a cost above Count never fits", k.req("k", 6, t0+sec, lim), blocked(false, t0+sec, state(0, -1, 70*sec)))
	k.allow("the block ends", k.req("k", 1, t0+71*sec, lim), decision(true, t0+71*sec, state(4, 0, 60*sec)))
	// a key without units, blocked: every limit's retry and reset are the
	// block's
	k.do("Block", k.s.Block(ctx, store.Request{Key: k.key("fresh"), Now: t0}, 30*time.Second))
	k.allow("another key", k.req("other", 1, t0, lim), decision(true, t0, state(4, 0, 60*sec)))
	k.allow("a fresh key blocked", k.req("fresh", 1, t0+10*sec, lim, counter), blocked(false, t0+10*sec, state(0, 20*sec, 20*sec), state(0, 20*sec, 20*sec)))
}

// reset: Reset forgets the key's units, its block and its penalty's
// denials.
func reset(k *kit) {
	ctx := context.Background()
	lim := limit(store.SlidingLog, 3, time.Minute)
	p := store.Penalty{Denials: 2, Within: time.Minute, Ban: time.Minute}
	r := k.req("k", 1, t0, lim)
	r.Penalty = p
	r.N = 3
	k.allow("3 units", r, decision(true, t0, state(0, 0, 60*sec)))
	r.N = 1
	k.allow("a denial counted", r, decision(false, t0, state(0, 60*sec, 60*sec)))
	k.do("Block", k.s.Block(ctx, store.Request{Key: k.key("k"), Now: t0}, 10*time.Second))
	k.do("Reset", k.s.Reset(ctx, r))
	k.allow("after Reset", r, decision(true, t0, state(2, 0, 60*sec)))
	r.N = 2
	k.allow("2 units", r, decision(true, t0, state(0, 0, 60*sec)))
	r.N = 1
	k.allow("the first denial since Reset", r, decision(false, t0, state(0, 60*sec, 60*sec)))
	k.allow("the second bans", r, blocked(true, t0, state(0, 60*sec, 60*sec)))
	k.do("Reset", k.s.Reset(ctx, r))
	k.allow("the ban lifted", r, decision(true, t0, state(2, 0, 60*sec)))
	// a Reset under one limit leaves the key's other limits
	other := limit(store.SlidingCounter, 3, time.Minute)
	k.allow("two limits", k.req("two", 1, t0, lim, other), decision(true, t0, state(2, 0, 60*sec), state(2, 0, 120*sec)))
	k.do("Reset", k.s.Reset(ctx, k.req("two", 1, t0, lim)))
	k.peek("after Reset of one", k.req("two", 1, t0, lim, other), decision(true, t0, state(3, 0, 0), state(2, 0, 120*sec)))
	k.do("Reset of an unknown key", k.s.Reset(ctx, k.req("none", 1, t0, lim)))
}

// refund: Refund gives back the newest units, or those of one time, never
// going below empty.
func refund(k *kit) {
	ctx := context.Background()
	for _, a := range algorithms {
		k.t.Run(a.name, func(t *testing.T) {
			k := &kit{t: t, s: k.s, prefix: k.prefix}
			lim := limit(a.alg, 5, time.Minute)
			at := func(n, now int64) store.Request { return k.req(a.name, n, now, lim) }
			d1 := k.allow("2 at t0", at(2, t0), decision(true, t0, state(3, 0, full[a.alg])))
			reset10 := [...]int64{60 * sec, 61 * sec, 110 * sec}[a.alg]
			k.allow("2 at t0+10s", at(2, t0+10*sec), decision(true, t0+10*sec, state(1, 0, reset10)))
			now := t0 + 20*sec
			k.do("Refund the newest", k.s.Refund(ctx, at(1, now)))
			// two units at t0 and one at t0+10s are left: 4 fit when the
			// second unit at t0 has left (the counter: 40s into the next
			// window, when the 3 weigh 1)
			k.peek("after refunding the newest", at(4, now), decision(false, now,
				state(2, [...]int64{40 * sec, 41 * sec, 80 * sec}[a.alg], [...]int64{50 * sec, 51 * sec, 100 * sec}[a.alg])))
			r := at(1, now)
			r.At = d1.At
			k.do("Refund at t0", k.s.Refund(ctx, r))
			// one unit at t0 and one at t0+10s are left: 5 fit when the
			// newest has left (the counter: when both weigh nothing)
			want := [...]int64{50 * sec, 51 * sec, 100 * sec}[a.alg]
			k.peek("after the refunds", at(5, now), decision(false, now, state(3, want, want)))
			k.do("Refund more than recorded", k.s.Refund(ctx, at(100, now)))
			k.peek("empty", at(1, now), decision(true, now, state(5, 0, 0)))
			k.do("Refund of an empty key", k.s.Refund(ctx, at(1, now)))
			k.allow("never below empty", at(5, now), decision(true, now, state(0, 0, [...]int64{60 * sec, 61 * sec, 100 * sec}[a.alg])))
			k.do("Refund of an unknown key", k.s.Refund(ctx, k.req("none", 1, now, lim)))
		})
	}
}

// refundAt: Refund at a time gives back units of that time only: the
// sliding log's units of that µs, the bucket of that time, the fixed
// window of that time (the counter's current or previous one); a time out
// of the window gives back nothing.
func refundAt(k *kit) {
	ctx := context.Background()
	refund := func(key string, n, now, at int64, lim store.Limit) {
		k.t.Helper()
		r := k.req(key, n, now, lim)
		r.At = at
		k.do("Refund", k.s.Refund(ctx, r))
	}
	// the counter: 2 in the previous window, 1 in this one
	c := limit(store.SlidingCounter, 5, 10*time.Second)
	k.allow("counter 2", k.req("counter", 2, t0, c), decision(true, t0, state(3, 0, 20*sec)))
	k.allow("counter 1", k.req("counter", 1, t0+10*sec, c), decision(true, t0+10*sec, state(2, 0, 20*sec)))
	now := t0 + 12*sec
	refund("counter", 5, now, t0-10*sec, c) // a window before the previous: nothing
	k.peek("refund before the previous window", k.req("counter", 1, now, c), decision(true, now, state(2, 0, 18*sec)))
	refund("counter", 5, now, t0+sec, c) // the previous window: its 2 units
	k.peek("refund of the previous window", k.req("counter", 1, now, c), decision(true, now, state(4, 0, 18*sec)))
	refund("counter", 5, now, t0+sec, c)
	k.peek("refund of the previous window again", k.req("counter", 1, now, c), decision(true, now, state(4, 0, 18*sec)))
	// the log: units at t0 and t0+1µs
	l := limit(store.SlidingLog, 5, 10*time.Second)
	k.allow("log 2", k.req("log", 2, t0, l), decision(true, t0, state(3, 0, 10*sec)))
	k.allow("log 1", k.req("log", 1, t0+us, l), decision(true, t0+us, state(2, 0, 10*sec)))
	refund("log", 5, t0+sec, t0+2*us, l) // no unit then
	k.peek("refund at a time without units", k.req("log", 1, t0+sec, l), decision(true, t0+sec, state(2, 0, 9*sec+us)))
	refund("log", 5, t0+sec, t0+us, l)
	k.peek("refund at t0+1µs", k.req("log", 1, t0+sec, l), decision(true, t0+sec, state(3, 0, 9*sec)))
	refund("log", 1, t0+10*sec, t0, l) // out of the window
	k.peek("refund out of the window", k.req("log", 1, t0+10*sec, l), decision(true, t0+10*sec, state(5, 0, 0)))
	// the buckets (100ms): 2 in the bucket of t0, 1 in the next
	b := store.Limit{Algorithm: store.SlidingBuckets, Count: 5, Window: 10 * time.Second, Precision: 100 * time.Millisecond}
	k.allow("buckets 2", k.req("buckets", 2, t0, b), decision(true, t0, state(3, 0, 10*sec+100*ms)))
	k.allow("buckets 1", k.req("buckets", 1, t0+150*ms, b), decision(true, t0+150*ms, state(2, 0, 10*sec+50*ms)))
	refund("buckets", 5, t0+sec, t0+50*ms, b) // the bucket of t0: both
	k.peek("refund of a bucket", k.req("buckets", 5, t0+sec, b), decision(false, t0+sec, state(4, 9*sec+200*ms, 9*sec+200*ms)))
}

// reserve: Reserve records units at the earliest time they fit under every
// sliding log, counting reservations made, within a bound; Release gives
// them back; Refund never takes them (they are in the future).
func reserve(k *kit) {
	ctx := context.Background()
	lim := limit(store.SlidingLog, 2, 10*time.Second)
	r := k.req("k", 1, t0, lim)
	k.allow("2 units", k.req("k", 2, t0, lim), decision(true, t0, state(0, 0, 10*sec)))
	k.reserve("first", r, -1, store.Reservation{OK: true, Wait: 10 * sec, At: t0 + 10*sec})
	r2 := k.reserve("second", r, -1, store.Reservation{OK: true, Wait: 10 * sec, At: t0 + 10*sec})
	k.reserve("beyond the bound", r, 20*sec-us, store.Reservation{Wait: 20 * sec})
	r3 := k.reserve("at the bound", r, 20*sec, store.Reservation{OK: true, Wait: 20 * sec, At: t0 + 20*sec})
	k.reserve("never", k.req("k", 3, t0, lim), -1, store.Reservation{Wait: -1})
	k.reserve("no wait", r, 0, store.Reservation{Wait: 20 * sec})
	k.do("Release", k.s.Release(ctx, r, r3))
	k.do("Release", k.s.Release(ctx, r, r2))
	k.do("Release of nothing", k.s.Release(ctx, r, store.Reservation{OK: true, At: t0 + 5*sec}))
	k.reserve("after the releases", r, -1, store.Reservation{OK: true, Wait: 10 * sec, At: t0 + 10*sec})
	// Refund takes the units at or before now, not the reservations
	k.do("Refund", k.s.Refund(ctx, k.req("k", 5, t0+sec, lim)))
	k.peek("after Refund", k.req("k", 2, t0+sec, lim), decision(false, t0+sec, state(0, 19*sec, 19*sec)))

	// two limits: the latest of their times
	sec1, min3 := limit(store.SlidingLog, 1, time.Second), limit(store.SlidingLog, 3, time.Minute)
	two := k.req("two", 1, t0, sec1, min3)
	k.allow("one unit", two, decision(true, t0, state(0, 0, sec), state(2, 0, 60*sec)))
	k.reserve("by the first limit", two, -1, store.Reservation{OK: true, Wait: sec, At: t0 + sec})
	k.reserve("by the first limit again", two, -1, store.Reservation{OK: true, Wait: 2 * sec, At: t0 + 2*sec})
	k.reserve("by the second limit", two, -1, store.Reservation{OK: true, Wait: 60 * sec, At: t0 + 60*sec})

	// a blocked key: after the block
	k.do("Block", k.s.Block(ctx, store.Request{Key: k.key("blocked"), Now: t0}, 30*time.Second))
	k.reserve("blocked", k.req("blocked", 1, t0, lim), -1, store.Reservation{OK: true, Wait: 30 * sec, At: t0 + 30*sec})
	k.reserve("an empty key", k.req("empty", 1, t0, lim), 0, store.Reservation{OK: true, Wait: 0, At: t0})

	// a lead: no earlier than now plus it, later if the units fit later
	lead := k.req("lead", 1, t0, lim)
	lead.Lead = 3 * sec
	k.reserve("a lead", lead, -1, store.Reservation{OK: true, Wait: 3 * sec, At: t0 + 3*sec})
	k.reserve("a lead beyond the bound", lead, 3*sec-us, store.Reservation{Wait: 3 * sec})
	k.reserve("a lead again", lead, -1, store.Reservation{OK: true, Wait: 3 * sec, At: t0 + 3*sec})
	k.reserve("a lead, full", lead, -1, store.Reservation{OK: true, Wait: 13 * sec, At: t0 + 13*sec})
	lead.Lead = 0
	k.reserve("no lead, full", lead, -1, store.Reservation{OK: true, Wait: 13 * sec, At: t0 + 13*sec})
	// a move: the reservation of From given back in the same step
	move := k.req("lead", 1, t0, lim)
	move.From = t0 + 3*sec
	k.reserve("a move", move, -1, store.Reservation{OK: true, Wait: 23 * sec, At: t0 + 23*sec}) // after the two of t0+13s
	move.From, move.Lead = t0+13*sec, 20*sec
	k.reserve("a move beyond the bound", move, 15*sec, store.Reservation{Wait: 23 * sec})
	// left: t0+3s, t0+13s, t0+23s (either move gave one back)
	k.peek("the moves gave back", k.req("lead", 1, t0+4*sec, lim), decision(false, t0+4*sec, state(0, 19*sec, 29*sec)))
	lead = k.req("blocked", 1, t0, lim)
	lead.Lead = 40 * sec
	k.reserve("a lead past a block", lead, -1, store.Reservation{OK: true, Wait: 40 * sec, At: t0 + 40*sec})
}

// penalty: the committed denial that reaches Denials within Within bans the
// key for Ban; peeks and blocked denials do not count.
func penalty(k *kit) {
	lim := limit(store.SlidingLog, 1, time.Minute)
	p := store.Penalty{Denials: 3, Within: 10 * time.Second, Ban: time.Minute}
	at := func(key string, now int64) store.Request {
		r := k.req(key, 1, now, lim)
		r.Penalty = p
		return r
	}
	k.allow("admitted", at("k", t0), decision(true, t0, state(0, 0, 60*sec)))
	k.allow("denial 1", at("k", t0), decision(false, t0, state(0, 60*sec, 60*sec)))
	k.peek("a peek", at("k", t0+sec), decision(false, t0+sec, state(0, 59*sec, 59*sec)))
	k.allow("denial 2", at("k", t0+sec), decision(false, t0+sec, state(0, 59*sec, 59*sec)))
	k.allow("denial 3 bans", at("k", t0+2*sec), blocked(true, t0+2*sec, state(0, 60*sec, 60*sec)))
	k.allow("banned", at("k", t0+3*sec), blocked(false, t0+3*sec, state(0, 59*sec, 59*sec)))
	k.allow("banned again", at("k", t0+4*sec), blocked(false, t0+4*sec, state(0, 58*sec, 58*sec)))
	k.allow("the ban ends", at("k", t0+62*sec), decision(true, t0+62*sec, state(0, 0, 60*sec)))
	k.allow("denial 1 after the ban", at("k", t0+62*sec), decision(false, t0+62*sec, state(0, 60*sec, 60*sec)))

	// denials counted within 10s of the first: a later one starts anew
	k.allow("w admitted", at("w", t0), decision(true, t0, state(0, 0, 60*sec)))
	k.allow("w denial 1", at("w", t0+sec), decision(false, t0+sec, state(0, 59*sec, 59*sec)))
	k.allow("w denial 2", at("w", t0+2*sec), decision(false, t0+2*sec, state(0, 58*sec, 58*sec)))
	k.allow("w denial 1 anew", at("w", t0+11*sec), decision(false, t0+11*sec, state(0, 49*sec, 49*sec)))
	k.allow("w denial 2 anew", at("w", t0+12*sec), decision(false, t0+12*sec, state(0, 48*sec, 48*sec)))
	k.allow("w denial 3 bans", at("w", t0+13*sec), blocked(true, t0+13*sec, state(0, 60*sec, 60*sec)))

	// a Block is not shortened by a shorter ban; denials while blocked do
	// not count
	ctx := context.Background()
	k.allow("b admitted", at("b", t0), decision(true, t0, state(0, 0, 60*sec)))
	k.do("Block", k.s.Block(ctx, store.Request{Key: k.key("b"), Now: t0}, 2*time.Minute))
	for i := range 5 {
		k.allow(fmt.Sprint("b blocked ", i), at("b", t0), blocked(false, t0, state(0, 120*sec, 120*sec)))
	}
	now := t0 + 120*sec
	k.allow("b admitted after the block", at("b", now), decision(true, now, state(0, 0, 60*sec)))
	k.allow("b denial 1", at("b", now), decision(false, now, state(0, 60*sec, 60*sec)))
	k.allow("b denial 2", at("b", now), decision(false, now, state(0, 60*sec, 60*sec)))
	k.allow("b denial 3 bans", at("b", now), blocked(true, now, state(0, 60*sec, 60*sec)))
}

// keys: keys with braces, a key written as another's digest, long keys
// that differ in their last byte, and the longest key kept as it is and
// the shortest hashed are keys of their own.
func keys(k *kit) {
	huge := k.key(strings.Repeat("x", 100<<10))
	long := k.key(strings.Repeat("k", 1000))
	edge := k.key(strings.Repeat("e", store.MaxRawKey+1-len(k.key(""))))
	names := []string{k.key("{a}b"), k.key("a}{b"), k.key("}"), k.key("{"), k.key("#hash-like"), "#" + k.key("hash-like"),
		huge, huge + "y", long, long[:len(long)-1] + "1", store.HeldKey(long), edge, edge[:store.MaxRawKey]}
	log, counter := limit(store.SlidingLog, 2, time.Minute), limit(store.SlidingCounter, 5, time.Hour)
	buckets := limit(store.SlidingBuckets, 3, time.Hour)
	for i, name := range names {
		r := store.Request{Key: name, N: 1, Limits: []store.Limit{log, counter, buckets}, Now: t0, Commit: true}
		for j := int64(0); j < 2; j++ {
			k.allow(fmt.Sprintf("key %d request %d", i, j), r,
				decision(true, t0, state(1-j, 0, 60*sec), state(4-j, 0, 2*3600*sec), state(2-j, 0, 3600*sec+60*sec)))
		}
		r.Limits = r.Limits[:1]
		k.allow(fmt.Sprintf("key %d denied", i), r, decision(false, t0, state(0, 60*sec, 60*sec)))
	}
}

// hugeLimits: counts near the largest do not overflow.
func hugeLimits(k *kit) {
	for _, a := range algorithms {
		count := int64(1 << 40)
		if a.alg == store.SlidingLog {
			count = 1 << 14 // core.MaxLogCount
		}
		lim := limit(a.alg, count, time.Hour)
		z := [...]int64{3600 * sec, 3600*sec + 60*sec, 7200 * sec}[a.alg]
		k.allow(a.name, k.req(a.name, 1000, t0, lim), decision(true, t0, state(count-1000, 0, z)))
		if a.alg == store.SlidingLog {
			continue // the largest log: the test's time for little more
		}
		k.allow(a.name+" all", k.req(a.name, count-1000, t0, lim), decision(true, t0, state(0, 0, z)))
		// the counter: the next window, once this one's 2^40 weigh
		// 2^40−1, 1µs in
		retry := [...]int64{0, 3600*sec + 60*sec, 3600*sec + us}[a.alg]
		k.allow(a.name+" over", k.req(a.name, 1, t0, lim), decision(false, t0, state(0, retry, z)))
	}
}

// concurrency: many goroutines deciding on one key at one time admit
// exactly Count units.
func concurrency(k *kit) {
	const goroutines, tries, count = 16, 8, 50
	for _, a := range algorithms {
		k.t.Run(a.name, func(t *testing.T) {
			k := &kit{t: t, s: k.s, prefix: k.prefix}
			lim := limit(a.alg, count, time.Hour)
			r := k.req(a.name, 1, t0, lim)
			var (
				admitted atomic.Int64
				wg       sync.WaitGroup
				errs     = make(chan error, goroutines*tries)
			)
			for range goroutines {
				wg.Go(func() {
					for range tries {
						d, err := k.s.Allow(context.Background(), r)
						if err != nil {
							errs <- err
							return
						}
						if d.Allowed {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("Allow: %v", err)
			}
			if n := admitted.Load(); n != count {
				t.Fatalf("admitted %d of %d, want %d", n, goroutines*tries, count)
			}
			z := [...]int64{3600 * sec, 3600*sec + 60*sec, 7200 * sec}[a.alg]
			retry := [...]int64{3600 * sec, 3600*sec + 60*sec, 3600*sec + 72*sec}[a.alg]
			k.peek("after", r, decision(false, t0, state(0, retry, z)))
		})
	}
}
