package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestMeasureSliceOnCluster starts a Cluster of three masters and measures
// a short slice of contenders through their cluster clients, on keys that
// spread over every master: one call a decision, summed over the masters,
// and the server's CPU read from all of them. A contender without a
// cluster client is refused with its reason.
func TestMeasureSliceOnCluster(t *testing.T) {
	requireRedis(t)
	ctx := context.Background()
	cl, err := StartCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if len(cl.Addrs) != clusterMasters {
		t.Fatalf("%d masters, want %d", len(cl.Addrs), clusterMasters)
	}
	// every master holds a third of the slots
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	defer cc.Close()
	shards, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	slots := 0
	for _, s := range shards {
		slots += s.End - s.Start + 1
	}
	if len(shards) != clusterMasters || slots != clusterSlots {
		t.Fatalf("CLUSTER SLOTS: %d ranges, %d slots; want %d, %d", len(shards), slots, clusterMasters, clusterSlots)
	}
	for _, c := range []struct {
		name   string
		merges bool // may merge decisions into one call
	}{{"ratewindow sliding-log", true}, {"ulule/limiter v3", false}, {"plain sliding log, rueidis", false}} {
		name := c.name
		s, err := MeasureSlice(ctx, SliceSpec{
			Cluster: cl.Addrs, Contender: name, Goroutines: 4, Keys: 1000, PoolSize: 4,
			Count: throughputCount, Window: throughputWindow, Warm: 20 * time.Millisecond, For: 100 * time.Millisecond, ResetStat: true,
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Decisions == 0 || s.Admitted+s.Errors != s.Decisions {
			t.Errorf("%s: %d decisions, %d admitted, %d failed: want all admitted", name, s.Decisions, s.Admitted, s.Errors)
		}
		// a call a decision (at most, where a client merges), counted on
		// every master: one master alone would count about a third
		if lo := s.Decisions - s.Errors; s.Call.Calls > s.Decisions+s.Errors || !c.merges && s.Call.Calls < lo || s.Call.Calls == 0 {
			t.Errorf("%s: %d calls for %d decisions (%d failed)", name, s.Call.Calls, s.Decisions, s.Errors)
		}
		if s.RedisCPU <= 0 {
			t.Errorf("%s: Redis CPU %v", name, s.RedisCPU)
		}
	}
	_, err = MeasureSlice(ctx, SliceSpec{Cluster: cl.Addrs, Contender: "go-chi/httprate-redis", Goroutines: 1, Keys: 1, For: time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), httprateNoCluster) {
		t.Errorf("httprate-redis on a Cluster: %v, want its reason", err)
	}
}
