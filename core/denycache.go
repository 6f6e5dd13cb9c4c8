package core

import (
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// denyCache remembers denials until their RetryAfter has passed. A denial
// is final until then (denied requests add nothing and units leave on
// schedule), so answering a repeat request from here never changes a
// decision. Entries are keyed by key, limits and cost: a smaller cost goes
// to the backend. The size is bounded: when a shard is full, an arbitrary
// entry is evicted.
type denyCache struct {
	seed   maphash.Seed
	perCap int
	shards [denyShards]denyShard
}

const denyShards = 16

type denyShard struct {
	mu sync.Mutex
	m  map[string][]denial
}

type denial struct {
	n      int64
	limits []Limit
	until  int64 // ns on the Limiter's clock
	result Result
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), perCap: max(size/denyShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]denial)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%denyShards]
}

// get returns the cached denial of (key, n, limits) at now (ns), with its
// durations counted down.
func (c *denyCache) get(key string, n int64, limits []Limit, now int64) (Result, bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ds := sh.m[key]
	for i, d := range ds {
		if d.n != n || !slices.Equal(d.limits, limits) {
			continue
		}
		if now >= d.until {
			sh.m[key] = slices.Delete(ds, i, i+1)
			if len(sh.m[key]) == 0 {
				delete(sh.m, key)
			}
			return Result{}, false
		}
		r := d.result
		left := d.until - now
		elapsed := int64(r.RetryAfter) - left
		r.RetryAfter -= time.Duration(elapsed)
		r.ResetAfter = max(r.ResetAfter-time.Duration(elapsed), r.RetryAfter)
		return r, true
	}
	return Result{}, false
}

// put remembers a denial made at now (ns) until its RetryAfter has passed.
func (c *denyCache) put(key string, n int64, limits []Limit, now int64, r Result) {
	if r.Allowed || r.RetryAfter <= 0 {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ds, ok := sh.m[key]
	if !ok && len(sh.m) >= c.perCap {
		for k := range sh.m { // map order is random: evict any one
			delete(sh.m, k)
			break
		}
	}
	for i, d := range ds {
		if d.n == n && slices.Equal(d.limits, limits) {
			ds[i].until, ds[i].result = now+int64(r.RetryAfter), r
			return
		}
	}
	if len(ds) >= 8 { // many costs for one key: keep the newest
		ds = ds[1:]
	}
	sh.m[key] = append(ds, denial{n: n, limits: slices.Clone(limits), until: now + int64(r.RetryAfter), result: r})
}

// forget drops every denial of key.
func (c *denyCache) forget(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}
