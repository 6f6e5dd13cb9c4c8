package redisstore

import "github.com/redis/go-redis/v9"

// The transport's test seam: the few things a test of the Store needs from
// its transport, so that the tests name no field of it.

// holdSlots takes every slot of the single server's lane, as flushers at
// work would (none is), so that calls queue and stay queued; release gives
// the slots back.
func (t *transport) holdSlots() (release func()) {
	t.mu.Lock()
	t.one.inflight += t.inflightLimit
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		t.one.inflight -= t.inflightLimit
		t.mu.Unlock()
	}
}

// queued returns how many calls wait on the single server's lane.
func (t *transport) queued() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.one.queue)
}

// takeQueued empties the single server's lane and returns the calls that
// waited on it, in their order, for a test to send as a flusher would.
func (t *transport) takeQueued() []*call {
	t.mu.Lock()
	defer t.mu.Unlock()
	batch := t.one.queue
	t.one.queue = nil
	return batch
}

// hookDeadlineClient adds h to the clone of the client that unbatched
// calls go through (it runs none of the client's hooks); nothing when
// there is no clone.
func (t *transport) hookDeadlineClient(h redis.Hook) {
	if c, ok := t.deadlineClient.(*redis.Client); ok && t.deadlineClient != t.rdb {
		c.AddHook(h)
	}
}
