package core

import (
	"hash/maphash"
	"slices"
	"sync"
)

// maxLimitSets bounds the sets a rule keeps; beyond, each is validated anew.
const maxLimitSets = 1024

// limitSets keeps the validated sets of limits LimitsFor returned, with
// their headers, found by a hash of their contents: a lookup allocates nothing.
type limitSets struct {
	seed maphash.Seed
	mu   sync.RWMutex
	m    map[uint64][]*limitSet // by hash: two sets share one only if their hashes collide
}

// limitSet is one set of limits and its header values.
type limitSet struct {
	limits []Limit // a copy: the caller may change its slice
	hdr    headerSet
}

// get returns the set of limits, validated as Rule.Limits are, or the error.
func (ls *limitSets) get(limits []Limit) (*limitSet, error) {
	var h uint64
	for _, l := range limits {
		h = h*31 + maphash.Comparable(ls.seed, l)
	}
	ls.mu.RLock()
	for _, s := range ls.m[h] {
		if slices.Equal(s.limits, limits) {
			ls.mu.RUnlock()
			return s, nil
		}
	}
	ls.mu.RUnlock()
	if err := ruleLimits(limits); err != nil {
		return nil, err
	}
	s := &limitSet{limits: ownLimits(limits)}
	s.hdr = newHeaderSet(s.limits)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, o := range ls.m[h] {
		if slices.Equal(o.limits, limits) {
			return o, nil // another request kept it first
		}
	}
	if len(ls.m) < maxLimitSets {
		if ls.m == nil {
			ls.m = make(map[uint64][]*limitSet)
		}
		ls.m[h] = append(ls.m[h], s)
	}
	return s, nil
}
