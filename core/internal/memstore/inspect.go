package memstore

import "github.com/ratewindow/ratewindow/core/internal/store"

// Keys returns the keys (in their held form) whose state is live at now
// (µs), for tests and diagnostics.
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

// Len returns how many keys the store holds, expired ones not yet dropped
// included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].keys)
		s.shards[i].mu.Unlock()
	}
	return n
}

// Units returns how many units key's sliding log of l holds, reservations
// included, expired ones not yet dropped included.
func (s *Store) Units(key string, l store.Limit) int64 {
	key = store.HeldKey(key)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if mk := sh.keys[key]; mk != nil {
		if st := mk.find(l); st != nil {
			return int64(len(st.log))
		}
	}
	return 0
}
