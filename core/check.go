package core

import (
	"context"
	"errors"
)

// Check reports whether the Limiter can do its job: nil only when Redis is
// reachable, accepts this client's credentials, lets it run the scripts
// (EVAL and EVALSHA) on keys under the Limiter's prefix, takes a write
// there (one small key with a 1s TTL), and will not evict the Limiter's
// keys: maxmemory is 0, or maxmemory-policy is noeviction (every key has a
// TTL, so volatile-* policies evict them too, and an evicted key lets more
// requests pass than the limit).
//
// Call it at start-up and in readiness probes: New does not contact Redis,
// and the failure mode hides a Redis that refuses every call. On a Cluster
// it checks every master, on a Ring every shard. The memory Limiter always
// passes.
//
// A Redis that refuses the write (memory above maxmemory under noeviction,
// a read-only replica, a failed save) is an error that matches ErrNoWrites
// and says what to do. An eviction policy that would evict matches
// ErrEvictionPolicy. When the policy cannot be read (an ACL forbids both
// CONFIG GET and INFO, or the server has neither, as miniredis), the error
// matches ErrCheckIncomplete and says why. Other errors wrap Redis's own
// (WRONGPASS, NOPERM, a refused dial).
//
// Check also loads the scripts that decisions run (about 130 KB), so that
// a Redis that cannot take them fails Check, with an error that matches
// ErrNoWrites, rather than the first decision. A nil ctx is an error.
func (l *Limiter) Check(ctx context.Context) error {
	if ctx == nil {
		return errors.New("ratewindow: check: nil context")
	}
	return l.guard.next.Check(ctx)
}
