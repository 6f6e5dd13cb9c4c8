// Package redisenv gives the examples a Redis: the one at REDIS_URL, or,
// when it is unset, an embedded miniredis on a free port of 127.0.0.1, so
// that an example runs on a machine with nothing else installed. It is the
// only helper the examples share; everything else is in each main.go.
package redisenv

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Open returns a client of REDIS_URL (a redis:// or rediss:// URL, see
// redis.ParseURL), or of an embedded miniredis when it is unset, and a
// function that closes both. embedded reports the miniredis. It prints
// which one it is.
func Open() (rdb *redis.Client, embedded bool, close func(), err error) {
	raw := os.Getenv("REDIS_URL")
	if raw == "" {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true) // keys expire on the wall clock, like on a real Redis
		if err := m.Start(); err != nil {
			return nil, false, nil, fmt.Errorf("start embedded redis: %w", err)
		}
		rdb = redis.NewClient(&redis.Options{Addr: m.Addr()})
		fmt.Printf("redis:  embedded miniredis at %s (set REDIS_URL=redis://127.0.0.1:6379/0 to use a real Redis)\n", m.Addr())
		return rdb, true, func() { rdb.Close(); m.Close() }, nil
	}
	if !strings.Contains(raw, "://") {
		return nil, false, nil, fmt.Errorf("REDIS_URL is not a URL: write %s", urlHint(raw))
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, password included
		}
		return nil, false, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb = redis.NewClient(opt)
	fmt.Printf("redis:  %s (REDIS_URL)\n", opt.Addr)
	return rdb, false, func() { rdb.Close() }, nil
}

// urlHint suggests the URL of a REDIS_URL written without a scheme, such
// as 127.0.0.1:6379: redis://127.0.0.1:6379/0. A value that is not a bare
// host:port (it may hold a password) is not repeated.
func urlHint(raw string) string {
	const general = "redis://HOST:PORT/DB, such as redis://127.0.0.1:6379/0 (rediss:// for TLS)"
	host, port, err := net.SplitHostPort(raw)
	if err != nil || strings.ContainsAny(raw, "@/?#") {
		return general
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return "redis://" + net.JoinHostPort(host, port) + "/0 (rediss:// for TLS)"
}

// Addr is where an example listens: ADDR (host:port, or a bare port on
// 127.0.0.1), default 127.0.0.1:8080.
func Addr() string {
	switch a := os.Getenv("ADDR"); {
	case a == "":
		return "127.0.0.1:8080"
	case !strings.Contains(a, ":"):
		return "127.0.0.1:" + a
	default:
		return a
	}
}
