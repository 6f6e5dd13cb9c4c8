package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

//go:embed lua/check.lua
var checkLua string

// checkKey is check.lua's key, with tag as its hash tag.
func checkKey(prefix, tag string) string { return prefix + "{" + tag + "}:check" }

// Check runs core.Limiter.Check: it loads the scripts, then asks every node
// of s's client to answer, run a script, take a write and not evict. The
// load comes first because it takes memory: a Redis whose used memory the
// load lifts to maxmemory refuses the check's write, as it would refuse
// the first decision. A node's own error (unreachable, ACL, eviction) is
// reported before the load's, which it usually explains. A PING on every
// node goes before the load: Redis closes a connection that has not
// authenticated when it sends a bulk as large as the library, and the
// next command on that connection would then report EOF where the PING
// reports NOAUTH.
func (s *Store) Check(ctx context.Context) error {
	if err := s.pingNodes(ctx); err != nil {
		return err
	}
	lerr := s.loadScripts(ctx)
	err := s.checkNodes(ctx)
	if err != nil && !errors.Is(err, store.ErrCheckIncomplete) {
		return err
	}
	if lerr != nil {
		return lerr
	}
	return err
}

// loadScripts loads the function library (FUNCTION LOAD on every master),
// or where it cannot, the scripts for EVALSHA (SCRIPT LOAD).
func (s *Store) loadScripts(ctx context.Context) error {
	if lib := s.t.lib; lib != nil && lib.state.Load() != libraryUnusable {
		err := lib.load(ctx)
		switch {
		case err == nil:
			lib.state.Store(libraryLoaded)
			return nil
		case !cannotLoad(err):
			return fmt.Errorf("ratewindow: check: loading the scripts (FUNCTION LOAD): %w", explainRefusal(err))
		}
		lib.state.Store(libraryUnusable)
	}
	for _, sc := range s.scripts {
		if err := sc.Load(ctx, s.t.rdb).Err(); err != nil {
			return fmt.Errorf("ratewindow: check: loading the scripts (SCRIPT LOAD): %w", explainRefusal(err))
		}
	}
	return nil
}

// pingNodes PINGs every node of s's client that Check asks, and reports
// the first refusal as checkNode does.
func (s *Store) pingNodes(ctx context.Context) error {
	ping := func(ctx context.Context, c *redis.Client) error {
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("ratewindow: check: redis at %s: %w", serverAddr(ctx, c), explainRefusal(err))
		}
		return nil
	}
	switch c := s.t.rdb.(type) {
	case *redis.Client:
		return ping(ctx, c)
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, ping)
	case *redis.Ring:
		return c.ForEachShard(ctx, ping)
	}
	return nil
}

func (s *Store) checkNodes(ctx context.Context) error {
	sc := redis.NewScript(checkLua)
	switch c := s.t.rdb.(type) {
	case *redis.Client: // also NewFailoverClient
		return checkNode(ctx, c, sc, checkKey(s.prefix, "check"))
	case *redis.ClusterClient:
		// each master checks the first check key of a slot it owns (the
		// client knows the slots: no round trip a key)
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			addr := m.Options().Addr
			for i := 0; i < 1<<16; i++ {
				key := checkKey(s.prefix, "check-"+strconv.Itoa(i))
				owner, err := c.MasterForKey(ctx, key)
				if err != nil {
					return fmt.Errorf("ratewindow: check: %w", err)
				}
				if owner.Options().Addr == addr {
					return checkNode(ctx, m, sc, key)
				}
			}
			return fmt.Errorf("ratewindow: check: no key found for master %s", addr)
		})
		if err != nil && !strings.HasPrefix(err.Error(), "ratewindow:") {
			err = fmt.Errorf("ratewindow: check: %w", err) // the Cluster's own
		}
		return err
	case *redis.Ring: // each shard, as each master of a Cluster
		return c.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return checkNode(ctx, c, sc, checkKey(s.prefix, "check"))
		})
	}
	if err := checkScript(ctx, s.t.rdb, sc, checkKey(s.prefix, "check")); err != nil {
		return err
	}
	return fmt.Errorf("%w: a %T cannot be asked for its eviction policy", store.ErrCheckIncomplete, s.t.rdb)
}

func checkNode(ctx context.Context, c *redis.Client, sc *redis.Script, key string) error {
	addr := serverAddr(ctx, c)
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ratewindow: check: redis at %s: %w", addr, explainRefusal(err))
	}
	if err := checkScript(ctx, c, sc, key); err != nil {
		return fmt.Errorf("%w (redis at %s)", err, addr)
	}
	return checkEviction(ctx, c, addr)
}

// serverAddr returns the address of c's server: its Options' Addr, or for
// a failover client (whose Addr is "FailoverClient") the master's, as
// CLIENT INFO's laddr names it, else "the Sentinel's master".
func serverAddr(ctx context.Context, c *redis.Client) string {
	if addr := c.Options().Addr; addr != "FailoverClient" {
		return addr
	}
	if info, err := c.ClientInfo(ctx).Result(); err == nil && info.LAddr != "" {
		return info.LAddr
	}
	return "the Sentinel's master"
}

// checkScript runs check.lua with EVAL, then EVALSHA: a Limiter uses both.
func checkScript(ctx context.Context, c redis.Scripter, sc *redis.Script, key string) error {
	if err := sc.Eval(ctx, c, []string{key}).Err(); err != nil {
		return fmt.Errorf("ratewindow: check: EVAL on %s: %w", key, explainRefusal(err))
	}
	if err := sc.EvalSha(ctx, c, []string{key}).Err(); err != nil {
		return fmt.Errorf("ratewindow: check: EVALSHA on %s: %w", key, explainRefusal(err))
	}
	return nil
}

// checkEviction fails when the server at addr would evict keys, as CONFIG GET
// says, or INFO memory where CONFIG is forbidden or renamed (managed Redis).
func checkEviction(ctx context.Context, c *redis.Client, addr string) error {
	maxmemory, policy, cfgErr := configEviction(ctx, c)
	if cfgErr != nil {
		var infoErr error
		maxmemory, policy, infoErr = infoEviction(ctx, c)
		if infoErr != nil {
			return fmt.Errorf("%w: redis at %s: CONFIG GET: %w; INFO memory: %w", store.ErrCheckIncomplete, addr, cfgErr, infoErr)
		}
	}
	if maxmemory != "0" && policy != "noeviction" {
		return fmt.Errorf("%w: redis at %s has maxmemory %s with maxmemory-policy %s, which evicts the Limiter's keys (they all have a TTL): set maxmemory-policy noeviction, or maxmemory 0", store.ErrEvictionPolicy, addr, maxmemory, policy)
	}
	return nil
}

func configEviction(ctx context.Context, c *redis.Client) (maxmemory, policy string, err error) {
	v, err := c.ConfigGet(ctx, "maxmemory").Result()
	if err != nil {
		return "", "", err
	}
	p, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return "", "", err
	}
	maxmemory, ok1 := v["maxmemory"]
	policy, ok2 := p["maxmemory-policy"]
	if !ok1 || !ok2 {
		return "", "", errors.New("no maxmemory or maxmemory-policy in the reply")
	}
	return maxmemory, policy, nil
}

func infoEviction(ctx context.Context, c *redis.Client) (maxmemory, policy string, err error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return "", "", err
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "maxmemory":
			maxmemory = v
		case "maxmemory_policy":
			policy = v
		}
	}
	if maxmemory == "" || policy == "" {
		return "", "", errors.New("no maxmemory or maxmemory_policy in the reply")
	}
	return maxmemory, policy, nil
}
