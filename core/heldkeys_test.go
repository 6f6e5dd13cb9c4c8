package core

import (
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/memstore"
	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// The process holds no client-chosen bytes beyond a small fixed size per
// entry (issue 26, item 3). TestHeldKeys has 1,000 distinct keys held by
// each per-key structure and measures the heap they leave behind. Before
// keys were kept as digests, each key of 100 KB retained its 100 KB (100
// MB in all; 926 MB with the 900 KB keys), and so did a short key
// cut from a 100 KB string, which shares its memory. Now an entry takes a
// few hundred bytes, whatever the key; heldBytesPerKey (4 KB) leaves a
// wide margin either way.
const (
	longKeys        = 1000
	longKeyBytes    = 100 << 10
	heldBytesPerKey = 4 << 10
)

// heapAfterGC returns the bytes of live heap objects after a full
// collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// longKey returns a fresh key of size bytes that ends with i: distinct
// keys share their first bytes, and each is its own allocation, garbage
// unless something keeps it.
func longKey(size, i int) string {
	b := make([]byte, size)
	for j := range b {
		b[j] = 'k'
	}
	s := strconv.Itoa(i)
	copy(b[size-len(s):], s)
	return string(b)
}

// heldKeyStore is a per-key structure under test: one decides on key (and
// leaves it held), held says how many entries the structure holds, keep
// is kept alive until measured.
type heldKeyStore struct {
	name string
	new  func(t *testing.T) (keep any, one func(key string), held func() int)
}

var heldKeyStores = []heldKeyStore{
	{"deny cache", func(t *testing.T) (any, func(string), func() int) {
		// a Limiter on Redis denies each key once: the cache holds the denial
		p := redistest.Start(t)
		l, err := New(p.Client(t), WithPrefix(uniquePrefix(t)), WithTimeout(patient))
		if err != nil {
			t.Fatal(err)
		}
		return l, func(key string) {
			ctx, lim := context.Background(), PerMinute(1)
			if r, err := l.Allow(ctx, key, lim); err != nil || !r.Allowed {
				t.Fatalf("first request: %+v %v", r, err)
			}
			if r, err := l.Allow(ctx, key, lim); err != nil || r.Allowed {
				t.Fatalf("second request: %+v %v", r, err)
			}
		}, l.cache.len
	}},
	{"memory", func(t *testing.T) (any, func(string), func() int) {
		l := NewMemory()
		return l, func(key string) {
			if r, err := l.Allow(context.Background(), key, PerMinute(1)); err != nil || !r.Allowed {
				t.Fatalf("first request: %+v %v", r, err)
			}
		}, func() int { return heldKeys(l.guard.next.(*memstore.Store)) }
	}},
	{"fail-local", func(t *testing.T) (any, func(string), func() int) {
		// Redis unreachable: FailLocal's store decides, and holds the key
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}) // loopback, a closed port
		t.Cleanup(func() { rdb.Close() })
		l, err := New(rdb, WithFailureMode(FailLocal), WithLocalShare(1), WithTimeout(patient))
		if err != nil {
			t.Fatal(err)
		}
		return l, func(key string) {
			if r, err := l.Allow(context.Background(), key, PerMinute(1)); err != nil || !r.Allowed || r.BackendErr == nil {
				t.Fatalf("first request: %+v %v", r, err)
			}
		}, func() int { return heldKeys(l.guard.local) }
	}},
}

// TestHeldKeys: each per-key structure holds 1,000 distinct keys of 100 KB,
// and 1,000 short keys cut from 100 KB strings, in at most heldBytesPerKey
// each. Not parallel: it measures the process's heap.
func TestHeldKeys(t *testing.T) {
	kinds := []struct {
		name string
		key  func(i int) string
	}{
		{"100 KB keys", func(i int) string { return longKey(longKeyBytes, i) }},
		{"64 bytes of a 100 KB string", func(i int) string { return longKey(longKeyBytes, i)[longKeyBytes-64:] }},
	}
	for _, s := range heldKeyStores {
		for _, k := range kinds {
			t.Run(s.name+"/"+k.name, func(t *testing.T) {
				keep, one, held := s.new(t)
				before := heapAfterGC()
				for i := range longKeys {
					one(k.key(i))
				}
				after := heapAfterGC()
				runtime.KeepAlive(keep)
				if n := held(); n != longKeys {
					t.Fatalf("%d entries held, want %d", n, longKeys)
				}
				per := (float64(after) - float64(before)) / longKeys
				t.Logf("%d keys: heap %d → %d bytes, %.0f bytes per key", longKeys, before, after, per)
				if per > heldBytesPerKey {
					t.Fatalf("%.0f bytes held per key, want at most %d", per, heldBytesPerKey)
				}
			})
		}
	}
}

// heldKeyPairs are keys that must never share an entry: long keys that
// differ only in their last byte, and a key and another key's digest.
func heldKeyPairs() [][2]string {
	a, b, c := longKey(1000, 10), longKey(1000, 20), longKey(1000, 30)
	short := "ip:203.0.113.9"
	return [][2]string{
		{a, a[:len(a)-1] + "1"},                      // long keys that differ in their last byte
		{b, store.HeldKey(b)},                        // a key posing as a long key's digest
		{"#" + short, short},                         // a key starting with '#' is a digest too
		{c[:store.MaxRawKey+1], c[:store.MaxRawKey]}, // the shortest digested key and the longest raw one
	}
}

// TestHeldKeysDistinct: in the deny cache and in the memory backend, a key
// answers for itself only: a long key's denial answers the same key (from
// the cache, for the deny cache) and never a key that differs in one byte,
// nor a key written as its digest.
func TestHeldKeysDistinct(t *testing.T) {
	ctx := context.Background()
	lim := PerMinute(1)
	t.Run("deny cache", func(t *testing.T) {
		p := redistest.Start(t)
		l, rec := faultLimiter(t, p.Client(t), FailOpen, 1, WithTimeout(patient))
		for _, pair := range heldKeyPairs() {
			for i, want := range []bool{true, false} {
				if r, err := l.Allow(ctx, pair[0], lim); err != nil || r.Allowed != want {
					t.Fatalf("%.20q… request %d: %+v %v, want allowed %v", pair[0], i, r, err, want)
				}
			}
			rec.take()
			if r, err := l.Allow(ctx, pair[0], lim); err != nil || r.Allowed || r.RetryAfter <= 0 {
				t.Fatalf("%.20q… again: %+v %v, want denied", pair[0], r, err)
			}
			if ev := rec.take(); len(ev) != 1 || !ev[0].CacheHit {
				t.Fatalf("%.20q… again: events %+v, want one cache hit", pair[0], ev)
			}
			if r, err := l.Allow(ctx, pair[1], lim); err != nil || !r.Allowed {
				t.Fatalf("%.20q… after %.20q… was denied: %+v %v, want allowed", pair[1], pair[0], r, err)
			}
			if ev := rec.take(); len(ev) != 1 || ev[0].CacheHit {
				t.Fatalf("%.20q…: events %+v, want one decision of Redis", pair[1], ev)
			}
		}
	})
	t.Run("memory", func(t *testing.T) {
		l := NewMemory()
		for _, pair := range heldKeyPairs() {
			for i, want := range []bool{true, false} {
				if r, err := l.Allow(ctx, pair[0], lim); err != nil || r.Allowed != want {
					t.Fatalf("%.20q… request %d: %+v %v, want allowed %v", pair[0], i, r, err, want)
				}
			}
			if r, err := l.Allow(ctx, pair[1], lim); err != nil || !r.Allowed {
				t.Fatalf("%.20q… after %.20q… was denied: %+v %v, want allowed", pair[1], pair[0], r, err)
			}
			// the state of the long key is its own: Reset and Block reach it
			if err := l.Block(ctx, pair[1], time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := l.Reset(ctx, pair[0], lim); err != nil {
				t.Fatal(err)
			}
			if r, err := l.Allow(ctx, pair[0], lim); err != nil || !r.Allowed {
				t.Fatalf("%.20q… after Reset: %+v %v, want allowed", pair[0], r, err)
			}
			if r, err := l.Allow(ctx, pair[1], lim); err != nil || r.Allowed || r.RetryAfter < 59*time.Second {
				t.Fatalf("%.20q… blocked: %+v %v, want denied for the block", pair[1], r, err)
			}
		}
	})
}

// TestHeldKeyForms: the forms heldKey and ownKey give, and storage keys
// unchanged by sharing the digest with them.
func TestHeldKeyForms(t *testing.T) {
	long := longKey(store.MaxRawKey+1, 7)
	cases := []struct {
		key, held string
	}{
		{"ip:203.0.113.9", "ip:203.0.113.9"},
		{"a{b}", "a{b}"}, // braces matter only in storage keys
		{long[:store.MaxRawKey], long[:store.MaxRawKey]},
		{long, "#" + keyTag("", long)[2:store.DigestLen+1]},
		{"#x", "#" + keyTag("", "#x")[2:store.DigestLen+1]},
	}
	for _, c := range cases {
		h := store.HeldKey(c.key)
		if h != c.held || len(h) > store.MaxRawKey {
			t.Errorf("store.HeldKey(%.20q…) = %q, want %q", c.key, h, c.held)
		}
		if store.Hashed(c.key) && len(h) != store.DigestLen {
			t.Errorf("digest of %.20q… has %d bytes, want %d", c.key, len(h), store.DigestLen)
		}
		if o := store.OwnKey(h); o != h {
			t.Errorf("store.OwnKey(%q) = %q", h, o)
		}
	}
	if got, want := keyTag(DefaultPrefix, long), "rw:{"+store.HeldKey(long)+"}:"; got != want {
		t.Errorf("storage tag of a long key: %q, want %q", got, want)
	}
}

// TestLimitNameBound: a Limit's Name is at most MaxLimitName bytes, for
// every call and for a rule's LimitsFor sets, which keep none beyond.
func TestLimitNameBound(t *testing.T) {
	ctx := context.Background()
	long := Limit{Name: strings.Repeat("n", MaxLimitName+1), Count: 1, Window: time.Second}
	if err := long.Validate(); err == nil || err.Error() != "ratewindow: invalid limit: a name of 65 bytes is longer than MaxLimitName 64" {
		t.Errorf("Validate: %v", err)
	}
	if _, err := NewMemory().Allow(ctx, "k", long); !errors.Is(err, ErrInvalidLimit) || err.Error() != "ratewindow: invalid limit #0: a name of 65 bytes is longer than MaxLimitName 64" {
		t.Errorf("Allow: %v", err)
	}
	var sets limitSets
	for i := range 100 {
		huge := Limit{Name: longKey(longKeyBytes, i), Count: 1, Window: time.Second}
		if _, err := sets.get([]Limit{huge}); !errors.Is(err, ErrInvalidLimit) {
			t.Fatalf("a LimitsFor set with a name of %d bytes: %v", len(huge.Name), err)
		}
	}
	if len(sets.m) != 0 {
		t.Fatalf("%d sets with overlong names kept", len(sets.m))
	}
}

// TestHeldLimitNames: the deny cache and a rule's LimitsFor sets keep the
// limits' names as strings of their own: 1,000 denials, or sets, whose
// names were cut from 100 KB strings keep at most heldBytesPerKey each
// (each kept its 100 KB before); and the worst case, MaxLimits limits with
// names of MaxLimitName bytes, is logged per entry.
func TestHeldLimitNames(t *testing.T) {
	cut := func(i int) []Limit { // a limit named by 16 bytes of a 100 KB string
		return []Limit{{Name: longKey(longKeyBytes, i)[longKeyBytes-16:], Count: 1, Window: time.Minute}}
	}
	widest := func(i int) []Limit { // MaxLimits limits, names of MaxLimitName
		limits := make([]Limit, MaxLimits)
		for j := range limits {
			limits[j] = Limit{Name: longKey(MaxLimitName, i*MaxLimits+j), Count: 1, Window: time.Duration(j+1) * time.Minute}
		}
		return limits
	}
	cases := []struct {
		name   string
		limits func(i int) []Limit
		bound  float64
	}{
		{"names cut from 100 KB strings", cut, heldBytesPerKey},
		{"MaxLimits limits with names of MaxLimitName", widest, 32 << 10},
	}
	for _, c := range cases {
		t.Run("deny cache/"+c.name, func(t *testing.T) {
			dc := newDenyCache(4 * longKeys) // room to spare in every shard
			before := heapAfterGC()
			for i := range longKeys {
				key := longKey(store.MaxRawKey, i)
				for range 2 { // the second put renews the denial, with limits equal but not the same
					limits := c.limits(i)
					dc.put(key, 1, limits, 0, Result{Limit: limits[0], RetryAfter: time.Minute, ResetAfter: time.Minute})
				}
			}
			after := heapAfterGC()
			runtime.KeepAlive(dc)
			if n := dc.len(); n != longKeys {
				t.Fatalf("%d denials held, want %d", n, longKeys)
			}
			per := (float64(after) - float64(before)) / longKeys
			t.Logf("%d denials: %.0f bytes each", longKeys, per)
			if per > c.bound {
				t.Fatalf("%.0f bytes held per denial, want at most %.0f", per, c.bound)
			}
		})
		t.Run("limit sets/"+c.name, func(t *testing.T) {
			var sets limitSets
			before := heapAfterGC()
			for i := range maxLimitSets {
				if _, err := sets.get(c.limits(i)); err != nil {
					t.Fatal(err)
				}
			}
			after := heapAfterGC()
			runtime.KeepAlive(&sets)
			if len(sets.m) != maxLimitSets {
				t.Fatalf("%d sets kept, want %d", len(sets.m), maxLimitSets)
			}
			per := (float64(after) - float64(before)) / maxLimitSets
			t.Logf("%d sets: %.0f bytes each", maxLimitSets, per)
			if per > c.bound {
				t.Fatalf("%.0f bytes held per set, want at most %.0f", per, c.bound)
			}
		})
	}
}

// TestOwnLimits: ownLimits copies the limits with names of their own,
// equal to the caller's.
func TestOwnLimits(t *testing.T) {
	big := longKey(1000, 1)
	for _, limits := range [][]Limit{
		{PerMinute(1)},
		{{Name: big[:5], Count: 1, Window: time.Second}, PerMinute(2), {Name: big[990:], Count: 3, Window: time.Hour}},
	} {
		own := ownLimits(limits)
		if !slices.Equal(own, limits) {
			t.Fatalf("ownLimits(%v) = %v", limits, own)
		}
		for i := range own {
			if own[i].Name != "" && unsafe.StringData(own[i].Name) == unsafe.StringData(limits[i].Name) {
				t.Fatalf("limit %d shares its name with the caller's", i)
			}
		}
		own[0].Count = 99
		if limits[0].Count == 99 {
			t.Fatal("ownLimits shares the caller's slice")
		}
	}
}

// heldKeys is how many keys s holds, expired ones not yet dropped included.
func heldKeys(s *memstore.Store) int { return len(s.Keys(math.MinInt64)) }
