package memstore

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/core/internal/storetest"
)

// TestConformance runs the backends' conformance suite on the memory
// store.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return New(func() int64 { panic("storetest gives every time") })
	})
}

// t0 is a whole hour in µs since the epoch.
var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC).UnixMicro()

// len is the number of keys the store holds.
func (s *Store) len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].keys)
		s.shards[i].mu.Unlock()
	}
	return n
}

// expires returns when key expires, 0 when the store does not hold it.
func (s *Store) expires(key string) int64 {
	key = store.HeldKey(key)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if mk := sh.keys[key]; mk != nil {
		return mk.expires
	}
	return 0
}

// allow decides one committed request and fails unless it is admitted.
func allow(t *testing.T, s *Store, key string, n, now int64, limits ...store.Limit) store.Decision {
	t.Helper()
	d, err := s.Allow(context.Background(), store.Request{Key: key, N: n, Limits: limits, Now: now, Commit: true})
	if err != nil || !d.Allowed {
		t.Fatalf("%.20q… at %d: %+v %v, want admitted", key, now, d, err)
	}
	return d
}

// Expired state is dropped: after a flood of distinct keys and one window,
// touching other keys sweeps the old ones away.
func TestDropsExpiredKeys(t *testing.T) {
	s := New(func() int64 { panic("every call gives its time") })
	for _, a := range []store.Algorithm{store.SlidingLog, store.SlidingBuckets, store.SlidingCounter} {
		lim := store.Limit{Algorithm: a, Count: 5, Window: time.Second}
		for i := 0; i < 20000; i++ {
			allow(t, s, fmt.Sprint("flood-", a, i), 1, t0, lim)
		}
	}
	if n := s.len(); n != 60000 {
		t.Fatalf("keys after the flood: %d", n)
	}
	// steady traffic on a few keys, after the window, sweeps the expired ones
	live := store.Limit{Count: 1000000, Window: time.Second}
	for i := 0; i < 200000; i++ {
		allow(t, s, "live-"+strconv.Itoa(i%100), 1, t0+3*int64(time.Second/time.Microsecond), live)
	}
	if n := s.len(); n > 100+1000 {
		t.Fatalf("keys after the window: %d, want about 100", n)
	}
}

// A key is held until its state has no unit left in its window, as the
// Redis scripts set the TTLs of its storage keys: a log's last unit plus
// the window, a bucket's end plus the window, a counter's window plus
// two windows. Decisions at 0, 0.1 s, 2 s and 2.1 s of a 10 s window.
func TestKeyExpiry(t *testing.T) {
	const window = 10 * time.Second
	w := int64(window / time.Microsecond)
	prec := int64(store.DefaultPrecision(window) / time.Microsecond)
	for _, c := range []struct {
		alg     store.Algorithm
		expires func(now int64) int64
	}{
		{store.SlidingLog, func(now int64) int64 { return now + w }},
		{store.SlidingBuckets, func(now int64) int64 { return (now/prec+1)*prec + w }},
		{store.SlidingCounter, func(now int64) int64 { return (now/w + 2) * w }},
	} {
		t.Run(algorithmNames[c.alg], func(t *testing.T) {
			s := New(nil)
			lim := store.Limit{Algorithm: c.alg, Count: 100, Window: window}
			for i, at := range []int64{0, 100000, 2000000, 2100000} {
				now := t0 + at
				if d := allow(t, s, "k", 1, now, lim); d.States[0].Remaining != int64(99-i) || d.States[0].Reset != c.expires(now)-now {
					t.Fatalf("decision %d: %+v", i, d)
				}
				if got, want := s.expires("k"), c.expires(now); got != want {
					t.Fatalf("decision %d: expires at %d, want %d", i, got, want)
				}
			}
			// a block or a penalty's denials outlast the units: the key is
			// held until they end
			if err := s.Block(context.Background(), store.Request{Key: "k", Now: t0}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if got, want := s.expires("k"), t0+int64(time.Hour/time.Microsecond); got != want {
				t.Fatalf("blocked: expires at %d, want %d", got, want)
			}
		})
	}
}

// A huge counter limit does not overflow: Count × Window in µs is far
// beyond int64.
func TestCounterHugeLimit(t *testing.T) {
	s := New(func() int64 { return t0 })
	lim := store.Limit{Count: 1 << 40, Window: time.Hour, Algorithm: store.SlidingCounter}
	d, err := s.Allow(context.Background(), store.Request{Key: "huge", N: 1 << 30, Limits: []store.Limit{lim}, Commit: true})
	if err != nil || !d.Allowed || d.States[0].Remaining != 1<<40-1<<30 || d.At != t0 {
		t.Fatalf("%+v %v", d, err)
	}
}

// The store's clock answers a Request whose Now is 0, for every method.
func TestClock(t *testing.T) {
	now := t0
	s := New(func() int64 { return now })
	ctx := context.Background()
	lim := store.Limit{Count: 2, Window: time.Second}
	r := store.Request{Key: "k", N: 1, Limits: []store.Limit{lim}, Commit: true}
	if d, err := s.Allow(ctx, r); err != nil || d.At != t0 || d.States[0].Reset != 1000000 {
		t.Fatalf("Allow: %+v %v", d, err)
	}
	now += 500000
	if res, err := s.Reserve(ctx, r, -1); err != nil || res != (store.Reservation{OK: true, Wait: 0, At: now}) {
		t.Fatalf("Reserve: %+v %v", res, err)
	}
	if err := s.Block(ctx, store.Request{Key: "k"}, time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := s.expires("k"), now+1000000; got != want {
		t.Fatalf("blocked until %d, want %d", got, want)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
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

// TestHeldKeysDistinct: a key answers for itself only: never for a key
// that differs in one byte, nor for a key written as its digest; Reset and
// Block reach a long key's own state.
func TestHeldKeysDistinct(t *testing.T) {
	ctx := context.Background()
	lim := store.Limit{Count: 1, Window: time.Minute}
	s := New(func() int64 { return t0 })
	for _, pair := range heldKeyPairs() {
		r0 := store.Request{Key: pair[0], N: 1, Limits: []store.Limit{lim}, Commit: true}
		r1 := r0
		r1.Key = pair[1]
		for i, want := range []bool{true, false} {
			if d, err := s.Allow(ctx, r0); err != nil || d.Allowed != want {
				t.Fatalf("%.20q… request %d: %+v %v, want allowed %v", pair[0], i, d, err, want)
			}
		}
		if d, err := s.Allow(ctx, r1); err != nil || !d.Allowed {
			t.Fatalf("%.20q… after %.20q… was denied: %+v %v, want allowed", pair[1], pair[0], d, err)
		}
		if err := s.Block(ctx, r1, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Reset(ctx, r0); err != nil {
			t.Fatal(err)
		}
		if d, err := s.Allow(ctx, r0); err != nil || !d.Allowed {
			t.Fatalf("%.20q… after Reset: %+v %v, want allowed", pair[0], d, err)
		}
		if d, err := s.Allow(ctx, r1); err != nil || d.Allowed || !d.Blocked || d.States[0].Retry != 60000000 {
			t.Fatalf("%.20q… blocked: %+v %v, want denied for the block", pair[1], d, err)
		}
	}
}

// TestHeldKeys: the store holds 1,000 distinct keys of 100 KB, and 1,000
// short keys cut from 100 KB strings, in at most 4 KB each (each key kept
// its 100 KB before keys were held as digests, or copied). Not parallel:
// it measures the process's heap.
func TestHeldKeys(t *testing.T) {
	const (
		keys     = 1000
		keyBytes = 100 << 10
		perKey   = 4 << 10
	)
	for _, k := range []struct {
		name string
		key  func(i int) string
	}{
		{"100 KB keys", func(i int) string { return longKey(keyBytes, i) }},
		{"64 bytes of a 100 KB string", func(i int) string { return longKey(keyBytes, i)[keyBytes-64:] }},
	} {
		t.Run(k.name, func(t *testing.T) {
			s := New(func() int64 { return t0 })
			lim := store.Limit{Count: 1, Window: time.Minute}
			before := heapAfterGC()
			for i := range keys {
				allow(t, s, k.key(i), 1, 0, lim)
			}
			after := heapAfterGC()
			runtime.KeepAlive(s)
			if n := s.len(); n != keys {
				t.Fatalf("%d entries held, want %d", n, keys)
			}
			per := (float64(after) - float64(before)) / keys
			t.Logf("%d keys: heap %d → %d bytes, %.0f bytes per key", keys, before, after, per)
			if per > perKey {
				t.Fatalf("%.0f bytes held per key, want at most %d", per, perKey)
			}
		})
	}
}

// heapAfterGC returns the bytes of live heap objects after a full
// collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
