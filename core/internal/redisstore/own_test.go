package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestOwnKey: a key's block and override live in its block key, which
// expires with the later of the two (never, for an override without an
// end) and goes when neither is left; a block alone keeps the format every
// version reads.
func TestOwnKey(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	prefix := uniquePrefix(t)
	s := New(rdb, prefix)
	ctx := context.Background()
	key := Tag(prefix, "k") + blockName
	now := time.Now().UnixMicro()
	r := store.Request{Key: "k", Now: now}
	with := func(ttl time.Duration) {
		t.Helper()
		r := r
		r.Limits = []store.Limit{perMinute(2)}
		if err := s.SetOverride(ctx, r, ttl); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(step, value string, pttl time.Duration) {
		t.Helper()
		v, _ := rdb.Get(ctx, key).Result()
		got := rdb.PTTL(ctx, key).Val()
		if v != value || pttl > 0 && (got > pttl || got < pttl-2*time.Second) || pttl <= 0 && got != pttl {
			t.Fatalf("%s: %q for %v, want %q for %v", step, v, got, value, pttl)
		}
	}
	block := func(d time.Duration) {
		t.Helper()
		if err := s.Block(ctx, r, d); err != nil {
			t.Fatal(err)
		}
	}
	do := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	until := func(d time.Duration) int64 { return now + d.Microseconds() }
	block(time.Minute)
	expect("a block alone", itoa(until(time.Minute)), time.Minute)
	with(time.Hour)
	expect("a longer override", itoa(until(time.Minute))+" "+itoa(until(time.Hour))+" 0 60000000 2", time.Hour)
	do(s.RemoveOverride(ctx, r))
	expect("the override removed", itoa(until(time.Minute)), time.Minute)
	with(0)
	expect("an override without an end", itoa(until(time.Minute))+" 0 0 60000000 2", -1)
	do(s.Unblock(ctx, r))
	expect("unblocked", "0 0 0 60000000 2", -1)
	do(s.RemoveOverride(ctx, r))
	expect("neither", "", -2)
	with(time.Second)
	block(time.Minute)
	expect("a longer block", itoa(until(time.Minute))+" "+itoa(until(time.Second))+" 0 60000000 2", time.Minute)
	do(s.Reset(ctx, store.Request{Key: "k", Now: now, Limits: []store.Limit{perMinute(5)}}))
	expect("reset", "0 "+itoa(until(time.Second))+" 0 60000000 2", time.Second)
	block(time.Minute)
	for _, bad := range []string{"", "x 1 2", "0 60000000 2\n"} {
		if _, err := s.own(ctx, r, "set", bad, 0); err == nil || !strings.Contains(err.Error(), "not an override") {
			t.Fatalf("an override %q: %v, want an error", bad, err)
		}
	}
	if _, err := s.own(ctx, r, "drop"); err == nil || !strings.Contains(err.Error(), "no operation") {
		t.Fatalf("an unknown operation: %v, want an error", err)
	}
	expect("after bad input, nothing changed", itoa(until(time.Minute))+" "+itoa(until(time.Second))+" 0 60000000 2", time.Minute)

}

func itoa(x int64) string { return strconv.FormatInt(x, 10) }

// TestMergedWithOverrides: one merged call (allow_batch) of decisions with
// and without an override, of one and two limits and a hot key's run:
// each gets its own answer, the override's Counts only under one.
func TestMergedWithOverrides(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	s := New(rdb, uniquePrefix(t))
	ctx := context.Background()
	minute, hour := perMinute(3), perHour(10)
	for key, l := range map[string]store.Limit{"o1": perMinute(5), "o2": perHour(20)} {
		if err := s.SetOverride(ctx, store.Request{Key: key, Limits: []store.Limit{l}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	rs := []store.Request{decision("a", minute), decision("o1", minute), decision("o1", minute), decision("o1", minute),
		decision("b", minute, hour), decision("o2", minute, hour), decision("c", minute)}
	want := [][]store.State{
		{{Remaining: 2}},
		{{Remaining: 4, Count: 5}}, {{Remaining: 3, Count: 5}}, {{Remaining: 2, Count: 5}},
		{{Remaining: 2}, {Remaining: 9}},
		{{Remaining: 2}, {Remaining: 19, Count: 20}},
		{{Remaining: 2}},
	}
	for i, o := range allowBatch(s, rs) {
		if o.err != nil || !o.d.Allowed || len(o.d.States) != len(want[i]) {
			t.Fatalf("decision %d: %+v %v", i, o.d, o.err)
		}
		for j, st := range o.d.States {
			if st.Remaining != want[i][j].Remaining || st.Count != want[i][j].Count {
				t.Fatalf("decision %d, limit %d: %+v, want remaining %d, Count %d", i, j, st, want[i][j].Remaining, want[i][j].Count)
			}
		}
	}
}
