package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// Ping writes PING to the server serving key, on a connection of its own,
// and reports whether any byte came back within silence of the write (see
// store.Remote). The answer does not depend on when this process runs: a
// wait cut at its deadline looks into the socket, and a reply that arrived
// while the process was not reading counts as a reply.
func (s *Store) Ping(ctx context.Context, key string, silence time.Duration) error {
	var buf [256]byte
	opt, err := s.t.nodeOptions(string(appendTag(buf[:0], s.prefix, key)))
	if err != nil || opt == nil {
		return err // nil: no way to ask, so no evidence
	}
	// A dial out of time is no evidence: a process short of CPU may not
	// have run the dial at all (a Sentinel that does not answer is none
	// either: the decisions are shed, not answered by the failure mode).
	conn, err := dial(ctx, opt, silence)
	if err != nil {
		return &store.Error{Err: fmt.Errorf("health check: %w", err)}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return &store.Error{Err: fmt.Errorf("health check: %w", err)}
	}
	if !stop() {
		return ctx.Err()
	}
	if err := conn.SetReadDeadline(time.Now().Add(silence)); err != nil {
		return &store.Error{Err: err}
	}
	var b [1]byte
	_, err = conn.Read(b[:])
	switch {
	case err == nil:
		return nil
	case !store.IsTimeout(err):
		return &store.Error{Err: fmt.Errorf("health check: %w", err)}
	}
	// The wait ended at its deadline; a reply may wait in the socket all
	// the same, for a process that ran late.
	if t, ok := conn.(*tls.Conn); ok {
		conn = t.NetConn()
	}
	_ = conn.SetReadDeadline(time.Time{})
	arrived, err := pending(conn)
	switch {
	case errors.Is(err, errNoPeek):
		return err // a timeout: no evidence either way
	case err != nil:
		return &store.Error{Err: fmt.Errorf("health check: %w", err)}
	case arrived:
		return nil
	}
	return fmt.Errorf("%w (no reply to PING in %s)", store.ErrSilent, silence)
}

// dial connects to opt's server as the client does, within ctx and
// silence: a dialer that queries Sentinels first, or waits out its own
// DialTimeout, is left behind (its connection closed when it comes).
func dial(ctx context.Context, opt *redis.Options, silence time.Duration) (net.Conn, error) {
	d := opt.Dialer
	if d == nil {
		d = redis.NewDialer(opt)
	}
	ctx, cancel := context.WithTimeout(ctx, silence)
	defer cancel()
	type dialed struct {
		conn net.Conn
		err  error
	}
	done := make(chan dialed, 1)
	go func() {
		conn, err := d(ctx, opt.Network, opt.Addr)
		done <- dialed{conn, err}
	}()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// errNoPeek: the connection cannot tell whether bytes wait in it; a timeout,
// so that it is no evidence.
var errNoPeek = fmt.Errorf("health check: %w", context.DeadlineExceeded)

// nodeOptions returns the options of the client of the node serving tag;
// nil when rdb is no client whose nodes are known.
func (t *transport) nodeOptions(tag string) (*redis.Options, error) {
	switch c := t.rdb.(type) {
	case *redis.Client:
		return c.Options(), nil
	case *redis.ClusterClient:
		m, err := c.MasterForKey(t.cancelled, tag)
		if err == nil {
			return m.Options(), nil
		}
		// the slots are not known yet: ask the first address the client has
		co := c.Options()
		if len(co.Addrs) == 0 {
			return nil, nil
		}
		return &redis.Options{Network: "tcp", Addr: co.Addrs[0], Dialer: co.Dialer, TLSConfig: co.TLSConfig, DialTimeout: co.DialTimeout}, nil
	case *redis.Ring:
		shard, err := c.GetShardClientForKey(tag)
		if err != nil {
			return nil, &store.Error{Err: err}
		}
		return shard.Options(), nil
	}
	return nil, nil
}
