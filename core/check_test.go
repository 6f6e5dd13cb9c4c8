package core

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestCheck runs Limiter.Check against real servers configured to pass and
// to fail it, each on a dedicated redis-server.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// acl creates user name with password "pw" and the given rules, and
	// returns a client logged in as that user
	acl := func(t *testing.T, p *redistest.Process, name string, rules ...string) *redis.Client {
		t.Helper()
		args := []any{"ACL", "SETUSER", name, "on", ">pw"}
		for _, r := range rules {
			args = append(args, r)
		}
		if err := p.Client(t).Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: p.Addr, Username: name, Password: "pw", MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	set := func(t *testing.T, p *redistest.Process, kv ...string) {
		t.Helper()
		for i := 0; i < len(kv); i += 2 {
			if err := p.Client(t).ConfigSet(ctx, kv[i], kv[i+1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name string
		// client returns the client to check, after setting the server up
		client func(t *testing.T, p *redistest.Process) *redis.Client
		want   error  // nil, or a sentinel the error matches
		says   string // a part of the error's text
	}{
		{"no maxmemory", func(t *testing.T, p *redistest.Process) *redis.Client { return p.Client(t) }, nil, ""},
		{"maxmemory with noeviction", func(t *testing.T, p *redistest.Process) *redis.Client {
			set(t, p, "maxmemory", "100mb", "maxmemory-policy", "noeviction")
			return p.Client(t)
		}, nil, ""},
		{"allkeys-lru", func(t *testing.T, p *redistest.Process) *redis.Client {
			set(t, p, "maxmemory", "100mb", "maxmemory-policy", "allkeys-lru")
			return p.Client(t)
		}, ErrEvictionPolicy, "maxmemory-policy allkeys-lru"},
		{"volatile-ttl", func(t *testing.T, p *redistest.Process) *redis.Client {
			set(t, p, "maxmemory", "100mb", "maxmemory-policy", "volatile-ttl")
			return p.Client(t)
		}, ErrEvictionPolicy, "maxmemory-policy volatile-ttl"},
		{"volatile-lru", func(t *testing.T, p *redistest.Process) *redis.Client {
			set(t, p, "maxmemory", "100mb", "maxmemory-policy", "volatile-lru")
			return p.Client(t)
		}, ErrEvictionPolicy, "maxmemory-policy volatile-lru"},
		{"a policy without maxmemory", func(t *testing.T, p *redistest.Process) *redis.Client {
			set(t, p, "maxmemory-policy", "allkeys-lru")
			return p.Client(t)
		}, nil, ""},
		{"wrong password", func(t *testing.T, p *redistest.Process) *redis.Client {
			acl(t, p, "limiter", "~*", "+@all")
			c := redis.NewClient(&redis.Options{Addr: p.Addr, Username: "limiter", Password: "wrong", MaxRetries: -1})
			t.Cleanup(func() { c.Close() })
			return c
		}, nil, "WRONGPASS"},
		{"no CONFIG and no INFO", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~rw:*", "+@all", "-config", "-info")
		}, ErrCheckIncomplete, "NOPERM"},
		{"INFO where CONFIG is forbidden", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~rw:*", "+@all", "-config")
		}, nil, ""},
		{"INFO where CONFIG is forbidden, evicting", func(t *testing.T, p *redistest.Process) *redis.Client {
			set(t, p, "maxmemory", "100mb", "maxmemory-policy", "allkeys-lfu")
			return acl(t, p, "limiter", "~rw:*", "+@all", "-config")
		}, ErrEvictionPolicy, "maxmemory-policy allkeys-lfu"},
		{"no EVAL", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~rw:*", "+@all", "-eval")
		}, nil, "EVAL on rw:{check}:check: NOPERM"},
		{"no EVALSHA", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~rw:*", "+@all", "-evalsha")
		}, nil, "EVALSHA on rw:{check}:check: NOPERM"},
		{"no access to the prefix", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~other:*", "+@all")
		}, nil, "EVAL on rw:{check}:check: this user's ACL does not give it the Limiter's keys: allow reading and writing ~<prefix>* (~rw:* with the default prefix; the ACL line in docs/redis.md): NOPERM"},
		{"read-only user", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~rw:*", "+@all", "-@write")
		}, nil, "NOPERM ratewindow: this user may not run SET on rw:{check}:check as the scripts do (docs/redis.md)"},
		{"no sorted sets", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~rw:*", "+@all", "-@sortedset")
		}, nil, "this user may not run ZADD on rw:{check}:check"},
		{"no hashes", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "~rw:*", "+@all", "-hincrby")
		}, nil, "this user may not run HINCRBY on rw:{check}:check"},
		{"read-only keys", func(t *testing.T, p *redistest.Process) *redis.Client {
			return acl(t, p, "limiter", "%R~rw:*", "+@all")
		}, nil, "NOPERM"},
		{"used memory above maxmemory, noeviction", func(t *testing.T, p *redistest.Process) *redis.Client {
			fillPastMaxmemory(t, p.Client(t))
			return p.Client(t)
		}, ErrNoWrites, "EVAL on rw:{check}:check: redis refuses writes: its used memory is above maxmemory, and its maxmemory-policy (noeviction, as the Limiter needs) evicts nothing: raise maxmemory or free memory: OOM command not allowed"},
		{"read-only replica", func(t *testing.T, p *redistest.Process) *redis.Client {
			replicate(t, p)
			return p.Client(t)
		}, ErrNoWrites, "redis refuses writes: the server is a read-only replica: connect to the master (a failover or Cluster client follows it): READONLY"},
		{"no password", func(t *testing.T, p *redistest.Process) *redis.Client {
			requirePassword(t, p.Client(t))
			c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
			t.Cleanup(func() { c.Close() })
			return c
		}, nil, "redis requires authentication (NOAUTH): set the client's Password (and Username for an ACL user): NOAUTH"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := redistest.Start(t)
			l, err := New(c.client(t, p))
			if err != nil {
				t.Fatal(err)
			}
			err = l.Check(ctx)
			switch {
			case c.want == nil && c.says == "":
				if err != nil {
					t.Fatalf("Check: %v, want nil", err)
				}
			case err == nil:
				t.Fatalf("Check: nil, want an error saying %q", c.says)
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("Check: %v, want %v", err, c.want)
			case !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), p.Addr):
				t.Fatalf("Check: %q, want it to say %q and name %s", err, c.says, p.Addr)
			}
		})
	}
}

// TestCheckCluster: Check asks every master, and names the one that would
// evict.
func TestCheckCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	cc := cl.Client(t)
	ctx := context.Background()
	l, err := New(cc, WithPrefix(uniquePrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	// one master set to evict (with room to spare: nothing is evicted)
	bad := redis.NewClient(&redis.Options{Addr: cl.Addrs[1]})
	t.Cleanup(func() { bad.Close() })
	prev, err := bad.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bad.ConfigSet(ctx, "maxmemory", prev["maxmemory"])
		bad.ConfigSet(ctx, "maxmemory-policy", prev["maxmemory-policy"])
	})
	if err := bad.ConfigSet(ctx, "maxmemory", "10gb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := bad.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	err = l.Check(ctx)
	if !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), cl.Addrs[1]) {
		t.Fatalf("Check: %v, want ErrEvictionPolicy naming %s", err, cl.Addrs[1])
	}
}

// TestCheckOther: a Redis nobody listens at, miniredis (no CONFIG, no INFO
// memory) and the memory Limiter.
func TestCheckOther(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}) // loopback, a closed port
	t.Cleanup(func() { down.Close() })
	l, _ := New(down)
	if err := l.Check(ctx); !errors.Is(err, syscall.ECONNREFUSED) || !strings.HasPrefix(err.Error(), "ratewindow: check: redis at 127.0.0.1:1: dial tcp") {
		t.Fatalf("unreachable: %v, want the refused dial", err)
	}
	m := redistest.Mini(t)
	mc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { mc.Close() })
	l, _ = New(mc)
	if err := l.Check(ctx); !errors.Is(err, ErrCheckIncomplete) {
		t.Fatalf("miniredis: %v, want ErrCheckIncomplete", err)
	}
	if err := NewMemory().Check(ctx); err != nil {
		t.Fatalf("memory: %v", err)
	}
}

// TestCheckLoadsScripts: Check loads what decisions will load. With used
// memory a little under maxmemory (noeviction), check.lua's small write
// fits but the Limiter's scripts do not: Check fails with ErrNoWrites,
// where it used to pass and the first decision then failed with OOM. With
// room again, Check passes and decisions run. A nil context is an error,
// never a panic, for Redis and memory Limiters alike.
func TestCheckLoadsScripts(t *testing.T) {
	p := redistest.Start(t)
	rdb := p.Client(t)
	ctx := context.Background()
	l, err := New(rdb, WithPrefix(uniquePrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var usedMemory int64
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			usedMemory, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if usedMemory == 0 {
		t.Fatalf("no used_memory in INFO memory: %q", info)
	}
	// 40 KB of room: a small key fits, the scripts (about 130 KB) do not
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", strconv.FormatInt(usedMemory+40<<10, 10)}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Check(ctx); !errors.Is(err, ErrNoWrites) {
		t.Fatalf("Check near maxmemory: %v, want an error matching ErrNoWrites", err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(ctx); err != nil {
		t.Fatalf("Check with room: %v", err)
	}
	if r, err := l.Allow(ctx, "k", PerMinute(1)); err != nil || r.BackendErr != nil || !r.Allowed {
		t.Fatalf("a decision after Check: %+v %v", r, err)
	}
	for _, lim := range []*Limiter{l, NewMemory()} {
		if err := lim.Check(nil); err == nil || !strings.Contains(err.Error(), "nil context") {
			t.Fatalf("Check(nil): %v, want an error naming the nil context", err)
		}
	}
}

// TestCheckRingEveryShard: Check runs its script on every shard of a
// Ring: a read-only shard fails it with ErrNoWrites, naming that shard,
// though the check key (one hash tag) goes to the other.
func TestCheckRingEveryShard(t *testing.T) {
	rw := redistest.Start(t)
	host, port, _ := net.SplitHostPort(rw.Addr)
	ro := redistest.Start(t, "--replicaof", host, port) // refuses writes
	ctx := context.Background()
	for _, names := range [][2]string{{"a", "b"}, {"b", "a"}} { // one puts the check key on rw
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{names[0]: rw.Addr, names[1]: ro.Addr}})
		t.Cleanup(func() { ring.Close() })
		sh, err := ring.GetShardClientForKey(DefaultPrefix + "{check}:check") // check.go's checkKey
		if err != nil {
			t.Fatal(err)
		}
		if sh.Options().Addr != rw.Addr {
			continue
		}
		l, err := New(ring)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(ctx); !errors.Is(err, ErrNoWrites) || !strings.Contains(err.Error(), ro.Addr) {
			t.Fatalf("Check %v, want ErrNoWrites naming the read-only shard %s", err, ro.Addr)
		}
		return
	}
	t.Fatal("neither naming puts the check key on the writable shard")
}

// TestCheckNamesSentinelMaster: through a failover client (whose Options
// name no server), Check's error names the master it checked.
func TestCheckNamesSentinelMaster(t *testing.T) {
	t.Parallel()
	s := redistest.NewSentinel(t)
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if err := s.Master.Client(t).ConfigSet(context.Background(), kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	l, err := New(s.Client(t), WithPrefix(uniquePrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(context.Background()); !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), "redis at "+s.Master.Addr+" ") {
		t.Fatalf("Check: %v, want ErrEvictionPolicy naming the master %s", err, s.Master.Addr)
	}
}

// TestCheckThenDecide sweeps maxmemory margins across the size of the
// scripts on a fresh redis-server (noeviction): at every margin where Check
// returns nil, the first decision after it runs (no OOM). Loading the
// scripts takes memory, so Check's write must come after the load: it
// used to come before, and at a margin just over the load's size Check
// passed and the first decision failed with OOM. The sweep crosses the
// boundary: some margins fail Check, some pass it.
func TestCheckThenDecide(t *testing.T) {
	p := redistest.Start(t)
	rdb := p.Client(t)
	ctx := context.Background()
	usedMemory := func() int64 {
		t.Helper()
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatalf("no used_memory in INFO memory: %q", info)
		return 0
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	var passed, failed int
	for margin := int64(0); margin <= 240<<10; margin += 4 << 10 {
		// a server without the scripts, as a new deployment finds it
		for _, cmd := range [][]any{{"CONFIG", "SET", "maxmemory", "0"}, {"FUNCTION", "FLUSH"}, {"SCRIPT", "FLUSH"}, {"FLUSHALL"}} {
			if err := rdb.Do(ctx, cmd...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(usedMemory()+margin, 10)).Err(); err != nil {
			t.Fatal(err)
		}
		// patient: a decision out of time on a loaded machine would go
		// again after the health check's own connection took memory
		l, err := New(rdb, WithPrefix(uniquePrefix(t)), WithTimeout(patient))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(ctx); err != nil {
			if !errors.Is(err, ErrNoWrites) {
				t.Fatalf("margin %d KB: Check: %v, want nil or an error matching ErrNoWrites", margin>>10, err)
			}
			failed++
			continue
		}
		passed++
		if r, err := l.Allow(ctx, "k", PerMinute(1)); err != nil || r.BackendErr != nil || !r.Allowed {
			t.Fatalf("margin %d KB (used_memory %d): Check passed, then the first decision: %+v %v", margin>>10, usedMemory(), r, err)
		}
	}
	if passed == 0 || failed == 0 {
		t.Fatalf("Check passed at %d margins and failed at %d: the sweep does not cross the scripts' size", passed, failed)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
}
