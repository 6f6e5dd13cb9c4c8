package redisstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/core/internal/storetest"
)

// TestParseAllow reads allow.lua's reply as each path delivers it: the
// IntSliceCmd of a lone FCALL (fcallInts), a merged FCALL's share as
// *[]int64, []any from EVALSHA, with the override's Counts (blocked's bit
// 4) and without; and refuses what is not such a reply with
// ErrUnexpectedReply.
func TestParseAllow(t *testing.T) {
	const limits = 2
	want := store.Decision{Allowed: true, Blocked: true, At: 1700000000000000, States: []store.State{
		{Remaining: 7, Retry: 0, Reset: 60000000},
		{Remaining: 1, Retry: 0, Reset: 1000000, Count: 9},
	}}
	ints := []int64{1, 1 | overridden, 1700000000000000, 7, 0, 60000000, 1, 0, 1000000, 0, 9}
	plain := []int64{1, 1, 1700000000000000, 7, 0, 60000000, 1, 0, 1000000}
	wantPlain := store.Decision{Allowed: true, Blocked: true, At: 1700000000000000, States: []store.State{
		{Remaining: 7, Retry: 0, Reset: 60000000},
		{Remaining: 1, Retry: 0, Reset: 1000000},
	}}
	boxed := make([]any, len(ints))
	for i, v := range ints {
		boxed[i] = v
	}
	short := ints[:5]
	intsCmd := redis.NewIntSliceCmd(context.Background())
	intsCmd.SetVal(ints)
	asStrings := append([]any{}, boxed...)
	asStrings[2] = "1700000000000000"
	tests := []struct {
		name  string
		reply any
		ok    bool
	}{
		{"without an override", &plain, true},
		{"without an override, too long", &[]int64{1, 1, 1700000000000000, 7, 0, 60000000, 1, 0, 1000000, 0}, false},
		{"lone FCALL", intsCmd, true},
		{"merged FCALL", &ints, true},
		{"EVALSHA", boxed, true},
		{"numbers as strings", asStrings, true},
		{"too short", boxed[:10], false},
		{"too short, merged", &short, false},
		{"too long, boxed", append(append([]any{}, boxed...), int64(0)), false},
		{"not a number", append(append([]any{}, boxed[:10]...), "x"), false},
		{"an error value", append(append([]any{}, boxed[:10]...), errors.New("WRONGTYPE")), false},
		{"not an array", int64(1), false},
		{"nil", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAllow(tc.reply, make([]store.State, limits))
			if !tc.ok {
				if !errors.Is(err, store.ErrUnexpectedReply) {
					t.Fatalf("parseAllow = %v, want ErrUnexpectedReply", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w := want
			if tc.reply == &plain {
				w = wantPlain
			}
			if !storetest.Same(got, w, limits) {
				t.Fatalf("parsed %+v, want %+v", got, w)
			}
		})
	}
}

// TestLimitArgs: a limit's script arguments are right whatever the slots
// hold (limits sharing a slot take it over from each other, goroutines at
// once), and boxed once: a limit used again allocates nothing.
func TestLimitArgs(t *testing.T) {
	var c limitArgs
	var limits []store.Limit
	for i := range 3 * limitArgSlots { // more than the slots: some share
		l := store.Limit{Count: int64(100 + i), Window: time.Duration(1+i%7) * time.Second, Algorithm: store.Algorithm(i % 3)}
		if i%5 == 0 {
			l.Precision = 10 * time.Millisecond
		}
		limits = append(limits, l)
	}
	want := func(l store.Limit) [4]any {
		return [4]any{int(l.Algorithm), l.Count, micros(l.Window), micros(l.Step())}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				l := limits[(g*7+i)%len(limits)]
				if got := c.entry(l).args; got != want(l) {
					t.Errorf("limit %+v: args %v, want %v", l, got, want(l))
					return
				}
			}
		})
	}
	wg.Wait()
	l := limits[0]
	c.entry(l)
	if n := testing.AllocsPerRun(100, func() { c.entry(l) }); n != 0 {
		t.Fatalf("a limit used again: %v allocations, want 0", n)
	}
}

// TestSpec: allow.lua's spec of a decision (see spec_of in
// algorithms.lua), made once for a limit alone without penalty (no
// allocation when it is used again), on every call for any other.
func TestSpec(t *testing.T) {
	s := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "t:")
	log := store.Limit{Count: 5, Window: time.Minute, Algorithm: store.SlidingLog}
	counter := store.Limit{Count: 7, Window: time.Second, Precision: 10 * time.Millisecond, Algorithm: store.SlidingCounter}
	pen := store.Penalty{Denials: 3, Within: time.Minute, Ban: 20 * time.Second}
	for _, c := range []struct {
		name string
		r    store.Request
		want string
	}{
		{"one limit", store.Request{Limits: []store.Limit{log}, Commit: true}, "1 0 0 0 0 5 60000000 1000000"},
		{"one limit, peek", store.Request{Limits: []store.Limit{log}}, "0 0 0 0 0 5 60000000 1000000"},
		{"a precision", store.Request{Limits: []store.Limit{counter}, Commit: true}, "1 0 0 0 2 7 1000000 10000"},
		{"a penalty", store.Request{Limits: []store.Limit{log}, Commit: true, Penalty: pen}, "1 3 60000000 20000000 0 5 60000000 1000000"},
		{"two limits", store.Request{Limits: []store.Limit{log, counter}}, "0 0 0 0 0 5 60000000 1000000 2 7 1000000 10000"},
	} {
		if got := s.spec(c.r); got != c.want {
			t.Errorf("%s: spec %q, want %q", c.name, got, c.want)
		}
	}
	r := store.Request{Limits: []store.Limit{log}, Commit: true}
	s.spec(r)
	if n := testing.AllocsPerRun(100, func() { s.spec(r) }); n != 0 {
		t.Fatalf("a limit's spec used again: %v allocations, want 0", n)
	}
}
