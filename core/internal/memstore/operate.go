package memstore

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// override is a key's own limits (their Counts), until end (µs; 0: until
// removed).
type override struct {
	limits []store.Limit
	until  int64
}

// end returns when o stops keeping its key (math.MaxInt64: never; 0: nil).
func (o *override) end() int64 {
	switch {
	case o == nil:
		return 0
	case o.until == 0:
		return math.MaxInt64
	}
	return o.until
}

// count returns the Count of l in force at now, and the override's Count
// when one applies (else 0), as override_count in algorithms.lua.
func (o *override) count(l store.Limit, now int64) (int64, int64) {
	if o == nil || o.until != 0 && o.until <= now {
		return l.Count, 0
	}
	for _, ol := range o.limits {
		if ol.Algorithm == l.Algorithm && ol.Window == l.Window {
			return ol.Count, ol.Count
		}
	}
	return l.Count, 0
}

// SetOverride keeps r.Limits as r.Key's override, for ttl (0: until removed).
func (s *Store) SetOverride(_ context.Context, r store.Request, ttl time.Duration) error {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	o := &override{limits: slices.Clone(r.Limits)}
	if ttl > 0 {
		o.until = now + max(ttl.Microseconds(), 1)
	}
	sh.key(key).override = o
	return nil
}

// Override returns r.Key's override in force and its time left.
func (s *Store) Override(_ context.Context, r store.Request) ([]store.Limit, time.Duration, error) {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	o := sh.keys[key].live(now)
	if o == nil {
		return nil, 0, nil
	}
	var left time.Duration
	if o.until != 0 {
		left = time.Duration(o.until-now) * time.Microsecond
	}
	return slices.Clone(o.limits), left, nil
}

// live returns mk's override in force at now, or nil (also for a nil mk).
func (mk *memKey) live(now int64) *override {
	if mk == nil || mk.override.end() <= now {
		return nil
	}
	return mk.override
}

// RemoveOverride drops r.Key's override.
func (s *Store) RemoveOverride(_ context.Context, r store.Request) error {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	if mk := sh.keys[key]; mk != nil {
		mk.override = nil
	}
	return nil
}

// Blocked returns how long r.Key stays blocked.
func (s *Store) Blocked(_ context.Context, r store.Request) (time.Duration, error) {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	if mk := sh.keys[key]; mk != nil && mk.blocked > now {
		return time.Duration(mk.blocked-now) * time.Microsecond, nil
	}
	return 0, nil
}

// Unblock lifts r.Key's block.
func (s *Store) Unblock(_ context.Context, r store.Request) error {
	sh, key, now := s.lock(r.Key, r.Now)
	defer sh.unlock(key, now)
	if mk := sh.keys[key]; mk != nil {
		mk.blocked = 0
	}
	return nil
}

// ops is what the operating methods keep beside the keys: the keys denied
// most (by rule and minute) and the registry of published rules.
type ops struct {
	mu        sync.Mutex
	denied    map[deniedMinute]map[string]int64 // at most store.TopKept keys each
	published map[string]publishedEntry
}

type deniedMinute struct {
	rule   string
	minute int64
}

type publishedEntry struct {
	value   string
	expires int64 // µs
}

// CountDenied adds denials to rule's counts of the minute of now, keeping
// the store.TopKept keys most denied, as the Redis backend's sorted set.
func (s *Store) CountDenied(_ context.Context, rule string, denials map[string]int64, now int64) error {
	o := &s.ops
	o.mu.Lock()
	defer o.mu.Unlock()
	minute := store.Minute(now)
	if o.denied == nil {
		o.denied = make(map[deniedMinute]map[string]int64)
	}
	for dm := range o.denied { // expired minutes go
		if minute-dm.minute > int64(store.DeniedTTL/time.Minute) {
			delete(o.denied, dm)
		}
	}
	dm := deniedMinute{rule, minute}
	counts := o.denied[dm]
	if counts == nil {
		counts = make(map[string]int64)
		o.denied[dm] = counts
	}
	for k, n := range denials {
		counts[store.OwnKey(store.HeldKey(k))] += n
	}
	if len(counts) > store.TopKept { // the fewest denials go, as ZREMRANGEBYRANK drops them
		type kc struct {
			k string
			n int64
		}
		all := make([]kc, 0, len(counts))
		for k, n := range counts {
			all = append(all, kc{k, n})
		}
		slices.SortFunc(all, func(a, b kc) int { return cmp.Or(cmp.Compare(a.n, b.n), cmp.Compare(a.k, b.k)) })
		for _, e := range all[:len(all)-store.TopKept] {
			delete(counts, e.k)
		}
	}
	return nil
}

// TopDenied sums rule's counts of the minutes since since ago.
func (s *Store) TopDenied(_ context.Context, rule string, since time.Duration, now int64) (map[string]int64, error) {
	o := &s.ops
	o.mu.Lock()
	defer o.mu.Unlock()
	sum := make(map[string]int64)
	for m := store.Minute(now - since.Microseconds()); m <= store.Minute(now); m++ {
		for k, n := range o.denied[deniedMinute{rule, m}] {
			sum[k] += n
		}
	}
	return sum, nil
}

// Publish keeps entries until store.PublishTTL from now.
func (s *Store) Publish(_ context.Context, entries map[string]string, now int64) error {
	o := &s.ops
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.published == nil {
		o.published = make(map[string]publishedEntry)
	}
	n := len(entries)
	for name, e := range o.published {
		if e.expires <= now {
			delete(o.published, name)
		} else if _, again := entries[name]; !again {
			n++
		}
	}
	if n > store.MaxPublished {
		return fmt.Errorf("ratewindow: %d rules published, above %d", n, store.MaxPublished)
	}
	for name, v := range entries {
		o.published[name] = publishedEntry{v, now + store.PublishTTL.Microseconds()}
	}
	return nil
}

// Published returns the entries not expired at now.
func (s *Store) Published(_ context.Context, now int64) (map[string]string, error) {
	o := &s.ops
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string]string)
	for name, e := range o.published {
		if e.expires > now {
			m[name] = e.value
		}
	}
	return m, nil
}
