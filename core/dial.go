package core

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// dialErrors keeps the last failed dial of a go-redis client, so that a
// call that ends at its deadline while the client keeps failing to connect
// says why (a refused connection, a wrong host) instead of only "context
// deadline exceeded". It is a go-redis hook that only watches: it changes
// no dial, command or pipeline.
type dialErrors struct {
	last atomic.Pointer[dialError] // nil after a successful dial
}

type dialError struct {
	err error
	at  time.Time
}

// dialErrorAge is how long a failed dial explains later timeouts.
const dialErrorAge = 10 * time.Second

// watchDials adds a dialErrors hook to rdb when it takes hooks (Client,
// ClusterClient, Ring; a failover client is a Client), else returns nil.
func watchDials(rdb redis.Scripter) *dialErrors {
	h, ok := rdb.(interface{ AddHook(redis.Hook) })
	if !ok {
		return nil
	}
	d := &dialErrors{}
	h.AddHook(d)
	return d
}

func (d *dialErrors) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		switch {
		case err == nil:
			d.last.Store(nil)
		case ctx.Err() == nil: // the dial's own failure, not its caller's deadline
			d.last.Store(&dialError{err, time.Now()})
		}
		return conn, err
	}
}

func (d *dialErrors) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d *dialErrors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// explain returns err with the last recent failed dial, if any.
func (d *dialErrors) explain(err error) error {
	if d == nil {
		return err
	}
	last := d.last.Load()
	if last == nil || time.Since(last.at) > dialErrorAge {
		return err
	}
	return fmt.Errorf("%w (the last dial failed %s ago: %w)", err, time.Since(last.at).Round(time.Millisecond), last.err)
}
