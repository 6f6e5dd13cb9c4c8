// Command rwbench runs ratewindow and other Go rate limiters side by side
// against one Redis and writes a Markdown table and an SVG chart.
//
// The Redis is REDIS_ADDR, or a redis-server the program starts on a free
// port of 127.0.0.1. Memory is measured with FLUSHALL, so on a REDIS_ADDR
// server it runs only with -flush.
//
//	cd benchmarks && go run ./cmd/rwbench            # full run, a few minutes
//	cd benchmarks && go run ./cmd/rwbench -quick     # smoke run, under a minute
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"

	"github.com/ratewindow/ratewindow/benchmarks/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rwbench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := flag.Bool("quick", false, "a short run of every measurement (under a minute), for CI")
	out := flag.String("out", "results", "directory for results.md and results.svg; empty: print the table only")
	baseline := flag.String("baseline", "", "contender the ratios refer to (default: the fastest peer of each setting)")
	flush := flag.Bool("flush", false, "allow FLUSHALL on REDIS_ADDR (memory measurement); the program's own server is always flushed")
	only := flag.String("only", "", "regexp: run only the contenders whose name matches")
	memKeys := flag.Int("memkeys", 0, "keys of the memory measurement (default 100000, 5000 with -quick)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	cfg := bench.FullConfig()
	if *quick {
		cfg = bench.QuickConfig()
	}
	cfg.Baseline, cfg.Flush, cfg.Log = *baseline, *flush, os.Stderr
	if *memKeys > 0 {
		cfg.MemKeys = *memKeys
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
