package redisstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// keyTag returns "<prefix>{<key>}:" as appendTag writes it.
func keyTag(prefix, key string) string { return Tag(prefix, key) }

// storageKey returns the storage key of limit l under the tag from keyTag,
// as appendKeys builds it.
func storageKey(tag string, l store.Limit) string { return string(appendLimit([]byte(tag), l)) }

func TestStorageKeys(t *testing.T) {
	cases := []struct {
		key   string
		limit store.Limit
		want  string
	}{
		{"ip:203.0.113.9", perMinute(1), "rw:{ip:203.0.113.9}:v2:r1m"},
		{"u", with(perSecond(1), store.SlidingBuckets), "rw:{u}:v2:b1s"},
		{"u", store.Limit{Count: 1, Window: time.Second, Algorithm: store.SlidingBuckets, Precision: 100 * time.Millisecond}, "rw:{u}:v2:b1s/100ms"},
		{"u", with(per(1, 1500*time.Microsecond), store.SlidingCounter), "rw:{u}:v2:c1500us"},
		{"a{b}", perSecond(1), "rw:{#uKS3Bgk7nHEuACsbKDwEhg}:v2:r1s"},
	}
	for _, c := range cases {
		if got := storageKey(keyTag(testPrefix, c.key), c.limit); got != c.want {
			t.Errorf("%q %v: got %q, want %q", c.key, c.limit, got, c.want)
		}
	}
}

// TestAppendKeys: the block and penalty keys as own asks, then one key per
// limit, built with one allocation whatever their number.
func TestAppendKeys(t *testing.T) {
	limits := []store.Limit{perSecond(1), with(perMinute(10), store.SlidingBuckets), with(perHour(100), store.SlidingCounter)}
	cases := []struct {
		own  int
		want []string
	}{
		{0, []string{"rw:{k}:v2:r1s", "rw:{k}:v2:b1m", "rw:{k}:v2:c1h"}},
		{withBlock, []string{"rw:{k}:block", "rw:{k}:v2:r1s", "rw:{k}:v2:b1m", "rw:{k}:v2:c1h"}},
		{withBlock | withPenalty, []string{"rw:{k}:block", "rw:{k}:penalty", "rw:{k}:v2:r1s", "rw:{k}:v2:b1m", "rw:{k}:v2:c1h"}},
		{withPenalty, []string{"rw:{k}:penalty", "rw:{k}:v2:r1s", "rw:{k}:v2:b1m", "rw:{k}:v2:c1h"}},
	}
	for _, c := range cases {
		got := appendKeys([]string{"before"}, testPrefix, "k", limits, c.own)
		if len(got) != 1+len(c.want) || got[0] != "before" {
			t.Fatalf("own %b: got %q", c.own, got)
		}
		for i, w := range c.want {
			if got[1+i] != w {
				t.Errorf("own %b: key %d is %q, want %q", c.own, i, got[1+i], w)
			}
		}
	}
	many := make([]store.Limit, store.MaxLimits+3) // beyond the stack's room: still right
	for i := range many {
		many[i] = per(int64(i+1), time.Duration(i+1)*time.Second)
	}
	if got := appendKeys(nil, testPrefix, "k", many, withBlock|withPenalty); len(got) != 2+len(many) || got[len(got)-1] != "rw:{k}:v2:r19s" {
		t.Fatalf("many limits: %d keys, last %q", len(got), got[len(got)-1])
	}
	dst := make([]string, 0, 8)
	if n := testing.AllocsPerRun(100, func() { dst = appendKeys(dst[:0], testPrefix, "k", limits, withBlock|withPenalty) }); n != 1 {
		t.Errorf("%v allocations, want 1", n)
	}
}

// TestNodeOffCluster: on a single server, Node answers "" without building
// the key's hash tag: no allocation on every decision's way.
func TestNodeOffCluster(t *testing.T) {
	for _, rdb := range []redis.Scripter{
		redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}),
	} {
		s := New(rdb, testPrefix)
		var node string
		if n := testing.AllocsPerRun(100, func() { node = s.Node("a key of forty bytes, long enough to tell") }); n != 0 || node != "" {
			t.Errorf("%T: Node returned %q with %v allocations, want \"\" and none", rdb, node, n)
		}
	}
}
