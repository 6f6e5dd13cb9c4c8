package core

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// dialErrors keeps the last failed dial to Redis, so that a call that ends
// at its deadline while the client keeps failing to connect says why (a
// refused connection, a wrong host) instead of only "context deadline
// exceeded", and so does the open circuit. It keeps the last refusal too
// (see explainRefusal: out of memory, a read-only replica, no password),
// which fails every call until someone acts on Redis: the open circuit
// then says which.
//
// It adds nothing to the client: a hook would run on every command of the
// application's too, once per Limiter made on the client. It learns from
// the Limiter's own calls instead: a call that fails to dial and still
// returns before its deadline brings the dial's error, a refusal its
// explanation (see note); a call that fails without a reply of Redis (it
// ends at its deadline, loses its connection) starts a probe, one dial
// made as the client makes them, in the background (see suspect): go-redis
// retries a failed dial, and a call that runs out of time meanwhile
// returns only its context's error.
type dialErrors struct {
	last atomic.Pointer[dialError] // nil: none, or Redis answered since

	// probe dials Redis once as the client does and returns the dial's
	// error; nil: the client cannot be probed
	probe   func(context.Context) error
	probing atomic.Bool  // a probe is under way
	probed  atomic.Int64 // when the last probe started, ns since the epoch
}

type dialError struct {
	err     error
	at      time.Time
	refusal bool // a refusal of Redis, not a failed dial
}

// dialErrorAge is how long a failed dial explains later timeouts.
const dialErrorAge = 10 * time.Second

// probeEvery is how often at most a Limiter probes Redis while its calls
// end without a reply: once a second is nothing beside the calls it
// explains.
const probeEvery = time.Second

// newDialErrors returns the dialErrors of rdb. A Client (a failover client
// too) is probed with a dial by its own Dialer (no command, no hook, no
// retry); a ClusterClient or Ring with a PING.
func newDialErrors(rdb redis.Scripter) *dialErrors {
	d := &dialErrors{}
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		if o.Dialer != nil {
			d.probe = func(ctx context.Context) error {
				conn, err := o.Dialer(ctx, o.Network, o.Addr)
				if err == nil {
					_ = conn.Close()
				}
				return err
			}
		}
	case interface {
		Ping(context.Context) *redis.StatusCmd
	}:
		d.probe = func(ctx context.Context) error {
			if err := c.Ping(ctx).Err(); isDialError(err) {
				return err
			}
			return nil // Redis answered, or failed otherwise than dialing
		}
	}
	return d
}

// note keeps err, the error of a call made with ctx, when it is a failed
// dial that is not ctx's own deadline (a dial cut short by the caller's
// deadline says nothing of Redis), or a refusal of Redis; any other reply
// of Redis, an error reply included, forgets the last one; any other
// error starts a probe (see suspect). A nil d (a batcher made by a test)
// does nothing, as in suspect and explain.
func (d *dialErrors) note(ctx context.Context, err error) {
	if d == nil {
		return
	}
	var op *net.OpError
	switch {
	case err == nil:
		if d.last.Load() != nil {
			d.last.Store(nil)
		}
	case isRedisError(err):
		if r := explainRefusal(err); r != err {
			d.last.Store(&dialError{err: r, at: time.Now(), refusal: true})
		} else if d.last.Load() != nil {
			d.last.Store(nil)
		}
	case errors.As(err, &op) && op.Op == "dial" && !(op.Timeout() && ctx.Err() != nil):
		d.last.Store(&dialError{err: err, at: time.Now()})
	case !errors.Is(err, context.Canceled): // the caller's cancel says nothing of Redis
		// a timeout, a lost connection, a Ring's shards all down
		d.suspect()
	}
}

// suspect is called when a call failed without a reply of Redis (it
// ended at its deadline, lost its connection): unless a recent failure
// explains it already, it starts a probe in
// the background, at most one at a time and one per probeEvery, whose
// failure explains the next calls. A probe is bounded by dialErrorAge.
func (d *dialErrors) suspect() {
	if d == nil || d.probe == nil || d.recent() != nil || d.probing.Load() {
		return
	}
	now := time.Now().UnixNano()
	if now-d.probed.Load() < int64(probeEvery) || !d.probing.CompareAndSwap(false, true) {
		return
	}
	d.probed.Store(now)
	go func() {
		defer d.probing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), dialErrorAge)
		defer cancel()
		if err := d.probe(ctx); err != nil {
			d.last.Store(&dialError{err: err, at: time.Now()})
		}
	}()
}

// recent returns the last failed dial if it is recent enough to explain a
// failure, else nil.
func (d *dialErrors) recent() *dialError {
	last := d.last.Load()
	if last == nil || time.Since(last.at) > dialErrorAge {
		return nil
	}
	return last
}

// isRedisError reports whether err is an error reply of Redis.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// isDialError reports whether err is a failed dial.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// explain returns err with the last recent failed dial or refusal, if
// any.
func (d *dialErrors) explain(err error) error {
	if d == nil {
		return err
	}
	last := d.recent()
	if last == nil {
		return err
	}
	what := "dial"
	if last.refusal {
		what = "call"
	}
	return fmt.Errorf("%w (the last %s failed %s ago: %w)", err, what, time.Since(last.at).Round(time.Millisecond), last.err)
}
