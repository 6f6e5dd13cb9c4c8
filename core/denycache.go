package core

import (
	"hash/maphash"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// denyCache remembers at most size denials until their RetryAfter has
// passed, asking again at least every denyRecheck (see WithDenyCache). Keys
// are in store.HeldKey's form and limits copied: a fixed size per denial.
//
// An expired denial is asked again by one request (its probe); the others
// wait for its answer: a denial renews it; an admission with room for the
// waiters drops it, and they ask for themselves, together (one at a time,
// a hot key's decisions went one round trip after another for as long as
// the denial stayed: 14,000 a second where 300,000 went without it); an
// admission with room for fewer lets that many go, and one more to learn
// the next denial, while the rest wait for the next probe (all of a
// flood's connections went to Redis at once); a probe Redis did not answer
// leaves it, the last denial, and the next waiter probes. So each
// waiter's answer came after it arrived.
type denyCache struct {
	seed   maphash.Seed
	shards []denyShard
}

const (
	denyShards    = 16
	denialsPerKey = 8 // costs or limit sets remembered for one key
	evictProbes   = 4 // keys looked at for an expired one before evicting
)

type denyShard struct {
	mu      sync.Mutex
	m       map[string][]denial
	n, size int    // denials held, and the most it may hold
	hits    uint32 // denials answered (see get)
	forgot  int64  // ns: the latest forget of a key of the shard (see put)
}

type denial struct {
	n      int64
	limits []Limit
	until  int64 // ns, the Limiter's clock: asked again from then on
	ends   int64 // ns: when its RetryAfter ends
	result Result
	probe  *probe // the request asking the backend again; nil: none
	free   int64  // expired: requests that may ask without waiting for a probe
}

// probe is one request asking about an expired denial; done closes on its
// answer. waiters counts the requests waiting for it.
type probe struct {
	done    chan struct{}
	waiters int64
}

// newDenyCache returns a cache of at most size (> 0) denials.
func newDenyCache(size int) *denyCache {
	n := min(size, denyShards)
	c := &denyCache{seed: maphash.MakeSeed(), shards: make([]denyShard, n)}
	for i := range c.shards { // size/n each, the first size%n one more
		c.shards[i] = denyShard{m: make(map[string][]denial), size: (size + n - 1 - i) / n}
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// instantYield: every instantYield-th answer of a shard made without I/O
// yields the processor: a goroutine deciding in a loop on cached denials
// held it for a scheduler slice (10ms) while the others, their timers and
// Redis's replies waited (measured in docs/performance.md).
const instantYield = 128

// get returns the denial of (key, n, limits) at now (ns), counted down.
// Expired, it returns a probe: wait false, this caller asks the backend
// and must settle p; wait true, it waits for another's p. A shard's
// answers yield now and then (see instantYield).
func (c *denyCache) get(key string, n int64, limits []Limit, now int64) (r Result, ok bool, p *probe, wait bool) {
	sh, d := c.locked(key, n, limits)
	if d != nil && now < d.until {
		r, sh.hits = d.countedDown(now, 0), sh.hits+1
		yield := sh.hits%instantYield == 0
		sh.mu.Unlock()
		if yield {
			runtime.Gosched()
		}
		return r, true, nil, false
	}
	defer sh.mu.Unlock()
	switch {
	case d == nil:
		return Result{}, false, nil, false
	case d.free > 0:
		d.free--
		return Result{}, false, nil, false
	case d.probe != nil:
		d.probe.waiters++
		return Result{}, false, d.probe, true
	}
	d.probe = &probe{done: make(chan struct{})}
	return Result{}, false, d.probe, false
}

// last returns the denial of (key, n, limits), expired or not (then due
// again in a millisecond), counted down to now; it starts no probe.
func (c *denyCache) last(key string, n int64, limits []Limit, now int64) (Result, bool) {
	sh, d := c.locked(key, n, limits)
	defer sh.mu.Unlock()
	if d == nil {
		return Result{}, false
	}
	return d.countedDown(now, time.Millisecond), true
}

// locked returns key's shard, locked, and the denial of (n, limits) or nil.
func (c *denyCache) locked(key string, n int64, limits []Limit) (*denyShard, *denial) {
	sh := c.shard(key)
	sh.mu.Lock()
	ds := sh.m[key]
	for i := range ds {
		if ds[i].n == n && slices.Equal(ds[i].limits, limits) {
			return sh, &ds[i]
		}
	}
	return sh, nil
}

// countedDown returns d at now (ns): RetryAfter the time left, at least
// least; ResetAfter counted down alike, never below RetryAfter.
func (d *denial) countedDown(now int64, least time.Duration) Result {
	r := d.result
	left := time.Duration(d.ends - now)
	elapsed := r.RetryAfter - left
	r.RetryAfter = max(left, least)
	r.ResetAfter = max(r.ResetAfter-elapsed, r.RetryAfter)
	return r
}

// settle ends probe p at now (ns), answered r when Redis answered it (see
// denyCache), and its waiters look again.
func (c *denyCache) settle(key string, n int64, limits []Limit, p *probe, now int64, answered bool, r Result) {
	sh := c.shard(key)
	sh.mu.Lock()
	ds := sh.m[key]
	if i := slices.IndexFunc(ds, func(d denial) bool { return d.probe == p }); i >= 0 {
		ds[i].probe = nil
		switch {
		case !answered || now < ds[i].until: // unanswered, or renewed by a denial
		case !r.Allowed || p.waiters <= r.Remaining+1:
			sh.drop(key, i)
		default:
			ds[i].free = r.Remaining + 1
		}
	}
	sh.mu.Unlock()
	close(p.done)
}

// drop removes key's i-th denial.
func (sh *denyShard) drop(key string, i int) {
	if ds := slices.Delete(sh.m[key], i, i+1); len(ds) > 0 {
		sh.m[key] = ds
	} else {
		delete(sh.m, key)
	}
	sh.n--
}

// denyRecheck is the longest a cached denial answers unasked: another
// replica's Refund, Reset or cancelled Wait reaches this cache within it.
const denyRecheck = time.Second

// put remembers a denial made at now (ns), unless a key of its shard was
// forgotten since (a Reset or Refund while it was decided: it may be stale).
func (c *denyCache) put(key string, n int64, limits []Limit, now int64, r Result) {
	if r.Allowed || r.RetryAfter <= 0 {
		return
	}
	ends, until := now+int64(r.RetryAfter), now+int64(min(r.RetryAfter, denyRecheck))
	sh, d := c.locked(key, n, limits)
	defer sh.mu.Unlock()
	switch {
	case now < sh.forgot:
		return
	case d != nil: // a probe, if any, settles itself
		d.until, d.ends, d.result, d.free = until, ends, ownResult(r, d.limits), 0
		return
	}
	ds := sh.m[key]
	key = store.OwnKey(key) // the map keeps the key of its latest assignment
	switch {
	case len(ds) >= denialsPerKey, len(ds) > 0 && sh.n >= sh.size && len(sh.m) == 1:
		sh.drop(key, 0) // this key's oldest denial
	case sh.n >= sh.size:
		sh.evict(key, now)
	}
	own := ownLimits(limits)
	sh.m[key] = append(sh.m[key], denial{n: n, limits: own, until: until, ends: ends, result: ownResult(r, own)})
	sh.n++
}

// ownResult returns r with its limit's name from own, else cloned: never
// the caller's string.
func ownResult(r Result, own []Limit) Result {
	if i := slices.Index(own, r.Limit); i >= 0 {
		r.Limit.Name = own[i].Name
	} else {
		r.Limit.Name = strings.Clone(r.Limit.Name)
	}
	return r
}

// evict drops the denials of a key other than keep: among the first
// evictProbes keys, one all expired, else the first.
func (sh *denyShard) evict(keep string, now int64) {
	victim, probes := "", 0
	for k, ds := range sh.m {
		if k == keep {
			continue
		}
		expired := !slices.ContainsFunc(ds, func(d denial) bool { return now < d.ends })
		if victim == "" || expired {
			victim = k
		}
		if probes++; expired || probes == evictProbes {
			break
		}
	}
	sh.n -= len(sh.m[victim])
	delete(sh.m, victim)
}

// forget drops every denial of key, at now (ns).
func (c *denyCache) forget(key string, now int64) {
	sh := c.shard(key)
	sh.mu.Lock()
	sh.n -= len(sh.m[key])
	delete(sh.m, key)
	sh.forgot = max(sh.forgot, now)
	sh.mu.Unlock()
}
