package bench

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"runtime"
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
