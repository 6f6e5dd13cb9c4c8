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

// WithTimeout sets how long a decision waits for Redis, from when it is
// asked, or ctx's deadline when sooner (then the caller gets ctx's error
// and no decision). Waiting on another caller's probe and the call to Redis
// spend this budget. It bounds the wait for Redis; it cannot bound a
// process that is not running. Zero means no bound beyond ctx (a health
// check then waits 200ms). Default DefaultTimeout.
//
// What a decision gets (see docs/redis.md):
//   - Redis down (connection refused, reset or closed): the failure mode,
//     at once, and at once for every decision on that node while it is
//     down; a health check in the background brings it back.
//   - Redis silent (paused, stalled, overloaded): the call runs out of
//     time, then a health check sends PING on a connection of its own and
//     waits twice the timeout for a reply. None: the failure mode answers,
//     after about three timeouts for the first decisions, at once after.
//   - This process slow (a flood, a busy machine, a spent CPU quota): its
//     calls may run out of time while Redis answers. The health check looks
//     into its socket at its deadline, so a reply this process had not read
//     yet counts: Redis is up, the failure mode does not answer, and the
//     call goes again, late but exact. After three calls out of time the
//     decision is shed: denied as FailClosed denies, whatever the failure
//     mode, with a Result.BackendErr matching ErrShed (Redis may have
//     counted it).
//
// A cached denial of the key, even expired, answers before the failure
// mode or a shed does. An error Redis answered (a script error, NOPERM,
// OOM, ...) is answered by the failure mode at once, for that call only.
//
// A *redis.Client without ContextTimeoutEnabled (the go-redis default)
// sends decisions through a clone with it enabled and go-redis's retries
// off, which runs none of its hooks: for hooks that see every call, set
// ContextTimeoutEnabled, and MaxRetries -1 so that a READONLY or LOADING
// reply reaches the decision at once (go-redis retries it after a backoff
// that may outlast the timeout; the decision then fails as a timeout).
func WithTimeout(d time.Duration) Option { return Option{func(c *config) { c.timeout = d }} }

// WithWaitTimeout bounds each call to Redis made by Wait and WaitN, or the
// caller's context when it ends earlier: longer than WithTimeout's, as a
// burst of Waits queues in one Redis. Zero means no bound beyond the
// context. Default DefaultWaitTimeout.
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
	// FailLocal decides with an in-memory limiter in this process, each
	// Count scaled by WithLocalShare's share (1/N for N replicas). The two
	// stores know nothing of each other's counts, so a window spanning a
	// switch may admit up to about twice the limit.
	FailLocal
)

// String returns "fail-open", "fail-closed" or "fail-local".
func (m FailureMode) String() string { return enumName(m, failureModes[:], "failure-mode") }

var failureModes = [...]string{"fail-open", "fail-closed", "fail-local"}

// WithFailureMode sets what the Limiter answers when Redis cannot answer:
// on evidence only (see WithTimeout), never for a call that merely ran out
// of time. A node found down (a Cluster's master, a Ring's shard) is
// skipped, its decisions answered at once, and checked again every 250ms.
// Default FailOpen. FailLocal needs WithLocalShare.
func WithFailureMode(m FailureMode) Option { return Option{func(c *config) { c.mode = m }} }

// WithLocalShare sets the share of each limit's Count, in (0, 1], that this
// instance admits on its own under FailLocal: 1/N for N replicas. The
// scaled Count is never below 1. New validates it only under FailLocal.
func WithLocalShare(share float64) Option { return Option{func(c *config) { c.share = share }} }

// WithDenyCache sets how many denials the Limiter remembers, answering
// repeats of the same key, limits and cost without a round trip until their
// RetryAfter has passed or for one second, whichever is sooner. Refund,
// Reset, Block and a cancelled Wait drop this Limiter's denials of the key at once;
// another replica's change arrives within that second. A due denial is asked
// by one request while the others wait, within their timeout; if Redis
// admits it, only as many waiters as it has room for (and one more) ask in
// turn, so a flood on a denied key costs Redis a few calls a second. When full,
// the cache evicts, preferring expired denials. Zero turns it off. Default
// DefaultDenyCacheSize. NewMemory has none. Memory is bounded whatever
// clients send: about 430 bytes a denial, 2.5 KB at most under MaxLimits.
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
