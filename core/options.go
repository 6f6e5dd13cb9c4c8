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

// configure returns the defaults with opts applied.
func configure(opts []Option) config {
	c := config{prefix: DefaultPrefix, timeout: DefaultTimeout, waitTime: DefaultWaitTimeout, cacheSize: DefaultDenyCacheSize}
	for _, o := range opts {
		if o.apply != nil {
			o.apply(&c)
		}
	}
	return c
}

const (
	// DefaultPrefix starts every storage key: "rw:{<key>}:v2:r1m".
	DefaultPrefix = "rw:"
	// DefaultTimeout bounds each call to Redis.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultDenyCacheSize is the number of denials a Limiter remembers.
	DefaultDenyCacheSize = 10000
	// DefaultWaitTimeout bounds each call to Redis made by Wait and WaitN.
	DefaultWaitTimeout = 2 * time.Second
)

// WithPrefix sets the prefix of every storage key. Default DefaultPrefix.
func WithPrefix(prefix string) Option { return Option{func(c *config) { c.prefix = prefix }} }

// WithClock makes the Limiter read the time from now instead of Redis's
// TIME (or the process clock for NewMemory): for tests, such as with
// miniredis.SetTime. In production every replica must use the server's.
func WithClock(now func() time.Time) Option { return Option{func(c *config) { c.clock = now }} }

// WithTimeout sets a decision's budget, from when it is asked to its
// answer, or the caller's context's deadline when sooner (then the caller
// gets ctx's error and no decision). Waiting for another caller's probe of
// a cached denial, the call to Redis and a retry all spend this one
// budget, whatever the client's options: a decision takes at most the
// timeout plus this process's scheduling delay. Zero means no bound beyond
// ctx. Default DefaultTimeout.
//
// When the budget runs out without Redis's answer, a cached denial of the
// key, even an expired one, answers. Else, if Redis answered this client's
// other calls meanwhile or this process was short of CPU (a goroutine
// waited half the budget to run), the decision is shed: denied as
// FailClosed denies, whatever the failure mode (the HTTP middleware
// answers 503 with Retry-After), with a Result.BackendErr matching ErrShed;
// the circuit breaker does not count it, and Redis may have. Otherwise the
// failure mode answers and the timeout counts towards the breaker (on a
// Cluster, the key's master's).
//
// A call that failed without any reply (a broken connection) goes again
// once while budget is left, but not under FailLocal. An error Redis
// answered (a script error, NOPERM, OOM, TRYAGAIN, WRONGTYPE) is that
// decision's failure, answered by the failure mode at once; it never opens
// the breaker for other keys.
//
// A *redis.Client without ContextTimeoutEnabled (the go-redis default)
// sends decisions through a clone of itself with it enabled, which shares
// its connections but runs none of its hooks: for hooks that see every
// call, set ContextTimeoutEnabled.
func WithTimeout(d time.Duration) Option { return Option{func(c *config) { c.timeout = d }} }

// WithWaitTimeout bounds each call to Redis made by Wait and WaitN (the
// reservation, a poll, the release of a cancelled reservation), or the
// caller's context when it ends earlier. It is longer than WithTimeout's:
// a burst of Waits from every replica queues in one Redis. Zero means no
// bound beyond the caller's context. Default DefaultWaitTimeout.
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
	// each limit's Count scaled by WithLocalShare's share: 1/N for N
	// replicas keeps the total near the limit. The local store and Redis
	// know nothing of each other's counts, so a window that spans a switch
	// may admit up to about twice the limit; after one window the total is
	// back near it. Where that is too much, use FailClosed or a smaller
	// share.
	FailLocal
)

// String returns "fail-open", "fail-closed" or "fail-local".
func (m FailureMode) String() string { return enumName(m, failureModes[:], "failure-mode") }

var failureModes = [...]string{"fail-open", "fail-closed", "fail-local"}

// WithFailureMode sets what the Limiter answers when Redis fails: returns
// an error, does not answer within the timeout, or is skipped by the
// circuit breaker. The breaker (one per Cluster master) opens after 3
// failures in a row, a burst of concurrent timeouts counting as one, and
// then probes Redis every 250ms, so the Limiter goes back to Redis by
// itself. Default FailOpen. FailLocal needs WithLocalShare.
func WithFailureMode(m FailureMode) Option { return Option{func(c *config) { c.mode = m }} }

// WithLocalShare sets the share of each limit's Count, in (0, 1], that this
// instance admits on its own under FailLocal: 1/N for N replicas. The
// scaled Count is never below 1. New validates it only under FailLocal.
func WithLocalShare(share float64) Option { return Option{func(c *config) { c.share = share }} }

// WithDenyCache sets how many denials the Limiter remembers, answering
// repeats of the same key, limits and cost without a round trip until
// their RetryAfter has passed or for one second, whichever is sooner.
// Refund, Reset and a cancelled Wait drop this Limiter's denials of the key
// at once; another replica's change reaches it within that second, when
// the denial is asked of Redis again. When a denial is due, one request of
// the key asks Redis while the others wait for its answer, within their
// own timeout. When full, the cache evicts, preferring expired denials.
// Zero turns it off. Default DefaultDenyCacheSize. NewMemory has none.
//
// Its memory is bounded whatever clients send (long keys are kept as
// digests): about 430 bytes a denial under one limit, 2.5 KB at most
// under MaxLimits limits (4.3 MB and 25 MB at the default size).
func WithDenyCache(size int) Option { return Option{func(c *config) { c.cacheSize = size }} }

// WithObserver sets a function that receives an Event for every decision,
// synchronously: keep it fast. The prometheus module turns them into metrics.
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
