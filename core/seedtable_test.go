package core

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// seedTableEnv runs the full seed table when set to 1.
const seedTableEnv = "RATEWINDOW_SEED_TABLE"

// seedRows are the rows of the seed's table: what others published for
// this design (a sorted-set reservation, one round trip, one sleep).
var seedRows = []throttleRun{
	{window: time.Second, limit: 200, replicas: 3, callers: 2000},
	{window: time.Second, limit: 50, replicas: 3, callers: 1000},
	{window: 5 * time.Second, limit: 100, replicas: 3, callers: 500},
	{window: time.Second, limit: 1, replicas: 3, callers: 10},
}

// quickRows run in every test run, through the same code, in about a second.
var quickRows = []throttleRun{
	{window: 500 * time.Millisecond, limit: 20, replicas: 3, callers: 20},
	{window: 100 * time.Millisecond, limit: 1, replicas: 3, callers: 3},
}

// TestSeedTable reproduces the seed's table on real Redis; it takes about
// 4 minutes, so it runs only with RATEWINDOW_SEED_TABLE=1. Per row,
// replicas Limiters on their own clients, callers goroutines each, all call
// Wait at once on one sliding-log key. It prints a Markdown table (go test
// -v).
//
// Asserted for every row: no failure, one script call per Wait, every unit
// in the Redis log once, no window of exactly Window over the limit in the
// log (the server's times of the units: exact), and no caller starting
// before its slot. Reported besides: the most callers' own start times in
// a window of Window minus startTolerance, and "lateness", how long after
// their slots callers started (the i-th start against the i-th slot). A
// caller starts late when its reply waits for a CPU, as in the first
// burst of thousands of goroutines on a small machine; late starts can
// bunch up, which no reservation can undo, so the starts column is
// reported here and asserted only in TestWaitReplicas. "worst stall" is
// the latest a 1ms timer of the test process fired during the row (see
// stall.Meter): the machine's own noise.
func TestSeedTable(t *testing.T) {
	if os.Getenv(seedTableEnv) != "1" {
		t.Skipf("the seed's rows take about 4 minutes; run them with\n\t%s=1 go test -race -run 'TestSeedTable$' -v -timeout 20m ./core/", seedTableEnv)
	}
	runSeedTable(t, seedRows)
}

// TestSeedTableQuick runs small rows through the code of TestSeedTable in
// every test run.
func TestSeedTableQuick(t *testing.T) { runSeedTable(t, quickRows) }

func runSeedTable(t *testing.T, rows []throttleRun) {
	var done []throttleRun
	for _, row := range rows {
		name := fmt.Sprintf("%s/%d/%dx%d", row.window, row.limit, row.replicas, row.callers)
		t.Run(name, func(t *testing.T) {
			r := runThrottle(t, row)
			r.check(t)
			done = append(done, r)
		})
	}
	table := seedTable(done)
	if testing.Verbose() {
		fmt.Print("\n" + table + "\n")
	} else {
		t.Log("\n" + table)
	}
}

// seedTable formats runs as a Markdown table.
func seedTable(runs []throttleRun) string {
	var b strings.Builder
	b.WriteString("| window | limit | replicas | callers each | successes | failures | script calls per Wait | slots given back or moved | mean wait | max per window (Redis log) | max per window − 50ms (caller starts) | lateness p50 / max | worst stall | wall | ideal wall |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		total := r.replicas * r.callers
		groups := (int64(total) + r.limit - 1) / r.limit
		ideal := time.Duration(groups-1) * r.window
		perWait := 0.0
		if r.successes > 0 {
			perWait = float64(r.scriptCalls) / float64(r.successes)
		}
		late := r.lateness()
		p50, worst := time.Duration(0), time.Duration(0)
		if len(late) > 0 {
			p50, worst = late[len(late)/2], late[len(late)-1]
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %.2f | %d | %s | %d | %d | %s / %s | %s | %s | %s |\n",
			r.window, r.limit, r.replicas, r.callers, r.successes, r.failures, perWait, r.releases,
			r.meanWait.Round(time.Millisecond),
			maxInWindow(r.reserved, micros(r.window)), maxInWindow(r.starts, micros(r.window-startTolerance)),
			p50.Round(100*time.Microsecond), worst.Round(100*time.Microsecond), r.stalls.Finish().Round(100*time.Microsecond), r.wall.Round(time.Millisecond), ideal)
	}
	return b.String()
}
