package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// urlHelp says what REDIS_URL may hold; every error about the variable ends with it.
const urlHelp = `REDIS_URL holds the Redis the application uses, as go-redis reads it:
  redis://[user:password@]host:port[/db]                   a single server
  rediss://[user:password@]host:port[/db]                  the same over TLS
  redis://host:port?addr=host2:port2&addr=host3:port3      a Cluster (any one node's address works too)`

// connect opens the Redis that rawURL names and returns once it has answered
// a PING with the URL's credentials. A URL with addr parameters, or the
// address of a node that has cluster mode on, gives a Cluster client. The
// returned error never holds the URL's password.
func connect(ctx context.Context, rawURL string) (redis.UniversalClient, error) {
	if rawURL == "" {
		return nil, fmt.Errorf("REDIS_URL is not set\n%s", urlHelp)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, password included: keep its cause only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("REDIS_URL is not a URL: %w\n%s", err, urlHelp)
	}
	if u.Query().Has("addr") {
		return connectCluster(ctx, rawURL, u.Host)
	}
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w\n%s", err, urlHelp)
	}
	where := "Redis at " + opt.Addr
	c := redis.NewClient(opt)
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		if strings.Contains(err.Error(), "SELECT is not allowed in cluster mode") {
			return nil, fmt.Errorf("REDIS_URL names database %d of %s, a Cluster node: a Cluster has database 0 only", opt.DB, opt.Addr)
		}
		return nil, explain(err, where)
	}
	info, err := c.Info(ctx, "cluster").Result()
	if err != nil {
		_ = c.Close()
		return nil, explain(err, where)
	}
	if !strings.Contains(info, "cluster_enabled:1") {
		return c, nil
	}
	_ = c.Close()
	return connectCluster(ctx, rawURL, opt.Addr)
}

// connectCluster opens the Cluster that rawURL names (addr: its first
// address, for errors) and returns once every master has answered a PING.
func connectCluster(ctx context.Context, rawURL, addr string) (redis.UniversalClient, error) {
	opt, err := redis.ParseClusterURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w\n%s", err, urlHelp)
	}
	c := redis.NewClusterClient(opt)
	// ForEachShard loads the slots (CLUSTER SLOTS), so a wrong password or a
	// node that is not in a Cluster fails here, not at the first command.
	err = c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
		return shard.Ping(ctx).Err()
	})
	if err != nil {
		_ = c.Close()
		return nil, explain(err, "Redis Cluster at "+addr)
	}
	return c, nil
}

// explain turns a failed first command to the server named what ("Redis
// at host:port") into an error that says what to check.
func explain(err error, what string) error {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"),
		strings.HasPrefix(msg, "ERR AUTH"), strings.Contains(msg, "invalid password"),
		strings.HasPrefix(msg, "ERR Client sent AUTH"):
		return fmt.Errorf("%s refused the credentials in REDIS_URL (wrong user or password): %w", what, err)
	case strings.HasPrefix(msg, "NOPERM"):
		return fmt.Errorf("%s: the user in REDIS_URL may not run the commands this tool needs: %w", what, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s did not answer in time (is the address right? TLS needs rediss://): %w", what, err)
	}
	var ne net.Error
	if errors.As(err, &ne) || strings.Contains(msg, "connection refused") || strings.Contains(msg, "tls:") {
		return fmt.Errorf("cannot reach %s (check the address in REDIS_URL; TLS needs rediss://): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
