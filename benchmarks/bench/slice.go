package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Slice is one contender's measurement in one setting and one round: a
// process of its own (see SliceChild) that warmed up, then decided for
// about Config.Slice.
type Slice struct {
	Decisions, Admitted, Errors int64
	// FirstError is the text of an error of the slice: the first of the
	// first goroutine that failed; "": none.
	FirstError string `json:",omitempty"`
	Elapsed    time.Duration
	P50, P99   time.Duration
	Mallocs    uint64
	// ClientCPU is the process's CPU time, user + system: the process ran
	// this contender alone.
	ClientCPU time.Duration
	// RedisCPU is the server's INFO cpu, user + system.
	RedisCPU time.Duration
	// Pool is the go-redis client's pool size as go-redis set it (its
	// default when SliceSpec.Client is DefaultClient).
	Pool int
	// Call is the decision's call to Redis as INFO commandstats counted it;
	// Inside, the commands it ran inside (a script's redis.call, a
	// transaction's commands), most time first.
	Call   Call
	Inside []CommandStat
}

// PerSecond is the decisions answered per second: a call that failed (for
// ratewindow, one its failure mode answered: Result.BackendErr) is none.
func (s Slice) PerSecond() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Decisions-s.Errors) / s.Elapsed.Seconds()
}

// AllocsPerDecision is runtime.MemStats.Mallocs per decision.
func (s Slice) AllocsPerDecision() float64 { return perDecision(float64(s.Mallocs), s.Decisions) }

// ClientMicros is the client process's CPU µs per decision.
func (s Slice) ClientMicros() float64 { return perDecision(float64(s.ClientCPU)/1e3, s.Decisions) }

// RedisMicros is the server's CPU µs per decision.
func (s Slice) RedisMicros() float64 { return perDecision(float64(s.RedisCPU)/1e3, s.Decisions) }

// CallMicros is Redis's own µs per call (commandstats usec over calls):
// the execution of the call, without reading and writing the connection.
func (s Slice) CallMicros() float64 {
	if s.Call.Calls == 0 {
		return 0
	}
	return float64(s.Call.Usec) / float64(s.Call.Calls)
}

// DecisionsPerCall is above 1 where decisions are merged into one call.
func (s Slice) DecisionsPerCall() float64 {
	if s.Call.Calls == 0 {
		return 0
	}
	return float64(s.Decisions) / float64(s.Call.Calls)
}

// CommandStat is one command's line of INFO commandstats, or the
// difference of two.
type CommandStat struct {
	Name  string // as INFO writes it, lower case: "fcall", "config|resetstat"
	Calls int64
	Usec  int64
}

// Call is the command (or commands) a contender sends Redis for one call.
type Call struct {
	// Name is how tables name it: "FCALL", "EVALSHA", "MGET + MULTI/EXEC".
	Name string
	// Calls counts the calls; Usec is Redis's own time in them, in µs.
	Calls, Usec int64
}

// scriptCommands are the commands that run a script or a function: a
// contender's call, unless Contender.Call names others.
var scriptCommands = []string{"fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro"}

// harnessCommands are what the benchmark itself and a client's connection
// setup send, no part of a decision.
var harnessCommands = []string{"info", "config", "hello", "client", "select", "auth", "ping", "flushall"}

// parseCommandStats reads INFO commandstats.
func parseCommandStats(info string) (map[string]CommandStat, error) {
	out := map[string]CommandStat{}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			return nil, fmt.Errorf("bench: INFO commandstats: %q", line)
		}
		st := CommandStat{Name: name}
		seen := 0
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			var dst *int64
			switch k {
			case "calls":
				dst = &st.Calls
			case "usec":
				dst = &st.Usec
			default:
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("bench: INFO commandstats %s %s: %w", name, k, err)
			}
			*dst = n
			seen++
		}
		if seen != 2 {
			return nil, fmt.Errorf("bench: INFO commandstats: no calls or usec in %q", line)
		}
		out[name] = st
	}
	return out, nil
}

// commandDelta is after less before, without the harness's commands and
// without commands not called in between.
func commandDelta(before, after map[string]CommandStat) map[string]CommandStat {
	out := map[string]CommandStat{}
	for name, a := range after {
		base, _, _ := strings.Cut(name, "|")
		if slices.Contains(harnessCommands, base) {
			continue
		}
		b := before[name]
		if d := (CommandStat{Name: name, Calls: a.Calls - b.Calls, Usec: a.Usec - b.Usec}); d.Calls > 0 {
			out[name] = d
		}
	}
	return out
}

// splitCall divides the commands of a slice into the contender's call and
// the commands inside it. names are the call's commands, the first counting
// the calls (Contender.Call); none: the script commands that were called,
// each a call.
func splitCall(cmds map[string]CommandStat, names []string, label string) (Call, []CommandStat) {
	var call Call
	var upper []string
	if len(names) == 0 {
		for _, n := range scriptCommands {
			if st, ok := cmds[n]; ok {
				call.Calls += st.Calls
				call.Usec += st.Usec
				upper = append(upper, strings.ToUpper(n))
			}
		}
		call.Name = strings.Join(upper, " + ")
	} else {
		call.Name = label
		call.Calls = cmds[names[0]].Calls
		for _, n := range names {
			call.Usec += cmds[n].Usec
		}
	}
	var inside []CommandStat
	for name, st := range cmds {
		if slices.Contains(names, name) || (len(names) == 0 && slices.Contains(scriptCommands, name)) {
			continue
		}
		inside = append(inside, st)
	}
	slices.SortFunc(inside, func(a, b CommandStat) int {
		if a.Usec != b.Usec {
			return int(b.Usec - a.Usec)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return call, inside
}

// nodes are the servers whose statistics a slice reads: the one server, or
// every master of a Cluster, each figure summed over them.
type nodes []*redis.Client

// dialNodes returns a client of one connection to each of addrs.
func dialNodes(addrs []string) nodes {
	n := make(nodes, len(addrs))
	for i, a := range addrs {
		n[i] = redis.NewClient(&redis.Options{Addr: a, PoolSize: 1})
	}
	return n
}

// Close closes every client.
func (n nodes) Close() {
	for _, c := range n {
		_ = c.Close()
	}
}

// commandStats is INFO commandstats summed over the nodes.
func (n nodes) commandStats(ctx context.Context) (map[string]CommandStat, error) {
	out := map[string]CommandStat{}
	for _, c := range n {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return nil, err
		}
		m, err := parseCommandStats(info)
		if err != nil {
			return nil, err
		}
		sumCommandStats(out, m)
	}
	return out, nil
}

// sumCommandStats adds each command of m to sum.
func sumCommandStats(sum, m map[string]CommandStat) {
	for name, st := range m {
		t := sum[name]
		t.Name, t.Calls, t.Usec = name, t.Calls+st.Calls, t.Usec+st.Usec
		sum[name] = t
	}
}

// cpu is the servers' CPU time from INFO cpu, user plus system, summed.
func (n nodes) cpu(ctx context.Context) (time.Duration, error) {
	var total time.Duration
	for _, c := range n {
		d, err := redisCPU(ctx, c)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// do sends one command to every node.
func (n nodes) do(ctx context.Context, args ...any) error {
	for _, c := range n {
		if err := c.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("bench: %v on %s: %w", args, c.Options().Addr, err)
		}
	}
	return nil
}

// SliceSpec is what one child process measures (see SliceChild).
type SliceSpec struct {
	// Addr is the Redis; Contender the name of one of Contenders.
	Addr, Contender string
	// Cluster, when set, are the masters of a Redis Cluster that the slice
	// runs on instead of Addr, through a cluster client; the server figures
	// are summed over them.
	Cluster []string
	// Goroutines decide on random keys among Keys ("user:0" ...).
	Goroutines, Keys int
	// PoolSize is the go-redis pool of the process: the same in every
	// setting, as in one shared client.
	PoolSize int
	// Count per Window is the limit.
	Count  int
	Window time.Duration
	// Warm is the warm-up before the slice; For, the slice.
	Warm, For time.Duration
	// ResetStat sends CONFIG RESETSTAT before the slice (a server the
	// program may reset); the figures are differences either way.
	ResetStat bool
	// ContextTimeout sets go-redis's ContextTimeoutEnabled.
	ContextTimeout bool
	// Client is how the go-redis client is built: PoolClient (or empty)
	// with PoolSize and ContextTimeout, DefaultClient with the address
	// alone.
	Client Client
	// CPUProfile, when set, receives a CPU profile of the slice.
	CPUProfile string
}

// SliceChild measures one contender in one setting in this process (see
// MeasureSlice) and writes the Slice to stdout as JSON: rwbench runs it in a
// child process (-slice-child) for every contender, setting and round.
func SliceChild(ctx context.Context, spec SliceSpec) error {
	s, err := MeasureSlice(ctx, spec)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(&s)
}

// MeasureSlice measures one contender in one setting: it warms up for
// spec.Warm (connections opened, scripts loaded), resets (with
// spec.ResetStat) and reads the server's statistics, decides for spec.For,
// and reads them again.
func MeasureSlice(ctx context.Context, spec SliceSpec) (Slice, error) {
	var c *Contender
	for _, x := range append(Contenders(), Optional()...) {
		if x.Name == spec.Contender {
			c = &x
			break
		}
	}
	if c == nil {
		return Slice{}, fmt.Errorf("bench: no contender %q", spec.Contender)
	}
	if spec.Goroutines <= 0 || spec.Keys <= 0 || spec.For <= 0 {
		return Slice{}, fmt.Errorf("bench: slice needs goroutines, keys and a length: %+v", spec)
	}
	if len(spec.Cluster) > 0 && c.NoCluster != "" {
		return Slice{}, fmt.Errorf("bench: %s on a Cluster: %s", c.Name, c.NoCluster)
	}
	if err := spec.Client.check(spec.ContextTimeout); err != nil {
		return Slice{}, err
	}
	var rdb redis.UniversalClient
	var pool int
	addrs := []string{spec.Addr}
	if len(spec.Cluster) > 0 {
		addrs = spec.Cluster
		cc := redis.NewClusterClient(spec.Client.clusterOptions(spec.Cluster, max(spec.PoolSize, spec.Goroutines), spec.ContextTimeout))
		rdb, pool = cc, cc.Options().PoolSize
	} else {
		rc := redis.NewClient(spec.Client.options(spec.Addr, max(spec.PoolSize, spec.Goroutines), spec.ContextTimeout))
		rdb, pool = rc, rc.Options().PoolSize
	}
	defer rdb.Close()
	stats := dialNodes(addrs)
	defer stats.Close()
	mk, err := c.New(rdb, spec.Count, spec.Window)
	if err != nil {
		return Slice{}, fmt.Errorf("bench: %s: %w", c.Name, err)
	}
	decide := make([]Decide, spec.Goroutines)
	for i := range decide {
		decide[i] = mk()
	}
	keys := keyNames("user:", spec.Keys)
	if spec.Warm > 0 {
		if _, _, err := runSlice(ctx, nil, decide, keys, spec.Warm); err != nil {
			return Slice{}, fmt.Errorf("bench: %s: warming up: %w", c.Name, err)
		}
	}
	if spec.ResetStat {
		if err := stats.do(ctx, "CONFIG", "RESETSTAT"); err != nil {
			return Slice{}, err
		}
	}
	before, err := stats.commandStats(ctx)
	if err != nil {
		return Slice{}, err
	}
	if spec.CPUProfile != "" {
		f, err := os.Create(spec.CPUProfile)
		if err != nil {
			return Slice{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return Slice{}, err
		}
	}
	s, h, err := runSlice(ctx, stats, decide, keys, spec.For)
	if spec.CPUProfile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return Slice{}, fmt.Errorf("bench: %s: %w", c.Name, err)
	}
	after, err := stats.commandStats(ctx)
	if err != nil {
		return Slice{}, err
	}
	s.P50, s.P99, s.Pool = h.quantile(0.50), h.quantile(0.99), pool
	s.Call, s.Inside = splitCall(commandDelta(before, after), c.Call, c.CallName)
	return s, nil
}

// runChild runs spec in a child process of binary (empty: this program)
// and returns its Slice.
func runChild(ctx context.Context, binary string, spec SliceSpec) (Slice, error) {
	if binary == "" {
		self, err := os.Executable()
		if err != nil {
			return Slice{}, err
		}
		binary = self
	}
	arg, err := json.Marshal(spec)
	if err != nil {
		return Slice{}, err
	}
	cmd := exec.CommandContext(ctx, binary, "-slice-child", string(arg))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return Slice{}, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var s Slice
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		return Slice{}, fmt.Errorf("bench: the slice's child answered %q: %w", out.String(), err)
	}
	if s.Decisions == 0 {
		return s, errors.New("bench: the slice's child made no decision")
	}
	// a build of rwbench from before -client reads no Client from the spec
	// and reports no pool: its client may not be the one asked for
	if s.Pool == 0 {
		return s, fmt.Errorf("bench: %s reported no pool size: a build from before -client, whose client may not be the one asked for", binary)
	}
	return s, nil
}

// InsideMicros is Redis's µs per call in the commands inside the call.
func (s Slice) InsideMicros() float64 {
	if s.Call.Calls == 0 {
		return 0
	}
	var usec int64
	for _, c := range s.Inside {
		usec += c.Usec
	}
	return float64(usec) / float64(s.Call.Calls)
}

// RestMicros is Redis's µs per call outside the commands inside it: for a
// script, its Lua and the script call's own work.
func (s Slice) RestMicros() float64 { return s.CallMicros() - s.InsideMicros() }

// QuietRedisLog returns a go-redis logger (for redis.SetLogger) that writes
// to w every line but go-redis's note that it raised a duration below a
// second to one (httprate-redis's EXPIRE of three windows, with a window
// of 100 ms, on every decision).
func QuietRedisLog(w io.Writer) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return quietLog{w}
}

type quietLog struct{ w io.Writer }

// Printf writes the line unless it is the truncation note.
func (q quietLog) Printf(_ context.Context, format string, v ...any) {
	if strings.Contains(format, "minimal supported value is") {
		return
	}
	fmt.Fprintf(q.w, format+"\n", v...)
}
