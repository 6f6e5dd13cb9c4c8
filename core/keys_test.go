package core

import (
	"testing"
	"time"
)

// keyTag returns "<prefix>{<key>}:" as appendTag writes it.
func keyTag(prefix, key string) string { return string(appendTag(nil, prefix, key)) }

// storageKey returns the storage key of limit l under the tag from keyTag,
// as appendKeys builds it.
func storageKey(tag string, l Limit) string { return string(appendLimit([]byte(tag), l)) }

func TestStorageKeys(t *testing.T) {
	cases := []struct {
		key   string
		limit Limit
		want  string
	}{
		{"ip:203.0.113.9", PerMinute(1), "rw:{ip:203.0.113.9}:l1m"},
		{"u", PerSecond(1).With(SlidingBuckets), "rw:{u}:b1s"},
		{"u", Limit{Count: 1, Window: time.Second, Algorithm: SlidingBuckets, Precision: 100 * time.Millisecond}, "rw:{u}:b1s/100ms"},
		{"u", Per(1, 1500*time.Microsecond).With(SlidingCounter), "rw:{u}:c1500us"},
		{"a{b}", PerSecond(1), "rw:{#uKS3Bgk7nHEuACsbKDwEhg}:l1s"},
	}
	for _, c := range cases {
		if got := storageKey(keyTag(DefaultPrefix, c.key), c.limit); got != c.want {
			t.Errorf("%q %v: got %q, want %q", c.key, c.limit, got, c.want)
		}
	}
}
