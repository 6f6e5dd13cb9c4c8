package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/core/internal/storetest"
)

// TestBatchRunsMatchAlone sends random batches of decisions as merged
// script calls (allow_batch.lua), and the same decisions one by one
// (allow.lua) under another prefix, and wants the same answers. The
// batches hold runs: decisions one after another that ask the same of one
// key at one time, which the merged call answers together (see decide in
// algorithms.lua). The decisions cover the three algorithms alone and
// together, units of 1 to 3, Peeks, penalties (which end a run), limits
// of many units (the sorted log), and times that stay, move a
// little, or jump past a window. Every key keeps a TTL.
func TestBatchRunsMatchAlone(t *testing.T) {
	forSeeds(t, 3, checkRunsAgainstAlone)
}

func checkRunsAgainstAlone(t *testing.T, rdb redis.Scripter, seed uint64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 11))
	prefix := uniquePrefix(t)
	merged := New(rdb, prefix+"m:")
	alone := New(rdb, prefix+"a:")
	// Windows long enough that Redis never expires a key by its own clock
	// while the units it holds still count by the test's, which moves far
	// faster.
	specs := [][]store.Limit{
		{per(9, time.Minute)},
		{with(per(25, time.Minute), store.SlidingBuckets)},
		{with(per(12, time.Minute), store.SlidingCounter)},
		{per(400, time.Minute)}, // the sorted log
		{per(6, 30*time.Second), with(per(40, time.Hour), store.SlidingCounter), with(per(30, time.Hour), store.SlidingBuckets)},
		{with(per(200, time.Minute), store.SlidingBuckets), per(15, time.Minute)},
	}
	penalty := store.Penalty{Denials: 3, Within: time.Minute, Ban: 20 * time.Second}
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
		var qs []store.Request
		for len(qs) < 2+rng.IntN(30) {
			if len(qs) > 0 && rng.IntN(10) < 7 { // the run goes on
				q := qs[len(qs)-1]
				if rng.IntN(20) == 0 {
					q.Now++ // ends it: another time
				}
				qs = append(qs, q)
				continue
			}
			q := store.Request{Key: fmt.Sprint("k", rng.IntN(3)), N: int64(1 + rng.IntN(3)),
				Limits: specs[rng.IntN(len(specs))], Commit: rng.IntN(10) > 0, Now: now}
			if rng.IntN(8) == 0 {
				q.Penalty = penalty
			}
			qs = append(qs, q)
		}
		allowed := make([]bool, len(qs))
		for i, o := range allowBatch(merged, qs) {
			if o.err != nil {
				t.Fatalf("step %d decision %d: %v", step, i, o.err)
			}
			got := o.d
			want, err := alone.Allow(ctx, qs[i])
			if err != nil {
				t.Fatal(err)
			}
			if !storetest.Same(got, want, len(qs[i].Limits)) {
				t.Fatalf("step %d decision %d of %d (%s, n %d, %v): merged %s, alone %s",
					step, i, len(qs), qs[i].Key, qs[i].N, qs[i].Limits, answer(got, len(qs[i].Limits)), answer(want, len(qs[i].Limits)))
			}
			// the runs decide answers together: the same as the decision
			// before, committed, without penalty
			if i > 0 && sameDecision(qs[i-1], qs[i]) && qs[i].Commit && qs[i].Penalty.Denials == 0 {
				runs++
				switch {
				case got.Allowed && allowed[i-1]:
					admittedInRuns++
				case !got.Allowed && allowed[i-1]:
					deniedAfterAdmitted++
				}
			}
			allowed[i] = got.Allowed
		}
	}
	t.Logf("%d decisions in runs: %d admitted after an admitted one, %d denied after one", runs, admittedInRuns, deniedAfterAdmitted)
	if admittedInRuns < 100 || deniedAfterAdmitted < 20 {
		t.Fatalf("runs: %d admitted after an admitted one, %d denied after one; want more", admittedInRuns, deniedAfterAdmitted)
	}
	requireTTLs(t, rdb, prefix+"m:", prefix+"a:")
}

// sameDecision reports whether a and b ask the same of the same key at the
// same time.
func sameDecision(a, b store.Request) bool {
	return a.Key == b.Key && a.N == b.N && a.Now == b.Now && a.Commit == b.Commit &&
		a.Penalty == b.Penalty && slices.Equal(a.Limits, b.Limits)
}
