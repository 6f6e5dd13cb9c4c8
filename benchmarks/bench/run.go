package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
)

// Config is what one run measures, and how long it takes.
type Config struct {
	// Goroutines and Keys are the throughput settings, run as a grid on one
	// server.
	Goroutines []int
	Keys       []int
	// ClusterGoroutines and Keys are the settings run again on a Redis
	// Cluster of three masters that the program starts on loopback
	// (StartCluster); none: no Cluster.
	ClusterGoroutines []int
	// Rounds is how often every contender runs in each setting, the rounds
	// interleaved (A B C, then B C A, ...): each time in a process of its
	// own that warms up for Warm, then decides for Slice.
	Rounds      int
	Slice, Warm time.Duration
	// Count per Window is the limit of the throughput runs, the same for
	// every contender: high enough that every request is admitted, so every
	// decision does the full work, and a count a sliding log may hold
	// (core.MaxLogCount), so that a hot key's log stays as short as users'.
	Count  int
	Window time.Duration
	// MemKeys keys get MemRequests requests each (and then one each) for
	// the Redis memory per key; none (0): memory is not measured. At least
	// MinMemKeys.
	MemKeys, MemRequests int
	// Settle is how long the server is left alone before each memory
	// reading: its cron finishes an incremental rehash of the key tables
	// and trims the connections' buffers.
	Settle time.Duration
	// AdmitFor is how long AdmitGoroutines drive one hot key with a limit
	// of 100 per second to find the worst count in a one-second window.
	AdmitFor        time.Duration
	AdmitGoroutines int
	// DenyFor is how long each side of the deny-cache row runs.
	DenyFor time.Duration
	// FloodProcesses OS processes with FloodGoroutines goroutines each hit
	// one key limited to 100 a second for FloodFor (see Flood).
	FloodProcesses, FloodGoroutines int
	FloodFor                        time.Duration
	// Flush allows FLUSHALL before each memory measurement. Set it only for
	// a server nobody else uses.
	Flush bool
	// Baseline names the contender the ratios refer to; empty: the fastest
	// peer of each setting.
	Baseline string
	// Only keeps the contenders whose name matches, when set.
	Only *regexp.Regexp
	// ContextTimeout sets go-redis's ContextTimeoutEnabled on every
	// contender's client.
	ContextTimeout bool
	// Client is how every go-redis client of the contenders is built: the
	// throughput processes' and the program's own (PoolClient when empty).
	Client Client
	// Builds are other builds of rwbench whose ratewindow contenders run
	// beside this build's, in the throughput grid only (ThroughputOnly).
	Builds []Build
	// CPUProfile, when set, is where each throughput process writes a CPU
	// profile of its slice: CPUProfile followed by the contender, setting
	// and round.
	CPUProfile string
	// ThroughputOnly skips everything but the throughput grid; FloodOnly
	// everything but the flood.
	ThroughputOnly, FloodOnly bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// MinMemKeys is the fewest keys a memory measurement takes: below it the
// server's own churn between two readings (freed buffers, rehashed tables;
// hundreds of KB) is as large as the keys' memory, and a figure may even
// come out negative.
const MinMemKeys = 50_000

// throughputCount and throughputWindow are the throughput runs' limit:
// 500,000 a second, above the most decisions any contender made on one key
// (280,000 a second), in a window short enough that a sliding log holds
// no more than core.MaxLogCount units (8,192 per 16.384ms).
const (
	throughputCount  = min(50_000, core.MaxLogCount)
	throughputWindow = throughputCount * time.Second / 500_000
)

// FullConfig is a normal run: about 13 minutes on 2 cores.
func FullConfig() Config {
	return Config{
		Goroutines: []int{1, 16, 64, 256}, Keys: []int{1, 100_000}, ClusterGoroutines: []int{64, 256},
		Rounds: 3, Slice: time.Second, Warm: 200 * time.Millisecond, Count: throughputCount, Window: throughputWindow,
		MemKeys: 100_000, MemRequests: 10, Settle: 500 * time.Millisecond,
		AdmitFor: 3 * time.Second, AdmitGoroutines: 64, DenyFor: time.Second,
		FloodProcesses: 3, FloodGoroutines: 64, FloodFor: 10 * time.Second,
	}
}

// QuickConfig is a smoke run of the same code paths but memory (whose
// figures need MinMemKeys keys, too long for it), with one Cluster
// goroutine count, in under a minute.
func QuickConfig() Config {
	c := FullConfig()
	c.Rounds, c.Slice, c.Warm = 1, 150*time.Millisecond, 50*time.Millisecond
	c.ClusterGoroutines = []int{64}
	c.MemKeys = 0
	c.AdmitFor, c.DenyFor = 1200*time.Millisecond, 200*time.Millisecond
	c.FloodFor = 1500 * time.Millisecond
	return c
}

// Throughput is one contender in one setting: a Slice a round.
type Throughput struct {
	Contender        string
	Goroutines, Keys int
	// Cluster is set for the settings run on a Redis Cluster.
	Cluster bool
	Rounds  []Slice
}

// Median returns the median of fig over the rounds, and the smallest and
// largest value (the spread).
func (t Throughput) Median(fig func(Slice) float64) (med, lo, hi float64) {
	if len(t.Rounds) == 0 {
		return 0, 0, 0
	}
	v := make([]float64, len(t.Rounds))
	for i, s := range t.Rounds {
		v[i] = fig(s)
	}
	slices.Sort(v)
	n := len(v)
	med = v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return med, v[0], v[n-1]
}

// PerSecond is the median of the rounds' decisions per second.
func (t Throughput) PerSecond() float64 {
	m, _, _ := t.Median(Slice.PerSecond)
	return m
}

// Errors is the failed decisions of every round.
func (t Throughput) Errors() int64 {
	var n int64
	for _, s := range t.Rounds {
		n += s.Errors
	}
	return n
}

// Denied is the decisions of every round that were answered, and denied:
// none where the limit admits every request, as it should.
func (t Throughput) Denied() int64 {
	var n int64
	for _, s := range t.Rounds {
		n += s.Decisions - s.Admitted - s.Errors
	}
	return n
}

func perDecision(v float64, n int64) float64 {
	if n == 0 {
		return 0
	}
	return v / float64(n)
}

// Memory is a contender's Redis memory per key.
type Memory struct {
	Contender string
	// PerKey is the used_memory delta per key after MemRequests requests on
	// each key, PerKeyOne after one request on each.
	PerKey, PerKeyOne float64
	// Admitted counts the admitted requests of the MemRequests run.
	Admitted int64
	// Errors counts the failed requests of both runs.
	Errors int64
}

// Admission is the worst count admitted in any one-second window on one
// hot key with a limit of 100 per second.
type Admission struct {
	Contender string
	Worst     int
	Admitted  int
	Errors    int64
	For       time.Duration
}

// Deny compares a hot denied key with ratewindow's deny cache on and off.
type Deny struct {
	Goroutines int
	On, Off    Slice // summed over the rounds
}

// Report is the outcome of a run.
type Report struct {
	Config     Config
	Redis      string // version
	Go         string
	CPUs       int
	Contenders []Contender
	// Flushed is set when the server was flushed before each throughput
	// process (the program's own server, or -flush).
	Flushed    bool
	Throughput []Throughput
	Memory     []Memory
	MemoryNote string
	Admission  []Admission
	Deny       []Deny
	Flood      []Flood
	Started    time.Time
	Took       time.Duration
}

func (c *Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

// Run measures every contender on the Redis at srv.
func Run(ctx context.Context, srv *Server, cfg Config) (*Report, error) {
	if err := cfg.Client.check(cfg.ContextTimeout); err != nil {
		return nil, err
	}
	maxG := slices.Max(append(slices.Clone(cfg.Goroutines), cfg.AdmitGoroutines, 1))
	rdb := redis.NewClient(cfg.Client.options(srv.Addr, maxG, cfg.ContextTimeout))
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("bench: redis at %s: %w", srv.Addr, err)
	}
	rep := &Report{Config: cfg, Redis: redisVersion(ctx, rdb), Go: runtime.Version(), CPUs: runtime.NumCPU(), Started: time.Now(),
		Flushed: srv.Own || cfg.Flush}
	for _, c := range Contenders() {
		if cfg.Only == nil || cfg.Only.MatchString(c.Name) {
			rep.Contenders = append(rep.Contenders, c)
		}
	}
	for _, c := range Optional() {
		if cfg.Only != nil && cfg.Only.MatchString(c.Name) {
			rep.Contenders = append(rep.Contenders, c)
		}
	}
	if len(rep.Contenders) == 0 {
		return nil, errors.New("bench: no contender matches -only")
	}
	if len(cfg.Builds) > 0 && !cfg.ThroughputOnly {
		return nil, errors.New("bench: another build (-with) runs in the throughput grid only: give -speed or -cluster-only")
	}
	ours := rep.Contenders
	for _, b := range cfg.Builds {
		rep.Contenders = append(rep.Contenders, b.contenders(ours)...)
	}
	if cfg.MemKeys > 0 && cfg.MemKeys < MinMemKeys {
		return nil, fmt.Errorf("bench: %d keys for memory: at least %d, or none", cfg.MemKeys, MinMemKeys)
	}
	type phase struct {
		name string
		run  func() error
	}
	flood := phase{"flood", func() error { return runFlood(ctx, srv, &cfg, rep) }}
	var phases []phase
	switch {
	case cfg.FloodOnly:
		phases = []phase{flood}
	case cfg.ThroughputOnly:
		phases = []phase{{"throughput", func() error { return runThroughput(ctx, srv, rdb, &cfg, rep) }}}
	default:
		phases = []phase{
			{"throughput", func() error { return runThroughput(ctx, srv, rdb, &cfg, rep) }},
			{"deny cache", func() error { return runDeny(ctx, rdb, &cfg, rep) }},
			{"worst window", func() error { return runAdmission(ctx, rdb, &cfg, rep) }},
		}
		if cfg.FloodProcesses > 0 {
			phases = append(phases, flood)
		}
		switch {
		case cfg.MemKeys == 0:
			rep.MemoryNote = fmt.Sprintf("Not measured: this run takes no keys for it (a quick run leaves it out: its figures need %s keys or more)", thousands(MinMemKeys))
		case cfg.Flush || srv.Own:
			phases = append(phases, phase{"memory", func() error { return runMemory(ctx, rdb, &cfg, rep) }})
		default:
			rep.MemoryNote = "Not measured: REDIS_ADDR is not the program's own server and -flush was not given"
		}
	}
	for _, ph := range phases {
		t0 := time.Now()
		if err := ph.run(); err != nil {
			return nil, err
		}
		cfg.logf("-- %s took %v", ph.name, time.Since(t0).Round(100*time.Millisecond))
	}
	rep.Took = time.Since(rep.Started)
	return rep, nil
}

// keyNames returns n distinct user keys.
func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// runThroughput runs the throughput grid on the server, then on a Cluster
// it starts (ClusterGoroutines), and stops.
func runThroughput(ctx context.Context, srv *Server, rdb *redis.Client, cfg *Config, rep *Report) error {
	mayFlush := srv.Own || cfg.Flush
	var flush nodes
	if mayFlush {
		flush = nodes{rdb}
	}
	single := grid{addr: srv.Addr, goroutines: cfg.Goroutines, flush: flush, resetStat: mayFlush}
	if err := single.run(ctx, cfg, rep); err != nil {
		return err
	}
	if len(cfg.ClusterGoroutines) == 0 || !slices.ContainsFunc(rep.Contenders, func(c Contender) bool { return c.NoCluster == "" }) {
		return nil
	}
	t0 := time.Now()
	cl, err := StartCluster(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	cfg.logf("cluster of %d masters at %s (started in %v)", len(cl.Addrs), strings.Join(cl.Addrs, ", "), time.Since(t0).Round(10*time.Millisecond))
	masters := dialNodes(cl.Addrs)
	defer masters.Close()
	return grid{cluster: cl.Addrs, goroutines: cfg.ClusterGoroutines, flush: masters, resetStat: true}.run(ctx, cfg, rep)
}

// grid is the throughput grid on one server (addr) or a Cluster (its
// masters).
type grid struct {
	addr       string
	cluster    []string
	goroutines []int
	// flush, when set, are flushed before each process; resetStat: each
	// process resets the servers' statistics before its slice.
	flush     nodes
	resetStat bool
}

// run measures every setting of the grid: in each, Rounds rounds, each
// running every contender once, in turn, in a child process of its own
// (SliceChild), the order rotating by one every round. On a Cluster, the
// contenders that cannot run on one are left out.
func (gr grid) run(ctx context.Context, cfg *Config, rep *Report) error {
	var cs []Contender
	for _, c := range rep.Contenders {
		if gr.cluster == nil || c.NoCluster == "" {
			cs = append(cs, c)
		}
	}
	n := len(cs)
	where := ""
	if gr.cluster != nil {
		where = " cluster"
	}
	for _, nk := range cfg.Keys {
		for _, g := range gr.goroutines {
			ts := make([]Throughput, n)
			for r := 0; r < cfg.Rounds; r++ {
				for j := range n {
					i := (j + r) % n
					c := cs[i]
					if err := gr.flush.do(ctx, "FLUSHALL", "SYNC"); err != nil {
						return err
					}
					spec := SliceSpec{
						Addr: gr.addr, Cluster: gr.cluster, Contender: cmp.Or(c.Runs, c.Name), Goroutines: g, Keys: nk,
						PoolSize: maxInt(gr.goroutines), Count: cfg.Count, Window: cfg.Window,
						Warm: cfg.Warm, For: cfg.Slice, ResetStat: gr.resetStat, ContextTimeout: cfg.ContextTimeout, Client: cfg.Client,
					}
					if cfg.CPUProfile != "" {
						spec.CPUProfile = fmt.Sprintf("%s.%s.g%d.k%d%s.r%d", cfg.CPUProfile, slug(c.Name), g, nk, strings.TrimSpace(where), r+1)
					}
					s, err := runChild(ctx, c.Binary, spec)
					if err != nil {
						return fmt.Errorf("bench: %s, %d goroutine(s), %d key(s)%s: %w", c.Name, g, nk, where, err)
					}
					cfg.logf("round %d/%d %-28s g=%-3d keys=%-6d%s %10.0f/s p50=%-9v p99=%-9v Redis %s %.1f µs/call, %.1f decisions/call, %.1f µs CPU/decision, denied=%d errors=%d",
						r+1, cfg.Rounds, c.Name, g, nk, where, s.PerSecond(), s.P50, s.P99, s.Call.Name, s.CallMicros(), s.DecisionsPerCall(),
						s.RedisMicros(), s.Decisions-s.Admitted-s.Errors, s.Errors)
					if s.Errors > 0 {
						cfg.logf("  an error: %s", s.FirstError)
					}
					ts[i].Rounds = append(ts[i].Rounds, s)
				}
			}
			for i := range ts {
				t := &ts[i]
				t.Contender, t.Goroutines, t.Keys, t.Cluster = cs[i].Name, g, nk, gr.cluster != nil
				rep.Throughput = append(rep.Throughput, *t)
			}
		}
	}
	return nil
}

// slug is name with every run of other characters than letters and digits
// made one '-'.
func slug(name string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
		} else {
			dash = true
		}
	}
	return b.String()
}

// worker is one goroutine's share of a slice.
type worker struct {
	decide              Decide
	rng                 rand.PCG
	n, admitted, errors int64
	h                   hist
	err                 error
}

// runSlice runs a goroutine for each of decide, deciding on random keys,
// for about d. With stats, it reads the server's CPU time before and after.
func runSlice(ctx context.Context, stats nodes, decide []Decide, keys []string, d time.Duration) (Slice, *hist, error) {
	ws := make([]*worker, len(decide))
	for i := range ws {
		ws[i] = &worker{decide: decide[i]}
		ws[i].rng.Seed(rand.Uint64(), rand.Uint64())
	}
	var cpu0, cpu1 time.Duration
	var err error
	if stats != nil {
		if cpu0, err = stats.cpu(ctx); err != nil {
			return Slice{}, nil, err
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	ru0 := rusage()
	start := time.Now()
	for _, w := range ws {
		wg.Go(func() {
			nk := uint64(len(keys))
			for !stop.Load() {
				k := keys[0]
				if nk > 1 {
					k = keys[w.rng.Uint64()%nk]
				}
				t0 := time.Now()
				ok, err := w.decide(ctx, k)
				took := time.Since(t0)
				w.n++
				switch {
				case err != nil: // no decision: neither its rate nor its latency
					w.errors++
					if w.err == nil {
						w.err = err
					}
					continue
				case ok:
					w.admitted++
				}
				w.h.record(took)
			}
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	ru1 := rusage()
	runtime.ReadMemStats(&ms1)
	if stats != nil {
		if cpu1, err = stats.cpu(ctx); err != nil {
			return Slice{}, nil, err
		}
	}
	s := Slice{Elapsed: elapsed, Mallocs: ms1.Mallocs - ms0.Mallocs, ClientCPU: ru1 - ru0, RedisCPU: cpu1 - cpu0}
	h := new(hist)
	for _, w := range ws {
		s.Decisions += w.n
		s.Admitted += w.admitted
		s.Errors += w.errors
		if w.err != nil && s.FirstError == "" {
			s.FirstError = w.err.Error()
		}
		h.merge(&w.h)
		if w.err != nil && w.errors == w.n {
			return s, h, fmt.Errorf("every decision failed: %w", w.err)
		}
	}
	return s, h, nil
}

// rusage is this process's CPU time, user plus system.
func rusage() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the server's CPU time from INFO cpu, user plus system.
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("bench: INFO cpu %s: %w", name, err)
			}
			total += f
		}
	}
	return time.Duration(total * 1e9), nil
}

// runDeny measures one denied hot key with the deny cache on and off.
func runDeny(ctx context.Context, rdb *redis.Client, cfg *Config, rep *Report) error {
	if cfg.Only != nil && !cfg.Only.MatchString("ratewindow sliding-log") {
		return nil
	}
	on := ratewindow("deny cache on", core.SlidingLog)
	off := ratewindow("deny cache off", core.SlidingLog, core.WithDenyCache(0))
	// one unit per hour, used up: every later request is denied for an hour
	key := []string{"denied:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	var makers [2]func() Decide
	for i, c := range []Contender{on, off} {
		m, err := c.New(rdb, 1, time.Hour)
		if err != nil {
			return err
		}
		if _, err := m()(ctx, key[0]); err != nil {
			return err
		}
		makers[i] = m
	}
	decide := func(m func() Decide, g int) []Decide {
		d := make([]Decide, g)
		for i := range d {
			d[i] = m()
		}
		return d
	}
	for _, g := range []int{1, 64} {
		var d Deny
		d.Goroutines = g
		for r := 0; r < max(cfg.Rounds, 1); r++ {
			for i, m := range makers {
				t, _, err := runSlice(ctx, nil, decide(m, g), key, cfg.DenyFor)
				if err != nil {
					return fmt.Errorf("bench: deny cache: %w", err)
				}
				s := &d.On
				if i == 1 {
					s = &d.Off
				}
				s.Decisions += t.Decisions
				s.Admitted += t.Admitted
				s.Errors += t.Errors
				s.Elapsed += t.Elapsed
				s.Mallocs += t.Mallocs
				s.ClientCPU += t.ClientCPU
			}
		}
		cfg.logf("hot denied key g=%-3d cache on %10.0f/s, off %10.0f/s (%.0f×), admitted %d/%d",
			g, d.On.PerSecond(), d.Off.PerSecond(), d.On.PerSecond()/d.Off.PerSecond(), d.On.Admitted, d.Off.Admitted)
		rep.Deny = append(rep.Deny, d)
	}
	return nil
}
