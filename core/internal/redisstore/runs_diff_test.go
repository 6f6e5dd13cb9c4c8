package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestBatchRunsMatchAlone sends random batches of decisions as merged
// script calls (allow_batch.lua), and the same decisions one by one
// (allow.lua) under another prefix, and wants the same answers. The
// batches hold runs: decisions one after another that ask the same of one
// key at one time, which the merged call answers together (see decide in
// algorithms.lua). The decisions cover the three algorithms alone and
// together, units of 1 to 3, Peeks, penalties (which end a run), limits
// of many units (the log's ring layout), and times that stay, move a
// little, or jump past a window. Every key keeps a TTL.
func TestBatchRunsMatchAlone(t *testing.T) {
	for _, server := range diffServers(3) {
		t.Run(server.name, func(t *testing.T) {
			rdb := server.new(t)
			for seed := range server.seeds {
				t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
					t.Parallel()
					checkRunsAgainstAlone(t, rdb, seed)
				})
			}
		})
	}
}

func checkRunsAgainstAlone(t *testing.T, rdb redis.Scripter, seed uint64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 11))
	prefix := uniquePrefix(t)
	merged := newRedisStore(rdb, prefix+"m:", 0)
	alone := newRedisStore(rdb, prefix+"a:", 0)
	// Windows long enough that Redis never expires a key by its own clock
	// while the units it holds still count by the test's, which moves far
	// faster.
	specs := [][]Limit{
		{Per(9, time.Minute)},
		{Per(25, time.Minute).With(SlidingBuckets)},
		{Per(12, time.Minute).With(SlidingCounter)},
		{Per(400, time.Minute)}, // the ring layout
		{Per(6, 30*time.Second), Per(40, time.Hour).With(SlidingCounter), Per(30, time.Hour).With(SlidingBuckets)},
		{Per(200, time.Minute).With(SlidingBuckets), Per(15, time.Minute)},
	}
	penalty := &Penalty{Denials: 3, Within: time.Minute, Ban: 20 * time.Second}
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixMicro()
	var runs, admittedInRuns, deniedAfterAdmitted int
	for step := range 250 {
		switch r := rng.IntN(10); {
		case r < 4: // the same time
		case r < 9:
			now += rng.Int64N(5_000_000)
		default: // past a window
			now += int64(time.Hour / time.Microsecond)
		}
		var qs []*query
		for len(qs) < 2+rng.IntN(30) {
			if len(qs) > 0 && rng.IntN(10) < 7 { // the run goes on
				q := *qs[len(qs)-1]
				if rng.IntN(20) == 0 {
					q.now++ // ends it: another time
				}
				qs = append(qs, &q)
				continue
			}
			q := &query{key: fmt.Sprint("k", rng.IntN(3)), n: int64(1 + rng.IntN(3)),
				limits: specs[rng.IntN(len(specs))], commit: rng.IntN(10) > 0, now: now}
			if rng.IntN(8) == 0 {
				q.penalty = penalty
			}
			qs = append(qs, q)
		}
		calls := make([]*call, len(qs))
		for i, q := range qs {
			calls[i] = merged.allowCall(q)
			calls[i].ctx = ctx
		}
		merged.t.send(calls)
		for i, c := range calls {
			<-c.done
			if c.err != nil {
				t.Fatalf("step %d decision %d: %v", step, i, c.err)
			}
			got := *qs[i]
			if err := parseAllow(c.reply, &got); err != nil {
				t.Fatal(err)
			}
			want := *qs[i]
			want.states = nil
			if err := alone.allow(ctx, &want); err != nil {
				t.Fatal(err)
			}
			if !sameAnswer(&got, &want) {
				t.Fatalf("step %d decision %d of %d (%s, n %d, %v): merged %s, alone %s",
					step, i, len(qs), qs[i].key, qs[i].n, qs[i].limits, answer(&got), answer(&want))
			}
			// the runs decide answers together: the same as the decision
			// before, committed, without penalty
			if i > 0 && sameDecision(qs[i-1], qs[i]) && qs[i].commit && qs[i].penalty == nil {
				runs++
				switch {
				case got.allowed && qs[i-1].allowed:
					admittedInRuns++
				case !got.allowed && qs[i-1].allowed:
					deniedAfterAdmitted++
				}
			}
			qs[i].allowed = got.allowed
		}
	}
	t.Logf("%d decisions in runs: %d admitted after an admitted one, %d denied after one", runs, admittedInRuns, deniedAfterAdmitted)
	if admittedInRuns < 100 || deniedAfterAdmitted < 20 {
		t.Fatalf("runs: %d admitted after an admitted one, %d denied after one; want more", admittedInRuns, deniedAfterAdmitted)
	}
	for _, p := range []string{prefix + "m:", prefix + "a:"} {
		keys, err := rdb.(redis.UniversalClient).Keys(ctx, p+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if ttl := rdb.(redis.UniversalClient).PTTL(ctx, k).Val(); ttl <= 0 {
				t.Fatalf("%s has TTL %v", k, ttl)
			}
		}
	}
}

// sameDecision reports whether a and b ask the same of the same key at the
// same time.
func sameDecision(a, b *query) bool {
	return a.key == b.key && a.n == b.n && a.now == b.now && a.commit == b.commit &&
		a.penalty == b.penalty && slices.Equal(a.limits, b.limits)
}
