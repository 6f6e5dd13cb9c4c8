// Command rwbench runs ratewindow and other Go rate limiters side by side
// against one Redis and writes a Markdown table and an SVG chart.
//
// The Redis is REDIS_ADDR, or a redis-server the program starts on a free
// port of 127.0.0.1. Memory is measured with FLUSHALL, so on a REDIS_ADDR
// server it runs only with -flush.
//
// Each contender's throughput is measured in processes of its own: the
// program runs itself again (-slice-child) for every contender, setting and
// round, and the flood's replicas likewise (-flood-child).
//
// The throughput grid runs again on a Redis Cluster of three masters that
// the program starts on loopback (-cluster=false leaves it out,
// -cluster-only runs it alone).
//
//	cd benchmarks && go run ./cmd/rwbench            # full run, about 13 minutes
//	cd benchmarks && go run ./cmd/rwbench -quick     # smoke run, under a minute
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/benchmarks/bench"
	"github.com/ratewindow/ratewindow/core"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rwbench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := flag.Bool("quick", false, "a short run of every measurement but memory (under a minute), for CI")
	out := flag.String("out", "results", "directory for results.md and results.svg; empty: print the table only")
	baseline := flag.String("baseline", "", "contender the ratios refer to (default: the fastest peer of each setting)")
	flush := flag.Bool("flush", false, "allow FLUSHALL on REDIS_ADDR (memory measurement); the program's own server is always flushed")
	only := flag.String("only", "", "regexp: run only the contenders whose name matches")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the program to this file, and one of each throughput process to FILE.<contender>.g<G>.k<K>.r<round>")
	ctxTimeout := flag.Bool("ctxtimeout", false, "set go-redis's ContextTimeoutEnabled on every contender's client (with -client pool)")
	client := flag.String("client", string(bench.PoolClient), "every contender's go-redis client: pool (a pool as large as the most goroutines of the run) or default (redis.NewClient with only the address: go-redis's default pool, no ContextTimeoutEnabled)")
	var builds []bench.Build
	flag.Func("with", "LABEL=BINARY: another build of rwbench (against another ratewindow) whose ratewindow contenders run beside these in the same rounds, named \"... @LABEL\"; repeatable; with -speed or -cluster-only", func(s string) error {
		b, err := bench.ParseBuild(s)
		builds = append(builds, b)
		return err
	})
	speedOnly := flag.Bool("speed", false, "measure decisions per second only (no deny cache, worst window or memory)")
	goroutines := flag.String("g", "", "comma-separated goroutine counts (default 1,16,64,256)")
	keys := flag.String("keys", "", "comma-separated key counts (default 1,100000), on the server and on the Cluster")
	cluster := flag.Bool("cluster", true, "run the throughput grid on a Redis Cluster of three masters too (started on loopback)")
	clusterOnly := flag.Bool("cluster-only", false, "run the Cluster's throughput grid only")
	clusterG := flag.String("cluster-g", "", "comma-separated goroutine counts on the Cluster (default 64,256; 64 with -quick)")
	slice := flag.Duration("slice", 0, "time per contender per round (default 1s, 150ms with -quick)")
	warm := flag.Duration("warm", 0, "warm-up of each throughput process before its slice (default 200ms, 50ms with -quick)")
	rounds := flag.Int("rounds", 0, "rounds per setting (default 3, 1 with -quick)")
	memKeys := flag.Int("memkeys", 0, "keys of the memory measurement, at least 50000 (default 100000; none with -quick)")
	flood := flag.Bool("flood", true, "run the flood scenario (several processes on one key)")
	floodOnly := flag.Bool("flood-only", false, "run the flood scenario only")
	floodFor := flag.Duration("flood-for", 0, "length of the flood (default 10s, 1.5s with -quick)")
	// the throughput's child processes, one per contender, setting and round
	sliceChild := flag.String("slice-child", "", "internal: measure one slice, given as JSON")
	// the flood's child processes
	floodChild := flag.Bool("flood-child", false, "internal: run one process of the flood")
	floodAddr := flag.String("flood-addr", "", "internal")
	floodKey := flag.String("flood-key", "", "internal")
	floodAlg := flag.Int("flood-alg", 0, "internal")
	floodG := flag.Int("flood-g", 64, "internal")
	floodStart := flag.Int64("flood-start", 0, "internal")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *sliceChild != "" {
		var spec bench.SliceSpec
		if err := json.Unmarshal([]byte(*sliceChild), &spec); err != nil {
			return fmt.Errorf("-slice-child: %w", err)
		}
		// httprate's EXPIRE of a window below 1 s makes go-redis log a line
		// a decision: bench.QuietRedisLog drops that line alone.
		redis.SetLogger(bench.QuietRedisLog(os.Stderr))
		return bench.SliceChild(ctx, spec)
	}
	if *floodChild {
		return bench.FloodChild(ctx, *floodAddr, *floodKey, core.Algorithm(*floodAlg), *floodG, *floodFor, time.Unix(0, *floodStart))
	}

	cfg := bench.FullConfig()
	if *quick {
		cfg = bench.QuickConfig()
	}
	cfg.Baseline, cfg.Flush, cfg.Log = *baseline, *flush, os.Stderr
	cfg.ThroughputOnly, cfg.ContextTimeout, cfg.CPUProfile = *speedOnly, *ctxTimeout, *cpuProfile
	cfg.Builds = builds
	var err error
	if cfg.Client, err = bench.ParseClient(*client); err != nil {
		return fmt.Errorf("-client: %w", err)
	}
	if *slice > 0 {
		cfg.Slice = *slice
	}
	if *warm > 0 {
		cfg.Warm = *warm
	}
	if *rounds > 0 {
		cfg.Rounds = *rounds
	}
	for _, f := range []struct {
		s   string
		dst *[]int
	}{{*goroutines, &cfg.Goroutines}, {*keys, &cfg.Keys}, {*clusterG, &cfg.ClusterGoroutines}} {
		if f.s == "" {
			continue
		}
		*f.dst = nil
		for _, part := range strings.Split(f.s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(part))
			if err != nil || n <= 0 {
				return fmt.Errorf("bad count %q", part)
			}
			*f.dst = append(*f.dst, n)
		}
	}
	if *memKeys > 0 {
		cfg.MemKeys = *memKeys
	}
	if !*flood {
		cfg.FloodProcesses = 0
	}
	if !*cluster {
		cfg.ClusterGoroutines = nil
	}
	if *clusterOnly {
		if len(cfg.ClusterGoroutines) == 0 {
			return fmt.Errorf("-cluster-only: no Cluster goroutine count")
		}
		cfg.Goroutines, cfg.ThroughputOnly = nil, true
	}
	cfg.FloodOnly = *floodOnly
	if *floodFor > 0 {
		cfg.FloodFor = *floodFor
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			return fmt.Errorf("-only: %w", err)
		}
		cfg.Only = re
	}
	srv := &bench.Server{Addr: os.Getenv("REDIS_ADDR")}
	if srv.Addr == "" {
		var err error
		if srv, err = bench.StartServer(ctx); err != nil {
			return err
		}
		defer srv.Close()
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(os.Stderr, "redis at %s (own server: %v)\n", srv.Addr, srv.Own)
	rep, err := bench.Run(ctx, srv, cfg)
	if err != nil {
		return err
	}
	if err := rep.Markdown(os.Stdout); err != nil {
		return err
	}
	if *out == "" {
		return nil
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	md, err := os.Create(filepath.Join(*out, "results.md"))
	if err != nil {
		return err
	}
	if err := rep.Markdown(md); err != nil {
		md.Close()
		return err
	}
	if err := md.Close(); err != nil {
		return err
	}
	svg, err := os.Create(filepath.Join(*out, "results.svg"))
	if err != nil {
		return err
	}
	if err := rep.SVG(svg); err != nil {
		svg.Close()
		return err
	}
	return svg.Close()
}
