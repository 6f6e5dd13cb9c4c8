package bench

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/httprate"
	httprateredis "github.com/go-chi/httprate-redis"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/ratewindow/ratewindow/core"
)

// Decide makes one decision for key: whether the request is admitted.
// A Decide is used by one goroutine at a time.
type Decide func(ctx context.Context, key string) (bool, error)

// Contender is one rate limiter under test.
type Contender struct {
	// Name identifies the contender in tables and with -baseline.
	Name string
	// Method is a short description: the algorithm and how it talks to Redis.
	Method string
	// Peer marks another library (the default baseline is the fastest peer);
	// false for ratewindow and for the reference script.
	Peer bool
	// Call names the commands of one call to Redis as INFO commandstats
	// does, the first counting the calls, and CallName names them in
	// tables. None: the call is the script commands (FCALL, EVALSHA, EVAL
	// and their _RO forms) the contender sent, and every other command ran
	// inside them.
	Call     []string
	CallName string
	// NoCluster, when set, says why the contender cannot run on a Redis
	// Cluster; it is left out of the Cluster settings.
	NoCluster string
	// New returns a factory of per-goroutine Decide functions for a limit of
	// count units per window, on rdb: a *redis.Client, or a
	// *redis.ClusterClient in the Cluster settings. Nil for a contender of
	// another build (Binary).
	New func(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error)
	// Binary, when set, is another build of rwbench (Build) that measures
	// this contender's slices, as the contender named Runs there.
	Binary, Runs string
}

// Contenders returns every contender: ratewindow's three algorithms, the
// peers, and a plain sliding-log script as the memory reference.
// mennanov/limiters is not among them: its module cannot be fetched from the
// Go module proxy here (403, "This module version is not available").
func Contenders() []Contender {
	return []Contender{
		ratewindow("ratewindow sliding-log", core.SlidingLog),
		ratewindow("ratewindow sliding-buckets", core.SlidingBuckets),
		ratewindow("ratewindow sliding-counter", core.SlidingCounter),
		{Name: "ulule/limiter v3", Method: "fixed window, Lua INCRBY", Peer: true, New: newUlule},
		{Name: "go-redis/redis_rate v10", Method: "GCRA, Lua", Peer: true, New: newRedisRate},
		{Name: "go-chi/httprate-redis", Method: "sliding counter, MGET + MULTI INCR", Peer: true, New: newHTTPRate,
			Call: []string{"exec", "mget", "multi"}, CallName: "MGET + MULTI/EXEC", NoCluster: httprateNoCluster},
		{Name: "plain sliding log", Method: "ZSET + UUID members, one EVALSHA", New: newPlainLog},
		{Name: "plain sliding log, rueidis", Method: "the same script, rueidis auto-pipelining", New: newRueidisLog},
	}
}

// Optional returns the contenders that run only when -only names them:
// ratewindow's sliding log decided through a rule (core.Decider), with
// and without TrackDenied, so that the two differ by that feature alone.
// The limit admits every request: the rows say what tracking costs an
// allowed decision.
func Optional() []Contender {
	return []Contender{ruled("ratewindow sliding-log, rule", false), ruled("ratewindow sliding-log, rule TrackDenied", true)}
}

// ruled returns a contender deciding through a rule's Decider, which
// records its denied keys when track is set.
func ruled(name string, track bool) Contender {
	return Contender{
		Name:   name,
		Method: "sliding log, one FCALL, through a rule",
		New: func(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error) {
			l, err := core.New(rdb)
			if err != nil {
				return nil, err
			}
			d, err := core.NewDecider(l, core.Policy[string]{
				Name:        "bench",
				Limits:      []core.Limit{core.Per(int64(count), window)},
				Key:         func(k string) (string, error) { return k, nil },
				TrackDenied: track,
			})
			if err != nil {
				return nil, err
			}
			return func() Decide {
				return func(ctx context.Context, key string) (bool, error) {
					dec := d.Decide(ctx, key)
					return dec.Verdict == core.Pass, dec.Result.BackendErr
				}
			}, nil
		},
	}
}

// ratewindow returns a contender for one algorithm of ratewindow, built
// with opts (the deny-cache row turns the cache off with them).
func ratewindow(name string, alg core.Algorithm, opts ...core.Option) Contender {
	return Contender{
		Name:   name,
		Method: alg.String() + ", one FCALL",
		New: func(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error) {
			l, err := core.New(rdb, opts...)
			if err != nil {
				return nil, err
			}
			lim := core.Per(int64(count), window).With(alg)
			return func() Decide {
				return func(ctx context.Context, key string) (bool, error) {
					r, err := l.Allow(ctx, key, lim)
					if err == nil && r.BackendErr != nil {
						err = r.BackendErr // the failure mode answered: not a decision of Redis
					}
					return r.Allowed, err
				}
			}, nil
		},
	}
}

func newUlule(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error) {
	store, err := ulredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: "limiter"})
	if err != nil {
		return nil, err
	}
	l := ulule.New(store, ulule.Rate{Period: window, Limit: int64(count)})
	return func() Decide {
		return func(ctx context.Context, key string) (bool, error) {
			c, err := l.Get(ctx, key)
			return err == nil && !c.Reached, err
		}
	}, nil
}

func newRedisRate(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error) {
	l := redis_rate.NewLimiter(rdb)
	lim := redis_rate.Limit{Rate: count, Burst: count, Period: window}
	return func() Decide {
		return func(ctx context.Context, key string) (bool, error) {
			r, err := l.Allow(ctx, key, lim)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}
	}, nil
}

// httprateNoCluster is why httprate-redis runs on one server only.
const httprateNoCluster = "its Config.Client is a *redis.Client (no cluster client), and its MGET reads two windows' keys of different hash slots"

// newHTTPRate drives httprate's handler, the library's only way to decide
// (its decision holds a process-wide mutex across two Redis calls). Each
// goroutine has its own request and response writer; the key is a header.
//
// With a window below a second, httprate still names its counters by the
// second (httprate.LimitCounterKey hashes the window's Unix seconds) and
// go-redis raises its EXPIRE of 3 windows to 1 s: the commands, and so the
// work of a decision, are those of any window.
func newHTTPRate(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error) {
	client, ok := rdb.(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("httprate-redis: %s", httprateNoCluster)
	}
	counter := httprateredis.NewCounter(&httprateredis.Config{
		Client: client, WindowLength: window, PrefixKey: "httprate", FallbackDisabled: true,
	})
	rl := httprate.NewRateLimiter(count, window,
		httprate.WithKeyFuncs(func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil }),
		httprate.WithLimitCounter(counter),
	)
	passed := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h := rl.Handler(passed)
	return func() Decide {
		req, _ := http.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Key", "")
		w := &recorder{h: http.Header{}}
		return func(ctx context.Context, key string) (bool, error) {
			req.Header["X-Key"][0] = key
			w.status = 0
			clear(w.h)
			h.ServeHTTP(w, req)
			switch w.status {
			case http.StatusOK:
				return true, nil
			case http.StatusTooManyRequests:
				return false, nil
			}
			return false, fmt.Errorf("httprate: status %d", w.status)
		}
	}, nil
}

// recorder is a minimal http.ResponseWriter.
type recorder struct {
	h      http.Header
	status int
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return len(b), nil
}
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// plainLogLua is the sliding log as commonly written: a sorted set scored
// by the time in µs, one random UUID member per admitted request.
const plainLogLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
return 1
`

func newPlainLog(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error) {
	script := redis.NewScript(plainLogLua)
	win := strconv.FormatInt(window.Microseconds(), 10)
	lim := strconv.Itoa(count)
	return func() Decide {
		return func(ctx context.Context, key string) (bool, error) {
			n, err := script.Run(ctx, rdb, []string{"slog:" + key}, win, lim, uuid()).Int()
			return n == 1, err
		}
	}, nil
}

// newRueidisLog is the plain sliding log sent through rueidis, whose
// client pipelines concurrent commands on shared connections by itself
// (auto-pipelining): the reference for what batching alone can reach.
//
// On a Redis Cluster, rueidis finds the masters from the addresses given
// (CLUSTER SHARDS) and sends each key's call to its master itself.
func newRueidisLog(rdb redis.UniversalClient, count int, window time.Duration) (func() Decide, error) {
	addrs, err := addrsOf(rdb)
	if err != nil {
		return nil, err
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		return nil, err
	}
	script := rueidis.NewLuaScript(plainLogLua)
	win := strconv.FormatInt(window.Microseconds(), 10)
	lim := strconv.Itoa(count)
	return func() Decide {
		return func(ctx context.Context, key string) (bool, error) {
			n, err := script.Exec(ctx, client, []string{"rlog:" + key}, []string{win, lim, uuid()}).AsInt64()
			return n == 1, err
		}
	}, nil
}

// addrsOf returns the addresses rdb was made with.
func addrsOf(rdb redis.UniversalClient) ([]string, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		return []string{c.Options().Addr}, nil
	case *redis.ClusterClient:
		return c.Options().Addrs, nil
	}
	return nil, fmt.Errorf("bench: a %T: want a *redis.Client or a *redis.ClusterClient", rdb)
}

// uuid returns a random UUID-formatted string (version 4 layout).
func uuid() string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rand.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}
