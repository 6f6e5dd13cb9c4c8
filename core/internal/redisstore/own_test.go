package redisstore

import (
	"context"
	"strconv"
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

}

func itoa(x int64) string { return strconv.FormatInt(x, 10) }
