package memstore

import "github.com/ratewindow/ratewindow/core/internal/store"

// Keys returns the keys (in their held form) whose state is live at now
// (µs; math.MinInt64: every key held, expired ones not yet dropped
// included), for tests and diagnostics.
func (s *Store) Keys(now int64) []string {
	var keys []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, mk := range sh.keys {
			if mk.expires > now {
				keys = append(keys, k)
			}
		}
		sh.mu.Unlock()
	}
	return keys
}

// Units returns how many units key's sliding log of l holds, reservations
// included, expired ones not yet dropped included.
func (s *Store) Units(key string, l store.Limit) int64 {
	key = store.HeldKey(key)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if st := sh.keys[key].find(l); st != nil {
		return int64(len(st.log))
	}
	return 0
}
