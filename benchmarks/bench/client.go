package bench

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Client is how every contender's go-redis client is built (rueidis builds
// its own).
type Client string

const (
	// PoolClient sizes the pool for the run: as many connections as the
	// most goroutines of the grid, in every setting, as one client shared
	// by a whole service would be; ContextTimeoutEnabled with -ctxtimeout.
	// The empty Client is PoolClient.
	PoolClient Client = "pool"
	// DefaultClient is the client as users write it first: an address and
	// nothing else (redis.NewClient(&redis.Options{Addr: addr})), so
	// go-redis's default pool (10 connections a CPU) and no
	// ContextTimeoutEnabled.
	DefaultClient Client = "default"
)

// ErrDefaultClientTimeout is the refusal of DefaultClient with
// ContextTimeoutEnabled: the default client sets nothing but the address.
var ErrDefaultClientTimeout = errors.New("bench: the default client sets only the address: it takes no ContextTimeoutEnabled (-ctxtimeout)")

// ParseClient reads the -client flag: "pool" or "default".
func ParseClient(s string) (Client, error) {
	switch c := Client(s); c {
	case PoolClient, DefaultClient:
		return c, nil
	}
	return "", fmt.Errorf("bench: client %q: want %q or %q", s, PoolClient, DefaultClient)
}

// check refuses a client that cannot be built as asked.
func (c Client) check(ctxTimeout bool) error {
	switch c {
	case "", PoolClient:
		return nil
	case DefaultClient:
		if ctxTimeout {
			return ErrDefaultClientTimeout
		}
		return nil
	}
	return fmt.Errorf("bench: client %q: want %q or %q", string(c), PoolClient, DefaultClient)
}

// options are the options of a client of addr built as c says (pool and
// ctxTimeout are PoolClient's). DefaultClient's are the zero value but the
// address: redis.NewClient(&redis.Options{Addr: addr}) exactly.
func (c Client) options(addr string, pool int, ctxTimeout bool) *redis.Options {
	if c == DefaultClient {
		return &redis.Options{Addr: addr}
	}
	return &redis.Options{Addr: addr, PoolSize: pool, ContextTimeoutEnabled: ctxTimeout}
}

// clusterOptions are options's for a Cluster of addrs.
func (c Client) clusterOptions(addrs []string, pool int, ctxTimeout bool) *redis.ClusterOptions {
	if c == DefaultClient {
		return &redis.ClusterOptions{Addrs: addrs}
	}
	return &redis.ClusterOptions{Addrs: addrs, PoolSize: pool, ContextTimeoutEnabled: ctxTimeout}
}

// Build is another build of rwbench, made against another version of
// ratewindow (a replace in a copy of go.mod, -modfile), whose ratewindow
// contenders run beside this build's in the same rounds (-with).
type Build struct {
	// Label names the build in the tables: "ratewindow sliding-log @Label".
	Label string
	// Binary is the build's rwbench program; it measures its slices
	// (-slice-child) as this one does.
	Binary string
}

// ParseBuild reads -with LABEL=BINARY: the binary must be an executable
// file.
func ParseBuild(s string) (Build, error) {
	label, bin, ok := strings.Cut(s, "=")
	label, bin = strings.TrimSpace(label), strings.TrimSpace(bin)
	if !ok || label == "" || bin == "" {
		return Build{}, fmt.Errorf("bench: build %q: want LABEL=BINARY", s)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		return Build{}, fmt.Errorf("bench: build %s: %w", label, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return Build{}, fmt.Errorf("bench: build %s: %s is not an executable file", label, bin)
	}
	return Build{Label: label, Binary: bin}, nil
}

// contenders returns a contender for each of ours (the ratewindow
// contenders among cs) measured by b's binary.
func (b Build) contenders(cs []Contender) []Contender {
	var out []Contender
	for _, c := range cs {
		if c.Peer || !strings.HasPrefix(c.Name, "ratewindow ") || c.Binary != "" {
			continue
		}
		out = append(out, Contender{Name: c.Name + " @" + b.Label, Method: c.Method + ", the build " + b.Label,
			NoCluster: c.NoCluster, Binary: b.Binary, Runs: c.Name})
	}
	return out
}
