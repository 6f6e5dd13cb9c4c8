package core

import (
	"fmt"
	"time"
)

// Option configures a Limiter. Build one with the With functions.
type Option struct{ apply func(*config) }

type config struct {
	prefix    string
	clock     func() time.Time
	timeout   time.Duration
	waitTime  time.Duration
	mode      FailureMode
	share     float64
	cacheSize int
	observer  Observer
}

func defaults() config {
	return config{prefix: DefaultPrefix, timeout: DefaultTimeout, waitTime: DefaultWaitTimeout, cacheSize: DefaultDenyCacheSize}
}

const (
	// DefaultPrefix starts every storage key: "rw:{<key>}:r1m".
	DefaultPrefix = "rw:"
	// DefaultTimeout bounds each call to Redis.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultDenyCacheSize is the number of denials a Limiter remembers.
	DefaultDenyCacheSize = 10000
)

// WithPrefix sets the prefix of every storage key. Default DefaultPrefix.
func WithPrefix(prefix string) Option { return Option{func(c *config) { c.prefix = prefix }} }

// WithClock makes the Limiter read the time from now instead of the Redis
// server's TIME (or the process clock for NewMemory). It is for tests with
// a controlled clock, such as miniredis.SetTime; in production every replica
// must use the server's time.
func WithClock(now func() time.Time) Option { return Option{func(c *config) { c.clock = now }} }

// WithTimeout bounds every call to Redis: a decision that takes longer is a
// failure, answered by the failure mode, with a Result.BackendErr that wraps
// context.DeadlineExceeded. The caller's context deadline still applies when
// it is earlier. Zero means no bound beyond the caller's context. Default
// DefaultTimeout.
//
// A timeout is a failure of Redis only when Redis answered nothing since
// the call was sent (on a Cluster, the key's master); otherwise Redis or
// this process is overloaded: the circuit breaker does not count it.
// Either way, a cached denial of the key answers a call that ran out of
// time if there is one (see WithDenyCache); otherwise the call goes again
// once, within the caller's context, before the failure mode answers
// (FailLocal answers at once: its local decision counts units): a decision
// takes at most two timeouts (a slow moment, the first decisions of an
// outage), and none while the breaker is open, but for the one probe that
// asks Redis again. An error that Redis
// answered (a script error, NOPERM, OOM, TRYAGAIN) is that decision's
// failure, answered by the failure mode at once; it never opens the
// breaker for other keys. A waiter for another request's answer about the
// same key (see WithDenyCache) waits at most d.
//
// The bound holds whatever the client's options. A go-redis client created
// with ContextTimeoutEnabled: true ends its own read at the deadline. A
// *redis.Client without it (the go-redis default; a failover client too)
// sends a decision alone through its WithTimeout(d) clone, on the caller's
// goroutine: the same connections, reads that end at d. Such a clone runs
// none of the client's hooks: for hooks (tracing, metrics) that see every
// call, create the client with ContextTimeoutEnabled. Any other call (a caller's
// deadline sooner than d, a Cluster or Ring without ContextTimeoutEnabled)
// runs on a goroutine of its own that the decision stops waiting for at
// the deadline, and whose call ends later by the client's ReadTimeout,
// holding a pool connection until then. go-redis retries (MaxRetries, and
// MaxRedirects on a cluster) happen within the bound. New adds no hook to
// the client.
func WithTimeout(d time.Duration) Option { return Option{func(c *config) { c.timeout = d }} }

// DefaultWaitTimeout bounds each call to Redis made by Wait and WaitN.
const DefaultWaitTimeout = 2 * time.Second

// WithWaitTimeout bounds each call to Redis made by Wait and WaitN (the
// reservation, a poll, the release of a cancelled reservation). It is
// longer than the decision timeout because a throttled caller has chosen
// to wait, and a burst of thousands of Waits from every replica queues in
// one Redis: with a 100ms bound such a burst would time out, and the
// failure mode would answer instead of the quota. The caller's context
// still applies when it ends earlier. Zero means no bound beyond the
// caller's context. Default DefaultWaitTimeout.
func WithWaitTimeout(d time.Duration) Option { return Option{func(c *config) { c.waitTime = d }} }

// FailureMode chooses what a Limiter answers when Redis fails or times out.
// Its answer is a decision: Allow returns it with a nil error, and the
// Redis failure in Result.BackendErr (and to the observer).
type FailureMode uint8

const (
	// FailOpen allows the request. It is the default: a rate limiter should
	// not take the service down with Redis.
	FailOpen FailureMode = iota
	// FailClosed denies the request. The HTTP middleware answers 503.
	FailClosed
	// FailLocal decides with an in-memory limiter in this process, with
	// each limit's Count scaled by the share given to WithLocalShare: with
	// N replicas, a share of 1/N keeps the total near the limit.
	//
	// The switch is not seamless. The local store starts empty when Redis
	// fails and knows nothing of what Redis admitted, and Redis, once back,
	// knows nothing of what the local stores admitted: in a window that
	// spans either switch, a key may be admitted up to its Count (by
	// Redis) plus the replicas' local shares, about twice the limit with a
	// share of 1/N. Measured with 3 replicas, a share of 1/3 and 50 per
	// second, Redis killed under load: at most 98 admitted in one second
	// with WithDenyCache(0) (50 from Redis, 3 × 16 from the local stores),
	// 56 to 62 with the default deny cache, whose denials stand until
	// their RetryAfter and so hold off the local store for keys that were
	// denied. From one window after the switch, the total is back near
	// the limit. Where twice the limit for one window is too much, use
	// FailClosed, or a smaller share.
	FailLocal
)

// String returns "fail-open", "fail-closed" or "fail-local".
func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	case FailLocal:
		return "fail-local"
	}
	return fmt.Sprintf("failure-mode(%d)", uint8(m))
}

// WithFailureMode sets what the Limiter answers when Redis fails: returns
// an error, does not answer within the timeout, or is skipped by the
// circuit breaker. The breaker opens after 3 failures in a row and then
// sends one probe to Redis every 250ms, so the Limiter goes back to Redis
// by itself once it answers. Default FailOpen. FailLocal needs
// WithLocalShare.
func WithFailureMode(m FailureMode) Option { return Option{func(c *config) { c.mode = m }} }

// WithLocalShare sets the share of each limit's Count that this instance
// admits on its own under FailLocal, in (0, 1]: 1/N for N replicas.
// The scaled Count is never below 1. At the switch to the local store and
// back, a window may admit Redis's Count and the local shares together
// (see FailLocal). New validates it only under FailLocal; NewMemory
// ignores it.
func WithLocalShare(share float64) Option { return Option{func(c *config) { c.share = share }} }

// WithDenyCache sets how many denials the Limiter remembers, answering
// repeat requests without a round trip until their RetryAfter has passed.
// A denial is final until then, so the cache never changes a decision: it
// is kept per key, limits and cost, and a request with a smaller cost or
// other limits goes to Redis. Reset forgets the key's denials in this
// Limiter (not in other replicas). When full, the cache evicts, preferring
// expired denials. Zero turns the cache off. Default DefaultDenyCacheSize.
// NewMemory has no deny cache: it has no round trip to save.
//
// Its memory is bounded in bytes, whatever the clients send: a key longer
// than 128 bytes is kept as a 23-byte digest, and a Limit's name is at
// most MaxLimitName bytes. A denial under one limit takes at most about
// 430 bytes (4.3 MB at the default size), and under MaxLimits limits with
// names of MaxLimitName bytes about 2.3 KB: the cache holds at most about
// size × 2.5 KB (25 MB at the default size).
func WithDenyCache(size int) Option { return Option{func(c *config) { c.cacheSize = size }} }

// WithObserver sets a function that receives an Event for every decision:
// its outcome, latency, binding limit, deny-cache hits, backend errors and
// the failure mode that answered them. It is called synchronously: keep it
// fast. The prometheus module of this repository turns events into
// metrics.
func WithObserver(o Observer) Option { return Option{func(c *config) { c.observer = o }} }

func (c *config) validate() error {
	switch {
	case c.mode > FailLocal:
		return fmt.Errorf("ratewindow: unknown %s", c.mode)
	case c.mode == FailLocal && !(c.share > 0 && c.share <= 1):
		return fmt.Errorf("ratewindow: fail-local needs WithLocalShare in (0, 1], got %v", c.share)
	case c.timeout < 0:
		return fmt.Errorf("ratewindow: negative timeout %s", c.timeout)
	case c.waitTime < 0:
		return fmt.Errorf("ratewindow: negative wait timeout %s", c.waitTime)
	case c.cacheSize < 0:
		return fmt.Errorf("ratewindow: negative deny cache size %d", c.cacheSize)
	}
	return nil
}
