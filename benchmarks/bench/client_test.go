package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseClient(t *testing.T) {
	for s, want := range map[string]Client{"pool": PoolClient, "default": DefaultClient} {
		if got, err := ParseClient(s); err != nil || got != want {
			t.Errorf("ParseClient(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	for _, s := range []string{"", "Default", "64", "defaults"} {
		if _, err := ParseClient(s); err == nil || !strings.Contains(err.Error(), `want "pool" or "default"`) {
			t.Errorf("ParseClient(%q): %v, want an error naming the settings", s, err)
		}
	}
}

// TestDefaultClientOptions: the default client's options are those of a
// user who gives the address alone, whatever pool or timeout the run has.
func TestDefaultClientOptions(t *testing.T) {
	if got, want := DefaultClient.options("127.0.0.1:1", 256, false), (&redis.Options{Addr: "127.0.0.1:1"}); !reflect.DeepEqual(got, want) {
		t.Errorf("default options %+v, want %+v", got, want)
	}
	if got, want := DefaultClient.clusterOptions([]string{"a:1", "b:2"}, 256, false), (&redis.ClusterOptions{Addrs: []string{"a:1", "b:2"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("default cluster options %+v, want %+v", got, want)
	}
	for _, c := range []Client{"", PoolClient} {
		if o := c.options("127.0.0.1:1", 256, true); o.PoolSize != 256 || !o.ContextTimeoutEnabled {
			t.Errorf("client %q: pool %d, ContextTimeoutEnabled %v; want 256, true", c, o.PoolSize, o.ContextTimeoutEnabled)
		}
	}
}

// TestDefaultClientRefusesContextTimeout: -client default with
// -ctxtimeout is refused before anything runs, in the program and in a
// throughput process.
func TestDefaultClientRefusesContextTimeout(t *testing.T) {
	cfg := QuickConfig()
	cfg.Client, cfg.ContextTimeout = DefaultClient, true
	if _, err := Run(context.Background(), &Server{Addr: "127.0.0.1:1"}, cfg); !errors.Is(err, ErrDefaultClientTimeout) {
		t.Errorf("Run: %v, want %v", err, ErrDefaultClientTimeout)
	}
	spec := SliceSpec{Addr: "127.0.0.1:1", Contender: "ratewindow sliding-log", Goroutines: 1, Keys: 1, For: time.Millisecond,
		Client: DefaultClient, ContextTimeout: true}
	if _, err := MeasureSlice(context.Background(), spec); !errors.Is(err, ErrDefaultClientTimeout) {
		t.Errorf("MeasureSlice: %v, want %v", err, ErrDefaultClientTimeout)
	}
	spec.Client, spec.ContextTimeout = "64", false
	if _, err := MeasureSlice(context.Background(), spec); err == nil || !strings.Contains(err.Error(), `client "64"`) {
		t.Errorf("MeasureSlice with client 64: %v, want it refused", err)
	}
}

// TestMeasureSliceClientPool: a throughput process's client has the run's
// pool, or go-redis's default pool at the client's defaults (10 a CPU),
// and decides with either.
func TestMeasureSliceClientPool(t *testing.T) {
	srv := testServer(t)
	for _, c := range []struct {
		client Client
		pool   int
	}{{PoolClient, 7}, {DefaultClient, 10 * runtime.GOMAXPROCS(0)}} {
		s, err := MeasureSlice(context.Background(), SliceSpec{
			Addr: srv.Addr, Contender: "ratewindow sliding-log", Goroutines: 2, Keys: 100, PoolSize: 7, Client: c.client,
			Count: throughputCount, Window: throughputWindow, Warm: 20 * time.Millisecond, For: 100 * time.Millisecond, ResetStat: true,
		})
		if err != nil {
			t.Fatalf("%s: %v", c.client, err)
		}
		if s.Pool != c.pool || s.Decisions == 0 || s.Admitted+s.Errors != s.Decisions {
			t.Errorf("%s: pool %d, %d decisions, %d admitted, %d failed; want pool %d, every decision admitted",
				c.client, s.Pool, s.Decisions, s.Admitted, s.Errors, c.pool)
		}
	}
}

// TestMarkdownDefaultClient: a run at the client's defaults says so, with
// the pool go-redis gave the processes, where a run with the pool names
// its size.
func TestMarkdownDefaultClient(t *testing.T) {
	r := testReport()
	for i := range r.Throughput {
		r.Throughput[i].Rounds[0].Pool = 20
	}
	var b bytes.Buffer
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	if md := b.String(); !strings.Contains(md, "a pool of 1 connections in every setting") || strings.Contains(md, "default pool") {
		t.Errorf("the pool's run does not name its pool:\n%s", md)
	}
	r.Config.Client = DefaultClient
	b.Reset()
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	if md, want := b.String(), "`redis.NewClient(&redis.Options{Addr: addr})`, on the Cluster `redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})`, so go-redis's default pool (20 connections) and no ContextTimeoutEnabled"; !strings.Contains(md, want) {
		t.Errorf("Markdown lacks %q:\n%s", want, md)
	}
}

func TestParseBuild(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "rwbench")
	plain := filepath.Join(dir, "notes")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ParseBuild("old=" + exe); err != nil || b != (Build{Label: "old", Binary: exe}) {
		t.Errorf("ParseBuild: %+v, %v", b, err)
	}
	for s, want := range map[string]string{
		"old":                "want LABEL=BINARY",
		"=" + exe:            "want LABEL=BINARY",
		"old=":               "want LABEL=BINARY",
		"old=" + dir + "/no": "no such file",
		"old=" + plain:       "not an executable file",
		"old=" + dir:         "not an executable file",
	} {
		if _, err := ParseBuild(s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseBuild(%q): %v, want %q", s, err, want)
		}
	}
}

// TestBuildRunsBeside: another build's contenders are ratewindow's alone,
// run by that build's binary under the name it knows them by, in the same
// rounds; a binary that reports no pool (a build from before -client) is
// refused; and a run with another build measures the throughput only.
func TestBuildRunsBeside(t *testing.T) {
	dir := t.TempDir()
	args := filepath.Join(dir, "args")
	exe := filepath.Join(dir, "rwbench")
	script := "#!/bin/sh\necho \"$2\" >> " + args + "\necho '{\"Decisions\":10,\"Admitted\":10,\"Elapsed\":1000000000,\"Pool\":%d}'\n"
	if err := os.WriteFile(exe, []byte(fmt.Sprintf(script, 20)), 0o755); err != nil {
		t.Fatal(err)
	}
	b := Build{Label: "old", Binary: exe}
	cs := b.contenders(Contenders())
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	want := []string{"ratewindow sliding-log @old", "ratewindow sliding-buckets @old", "ratewindow sliding-counter @old"}
	if !slices.Equal(names, want) {
		t.Fatalf("the build's contenders %v, want %v", names, want)
	}

	cfg := QuickConfig()
	cfg.Goroutines, cfg.Keys, cfg.Rounds, cfg.Client = []int{1}, []int{1}, 1, DefaultClient
	rep := &Report{Contenders: cs}
	if err := (grid{addr: "127.0.0.1:1", goroutines: cfg.Goroutines}).run(context.Background(), &cfg, rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Throughput) != 3 || rep.Throughput[0].Contender != want[0] || rep.Throughput[0].Rounds[0].Decisions != 10 {
		t.Errorf("throughput %+v", rep.Throughput)
	}
	got, err := os.ReadFile(args)
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	for _, line := range strings.Split(strings.TrimSpace(string(got)), "\n") {
		var spec SliceSpec
		if err := json.Unmarshal([]byte(line), &spec); err != nil {
			t.Fatalf("the child's -slice-child %q: %v", line, err)
		}
		if spec.Client != DefaultClient {
			t.Errorf("the build was asked for client %q", spec.Client)
		}
		asked = append(asked, spec.Contender)
	}
	if want := []string{"ratewindow sliding-log", "ratewindow sliding-buckets", "ratewindow sliding-counter"}; !slices.Equal(asked, want) {
		t.Errorf("the build was asked for %v, want %v", asked, want)
	}

	if err := os.WriteFile(exe, []byte(fmt.Sprintf(script, 0)), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := runChild(context.Background(), exe, SliceSpec{Contender: "ratewindow sliding-log"}); err == nil || !strings.Contains(err.Error(), "no pool size") {
		t.Errorf("a child without a pool: %v, want it refused", err)
	}

	cfg = QuickConfig()
	cfg.Builds = []Build{b}
	if _, err := Run(context.Background(), testServer(t), cfg); err == nil || !strings.Contains(err.Error(), "throughput grid only") {
		t.Errorf("Run with another build, every measurement: %v, want it refused", err)
	}
}
