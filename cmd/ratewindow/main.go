// Command ratewindow operates the rate limits of a running service from a
// shell: the rules it published, a key's usage, resets, blocks, overrides
// and the keys denied most, on the Redis that REDIS_URL names; and it
// removes the limit keys an older release left (cleanup).
//
// Usage:
//
//	ratewindow [flags] <command> [arguments]
//
// Run it without arguments for the commands and flags; docs/operations.md
// has examples.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/admin"
	"github.com/ratewindow/ratewindow/core"
)

func main() {
	// The tool reports every failure itself; go-redis's own log lines (a
	// pool's dial retries) would only repeat them.
	redis.SetLogger(quiet{})
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

// quiet is a go-redis logger that writes nothing.
type quiet struct{}

// Printf writes nothing.
func (quiet) Printf(context.Context, string, ...any) {}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1 // an operation failed, or the confirmation was refused
	exitUsage = 2 // the command line is wrong
)

const usageText = `usage: ratewindow [flags] <command> [arguments]

Operates the rate limits of a service on the Redis that REDIS_URL names:
  redis://[user:password@]host:port[/db]              a single server
  rediss://...                                        the same over TLS
  redis://host:port?addr=host2:port2&addr=...         a Cluster (one node's address works too)
Rules are those the application published (core.Limiter.Publish); keys are
its key functions' results, such as ip:203.0.113.7 (keyfuncs.IP).

Commands:
  rules                                  the published rules and their limits
  usage RULE KEY                         a key's usage of each limit, its block and override
  reset RULE KEY...                      forget a key's counts and lift its block
  block -for DURATION RULE KEY...        deny a key on every replica for a time, such as 15m
  unblock RULE KEY...                    lift a key's block or ban
  override set [-for DURATION] RULE KEY LIMITS
                                         give a key its own counts, such as "500/m, 20000/24h"
                                         (a count per window of the rule's limits; -for: until removed)
  override get RULE KEY                  a key's override
  override rm RULE KEY...                remove a key's override
  top [-n 10] [-since 5m] RULE           the keys denied most under a rule
  cleanup                                delete the limit keys of the former key format (before
                                         v2) under the prefix, some of which never expire; run
                                         it once no replica of a release before v2 is running

Flags (before or after the command's arguments; "--" ends them):
  -json              print JSON instead of tables
  -yes               do not ask before acting on more than one key
  -prefix PREFIX     the key prefix of the application's Limiter (default "rw:")
  -timeout DURATION  give up after this long (default 10s)
  -for, -n, -since   as the commands above say
`

// options are the command line's flags.
type options struct {
	json    bool
	yes     bool
	prefix  string
	timeout time.Duration
	dur     time.Duration // -for
	n       int
	since   time.Duration
}

// command is one of the tool's commands.
type command struct {
	name     string
	min, max int      // how many arguments after the name (max -1: any)
	flags    []string // the flags of this command beside the common ones
	many     bool     // it changes every key it is given: confirm more than one
	run      func(c *cli, args []string) error
}

// commands returns the tool's commands, in the order usageText lists them.
func commands() []command {
	return []command{
		{name: "rules", run: (*cli).rules},
		{name: "usage", min: 2, max: 2, run: (*cli).usage},
		{name: "reset", min: 2, max: -1, many: true, run: (*cli).reset},
		{name: "block", min: 2, max: -1, flags: []string{"for"}, many: true, run: (*cli).block},
		{name: "unblock", min: 2, max: -1, many: true, run: (*cli).unblock},
		{name: "override set", min: 3, max: 3, flags: []string{"for"}, run: (*cli).overrideSet},
		{name: "override get", min: 2, max: 2, run: (*cli).overrideGet},
		{name: "override rm", min: 2, max: -1, many: true, run: (*cli).overrideRm},
		{name: "top", min: 1, max: 1, flags: []string{"n", "since"}, run: (*cli).top},
		{name: "cleanup", run: (*cli).cleanup}, // confirms by itself: the keys are known after a scan
	}
}

// cli is one run of the tool.
type cli struct {
	ctx    context.Context
	opt    options
	ops    *admin.Ops
	rdb    redis.UniversalClient
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// run runs the tool with the command line args, REDIS_URL from getenv, the
// confirmation read from stdin, and returns its exit status.
func run(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	opt, cmd, rest, err := parseArgs(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	if err != nil {
		report(stderr, err)
		fmt.Fprint(stderr, "\n"+usageText)
		return exitUsage
	}
	if cmd.many && len(rest) > 2 && !opt.yes {
		what := fmt.Sprintf("%s %d keys under rule %q: %s", cmd.name, len(rest)-1, rest[0], strings.Join(rest[1:], ", "))
		if err := confirm(cmd.name, what, stdin, stderr); err != nil {
			report(stderr, err)
			return exitFail
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), opt.timeout)
	defer cancel()
	rdb, err := connect(ctx, getenv("REDIS_URL"))
	if err != nil {
		report(stderr, err)
		return exitFail
	}
	defer func() { _ = rdb.Close() }()
	l, err := core.New(rdb, core.WithPrefix(opt.prefix), core.WithTimeout(opt.timeout))
	if err != nil {
		report(stderr, err)
		return exitFail
	}
	ops, err := admin.NewOps(l)
	if err != nil {
		report(stderr, err)
		return exitFail
	}
	c := &cli{ctx: ctx, opt: opt, ops: ops, rdb: rdb, stdin: stdin, stdout: stdout, stderr: stderr}
	if err := cmd.run(c, rest); err != nil {
		report(stderr, err)
		return exitFail
	}
	return exitOK
}

// report writes err on stderr after the tool's name, once: the errors of
// ratewindow's packages start with it already.
func report(stderr io.Writer, err error) {
	fmt.Fprintln(stderr, "ratewindow: "+strings.TrimPrefix(err.Error(), "ratewindow: "))
}

// parseArgs reads the command line: the flags wherever they are, the
// command and its arguments.
func parseArgs(args []string) (options, command, []string, error) {
	opt := options{prefix: core.DefaultPrefix, timeout: 10 * time.Second, n: admin.DefaultTopN, since: admin.DefaultTopSince}
	fs := flag.NewFlagSet("ratewindow", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&opt.json, "json", false, "")
	fs.BoolVar(&opt.yes, "yes", false, "")
	fs.StringVar(&opt.prefix, "prefix", opt.prefix, "")
	fs.DurationVar(&opt.timeout, "timeout", opt.timeout, "")
	fs.DurationVar(&opt.dur, "for", 0, "")
	fs.IntVar(&opt.n, "n", opt.n, "")
	fs.DurationVar(&opt.since, "since", opt.since, "")
	var words []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return opt, command{}, nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			words = append(words, rest...)
			break
		}
		if len(rest) > 0 {
			words = append(words, rest[0])
			rest = rest[1:]
		}
		args = rest
	}
	if len(words) == 0 {
		return opt, command{}, nil, errors.New("no command")
	}
	cmd, rest, err := find(words)
	if err != nil {
		return opt, cmd, nil, err
	}
	var stray []string
	fs.Visit(func(f *flag.Flag) {
		if !slices.Contains([]string{"json", "yes", "prefix", "timeout"}, f.Name) && !slices.Contains(cmd.flags, f.Name) {
			stray = append(stray, "-"+f.Name)
		}
	})
	switch {
	case len(stray) > 0:
		return opt, cmd, nil, fmt.Errorf("%s: %s does not apply to this command", cmd.name, strings.Join(stray, ", "))
	case len(rest) < cmd.min || cmd.max >= 0 && len(rest) > cmd.max:
		return opt, cmd, nil, fmt.Errorf("%s: wrong number of arguments (%d)", cmd.name, len(rest))
	case cmd.name == "block" && opt.dur == 0:
		return opt, cmd, nil, errors.New("block: -for is required, such as -for 15m")
	case opt.timeout <= 0:
		return opt, cmd, nil, fmt.Errorf("-timeout %s: must be above 0", opt.timeout)
	}
	return opt, cmd, rest, nil
}

// find returns the command that words start with, and its arguments.
func find(words []string) (command, []string, error) {
	for _, cmd := range commands() {
		name := strings.Fields(cmd.name)
		if len(words) >= len(name) && slices.Equal(words[:len(name)], name) {
			return cmd, words[len(name):], nil
		}
	}
	if words[0] == "override" {
		return command{}, nil, errors.New("override: want set, get or rm")
	}
	return command{}, nil, fmt.Errorf("unknown command %q", words[0])
}

// confirm asks on stderr whether to go on with the command name, which
// will do what, and reads the answer from stdin: only y or yes goes on.
func confirm(name, what string, stdin io.Reader, stderr io.Writer) error {
	fmt.Fprintf(stderr, "%s\nGo on? [y/N] ", what)
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(stderr)
		return fmt.Errorf("%s: no answer on standard input: nothing changed (pass -yes to go on without asking)", name)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return fmt.Errorf("%s: not confirmed: nothing changed", name)
}
