package storetest

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// counted is a State under an override of Count count.
func counted(remaining, retry, reset, count int64) store.State {
	return store.State{Remaining: remaining, Retry: retry, Reset: reset, Count: count}
}

// overrides: an override replaces the Count of the limits of its algorithm
// and window, applies to the units already counted, up and down, and goes.
func overrides(k *kit) {
	ctx := context.Background()
	log5 := limit(store.SlidingLog, 5, time.Minute)
	counter5 := limit(store.SlidingCounter, 5, time.Minute)
	buckets5 := limit(store.SlidingBuckets, 5, time.Minute)
	set := func(ttl time.Duration, limits ...store.Limit) {
		k.t.Helper()
		k.do("SetOverride", k.s.SetOverride(ctx, store.Request{Key: k.key("k"), Limits: limits, Now: t0}, ttl))
	}
	r := k.req("k", 5, t0, log5, counter5, buckets5)
	k.allow("at the limit", r, decision(true, t0, state(0, 0, 60*sec), state(0, 0, 120*sec), state(0, 0, 61*sec)))
	r.N = 1
	k.allow("denied", r, decision(false, t0, state(0, 60*sec, 60*sec), state(0, 72*sec, 120*sec), state(0, 61*sec, 61*sec)))
	// the log and the buckets raised to 8, a limit the call does not have ignored
	set(0, limit(store.SlidingLog, 8, time.Minute), limit(store.SlidingBuckets, 8, time.Minute), limit(store.SlidingLog, 1, time.Hour))
	k.allow("the counter still denies", r, decision(false, t0, counted(3, 0, 60*sec, 8), state(0, 72*sec, 120*sec), counted(3, 0, 61*sec, 8)))
	set(0, limit(store.SlidingLog, 8, time.Minute), limit(store.SlidingBuckets, 8, time.Minute), limit(store.SlidingCounter, 7, time.Minute))
	r.N = 2
	k.allow("raised: the units counted stay", r, decision(true, t0, counted(1, 0, 60*sec, 8), counted(0, 0, 120*sec, 7), counted(1, 0, 61*sec, 8)))
	r.N = 1
	k.allow("no more than the new limit", r, decision(false, t0, counted(1, 0, 60*sec, 8), counted(0, 68571429, 120*sec, 7), counted(1, 0, 61*sec, 8)))
	limits, ttl, err := k.s.Override(ctx, store.Request{Key: k.key("k"), Now: t0})
	if err != nil || ttl != 0 || len(limits) != 3 || limits[2] != limit(store.SlidingCounter, 7, time.Minute) {
		k.t.Fatalf("Override: %v %v %v", limits, ttl, err)
	}
	// lowered below the units counted: denied until enough have left
	set(time.Hour, limit(store.SlidingLog, 2, time.Minute))
	k.peek("lowered", k.req("k", 1, t0+sec, log5), decision(false, t0+sec, counted(0, 59*sec, 59*sec, 2)))
	if _, ttl, err := k.s.Override(ctx, store.Request{Key: k.key("k"), Now: t0}); err != nil || ttl <= 0 || ttl > time.Hour {
		k.t.Fatalf("Override's TTL: %v %v", ttl, err)
	}
	k.do("RemoveOverride", k.s.RemoveOverride(ctx, store.Request{Key: k.key("k"), Now: t0}))
	k.peek("removed", k.req("k", 1, t0+sec, log5), decision(false, t0+sec, state(0, 59*sec, 59*sec)))
	if limits, _, err := k.s.Override(ctx, store.Request{Key: k.key("k"), Now: t0}); err != nil || limits != nil {
		k.t.Fatalf("Override after RemoveOverride: %v %v", limits, err)
	}
	k.do("RemoveOverride of none", k.s.RemoveOverride(ctx, store.Request{Key: k.key("k"), Now: t0}))
	// another key is not overridden; a key's override holds under a penalty and in Reserve
	set(0, limit(store.SlidingLog, 1, time.Minute))
	k.allow("another key", k.req("other", 2, t0, log5), decision(true, t0, state(3, 0, 60*sec)))
	k.do("Reset keeps the override", k.s.Reset(ctx, k.req("k", 1, t0, log5, counter5, buckets5)))
	pr := k.req("k", 1, t0, log5)
	pr.Penalty = store.Penalty{Denials: 5, Within: time.Minute, Ban: time.Minute}
	k.allow("under a penalty", pr, decision(true, t0, counted(0, 0, 60*sec, 1)))
	k.allow("under a penalty, denied", pr, decision(false, t0, counted(0, 60*sec, 60*sec, 1)))
	k.reserve("Reserve", k.req("k", 1, t0, log5), -1, store.Reservation{OK: true, Wait: 60 * sec, At: t0 + 60*sec})
}

// blockAndOverride: a key's block and override are kept apart: Block, a
// ban, Unblock, Reset and RemoveOverride each change one and keep the
// other, and each ends at its own time (the Redis store keeps both in one
// key).
func blockAndOverride(k *kit) {
	ctx := context.Background()
	log5, log2 := limit(store.SlidingLog, 5, time.Minute), limit(store.SlidingLog, 2, time.Minute)
	at := func(now int64) store.Request { return store.Request{Key: k.key("k"), Now: now} }
	want := func(step string, now int64, blocked time.Duration, override bool, left time.Duration) {
		k.t.Helper()
		b, err := k.s.Blocked(ctx, at(now))
		limits, ttl, err2 := k.s.Override(ctx, at(now))
		if err != nil || err2 != nil || b != blocked || (limits != nil) != override || ttl != left ||
			override && limits[0] != log2 {
			k.t.Fatalf("%s: blocked %v, override %v for %v (%v %v), want blocked %v, override %v for %v",
				step, b, limits, ttl, err, err2, blocked, override, left)
		}
	}
	setOverride := func(now int64, ttl time.Duration) {
		k.t.Helper()
		r := at(now)
		r.Limits = []store.Limit{log2}
		k.do("SetOverride", k.s.SetOverride(ctx, r, ttl))
	}
	setOverride(t0, 10*time.Second)
	k.do("Block", k.s.Block(ctx, at(t0), 30*time.Second))
	want("both", t0+sec, 29*time.Second, true, 9*time.Second)
	k.allow("blocked, under the override", k.req("k", 1, t0+sec, log5), blocked(false, t0+sec, counted(0, 29*sec, 29*sec, 2)))
	k.do("Unblock", k.s.Unblock(ctx, at(t0+sec)))
	want("unblocked", t0+sec, 0, true, 9*time.Second)
	k.allow("under the override", k.req("k", 2, t0+sec, log5), decision(true, t0+sec, counted(0, 0, 60*sec, 2)))
	k.do("Block again", k.s.Block(ctx, at(t0+sec), 30*time.Second))
	k.do("RemoveOverride", k.s.RemoveOverride(ctx, at(t0+sec)))
	want("override removed", t0+sec, 30*time.Second, false, 0)
	setOverride(t0+sec, 0)
	want("an override without an end", t0+2*sec, 29*time.Second, true, 0)
	k.do("Reset", k.s.Reset(ctx, k.req("k", 1, t0+2*sec, log5)))
	want("reset", t0+2*sec, 0, true, 0)
	// a ban under a penalty keeps the override
	k.allow("at the override's Count", k.req("k", 2, t0+2*sec, log5), decision(true, t0+2*sec, counted(0, 0, 60*sec, 2)))
	pr := k.req("k", 1, t0+2*sec, log5)
	pr.Penalty = store.Penalty{Denials: 1, Within: time.Minute, Ban: 20 * time.Second}
	k.allow("banned", pr, blocked(true, t0+2*sec, counted(0, 60*sec, 60*sec, 2)))
	want("banned", t0+2*sec, 20*time.Second, true, 0)
	// an override ends at its time while a longer block stays, and the
	// other way round
	setOverride(t0+2*sec, 5*time.Second)
	want("a temporary override", t0+3*sec, 19*time.Second, true, 4*time.Second)
	want("the override ended", t0+8*sec, 14*time.Second, false, 0)
	k.allow("blocked, the override ended", k.req("k", 1, t0+8*sec, log5), blocked(false, t0+8*sec, state(0, 14*sec, 54*sec)))
	setOverride(t0+8*sec, 30*time.Second)
	want("the block ended", t0+30*sec, 0, true, 8*time.Second)
	k.allow("the block ended, under the override", k.req("k", 1, t0+33*sec, log5), decision(false, t0+33*sec, counted(0, 29*sec, 29*sec, 2)))
	want("both ended", t0+40*sec, 0, false, 0)
}

// unblock: Unblock lifts a block and keeps the units; Blocked reads it.
func unblock(k *kit) {
	ctx := context.Background()
	lim := limit(store.SlidingLog, 5, time.Minute)
	r := store.Request{Key: k.key("k"), Now: t0}
	blockedFor := func(now int64, want time.Duration) {
		k.t.Helper()
		r := r
		r.Now = now
		if d, err := k.s.Blocked(ctx, r); err != nil || d != want {
			k.t.Fatalf("Blocked at %d: %v %v, want %v", now-t0, d, err, want)
		}
	}
	blockedFor(t0, 0)
	k.allow("2 units", k.req("k", 2, t0, lim), decision(true, t0, state(3, 0, 60*sec)))
	k.do("Block", k.s.Block(ctx, r, 10*time.Second))
	blockedFor(t0+sec, 9*time.Second)
	k.do("Unblock", k.s.Unblock(ctx, r))
	blockedFor(t0+sec, 0)
	k.allow("unblocked, the units kept", k.req("k", 1, t0+sec, lim), decision(true, t0+sec, state(2, 0, 60*sec)))
	k.do("Unblock of a key not blocked", k.s.Unblock(ctx, store.Request{Key: k.key("none"), Now: t0}))
}

// deniedKeys: denials are summed by key over the minutes asked, and each
// minute keeps store.TopKept keys, those most denied.
func deniedKeys(k *kit) {
	ctx := context.Background()
	rule := k.key("rule")
	k.do("CountDenied", k.s.CountDenied(ctx, rule, map[string]int64{"a": 1, "b": 5}, t0))
	k.do("CountDenied", k.s.CountDenied(ctx, rule, map[string]int64{"a": 3}, t0+30*sec))
	k.do("CountDenied", k.s.CountDenied(ctx, rule, map[string]int64{"a": 2}, t0+90*sec))
	k.do("CountDenied", k.s.CountDenied(ctx, k.key("other"), map[string]int64{"x": 9}, t0+30*sec))
	top := func(since time.Duration, now int64, want map[string]int64) {
		k.t.Helper()
		got, err := k.s.TopDenied(ctx, rule, since, now)
		if err != nil || !maps.Equal(got, want) {
			k.t.Fatalf("TopDenied(%v, %d): %v %v, want %v", since, now-t0, got, err, want)
		}
	}
	top(time.Minute, t0+30*sec, map[string]int64{"a": 4, "b": 5})
	top(time.Minute, t0+90*sec, map[string]int64{"a": 6, "b": 5})
	top(time.Minute, t0+150*sec, map[string]int64{"a": 2})
	top(time.Minute, t0+600*sec, map[string]int64{})
	many := make(map[string]int64)
	for i := range store.TopKept + 50 {
		many[fmt.Sprint("key", i)] = int64(i + 1)
	}
	k.do("CountDenied", k.s.CountDenied(ctx, rule, many, t0+600*sec))
	got, err := k.s.TopDenied(ctx, rule, time.Minute, t0+600*sec)
	if err != nil || len(got) != store.TopKept || got["key49"] != 0 || got["key50"] != 51 || got[fmt.Sprint("key", store.TopKept+49)] != store.TopKept+50 {
		k.t.Fatalf("the top %d of %d keys: %d kept %v", store.TopKept, len(many), len(got), err)
	}
}

// published: the registry keeps what was published until PublishTTL, and
// refuses more than MaxPublished entries, writing none.
func published(k *kit) {
	ctx := context.Background()
	// the names are the same in every run: a Redis server keeps the
	// registry of earlier runs, which must not reach the bound
	k.do("Publish", k.s.Publish(ctx, map[string]string{"storetest-a": "1", "storetest-b": "2"}, t0))
	k.do("Publish", k.s.Publish(ctx, map[string]string{"storetest-a": "3"}, t0+sec))
	got, err := k.s.Published(ctx, t0+2*sec)
	if err != nil || got["storetest-a"] != "3" || got["storetest-b"] != "2" {
		k.t.Fatalf("Published: %v %v", got, err)
	}
	got, err = k.s.Published(ctx, t0+store.PublishTTL.Microseconds()+500*ms)
	if _, ok := got["storetest-b"]; err != nil || ok || got["storetest-a"] != "3" {
		k.t.Fatalf("Published after b's TTL: %v %v", got, err)
	}
	over := make(map[string]string)
	for i := range store.MaxPublished + 1 {
		over[fmt.Sprint("storetest-over-", i)] = "x"
	}
	if err := k.s.Publish(ctx, over, t0); err == nil {
		k.t.Fatalf("Publish of %d entries: no error", len(over))
	}
	if got, err := k.s.Published(ctx, t0); err != nil || got["storetest-over-0"] != "" {
		k.t.Fatalf("Published after a refused Publish: %d entries %v", len(got), err)
	}
}
