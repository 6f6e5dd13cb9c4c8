package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func ExampleWorstWindow() {
	ms := int64(time.Millisecond)
	// three calls inside one second, a fourth one a second later, and one
	// whose call straddles the window's start (it may have been admitted
	// before the window began, so it is not counted)
	starts := []int64{0, 100 * ms, 500 * ms, 1500 * ms, 890 * ms}
	ends := []int64{10 * ms, 110 * ms, 510 * ms, 1510 * ms, 1100 * ms}
	fmt.Println(WorstWindow(starts, ends, 1000*ms))
	// Output: 3
}

func TestWorstWindow(t *testing.T) {
	cases := []struct {
		name   string
		starts []int64
		ends   []int64
		w      int64
		worst  int
	}{
		{"empty", nil, nil, 10, 0},
		{"one", []int64{1}, []int64{2}, 10, 1},
		{"all in one window", []int64{0, 1, 2, 3}, []int64{1, 2, 3, 4}, 10, 4},
		{"spread", []int64{0, 5, 10, 15, 20}, []int64{1, 6, 11, 16, 21}, 10, 2},
		{"a long call is never certain", []int64{0, 2}, []int64{20, 3}, 10, 1},
		{"equal ends", []int64{1, 2, 3}, []int64{5, 5, 5}, 10, 3},
		{"window is half open at its start", []int64{0, 10}, []int64{0, 10}, 10, 1},
	}
	for _, c := range cases {
		if got := WorstWindow(c.starts, c.ends, c.w); got != c.worst {
			t.Errorf("%s: got %d, want %d", c.name, got, c.worst)
		}
	}
}

func TestHistQuantile(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, 1000 * time.Microsecond}} {
		got := h.quantile(c.q)
		if got < c.want || float64(got) > float64(c.want)*1.04 {
			t.Errorf("q%.2f: got %v, want %v within 4%%", c.q, got, c.want)
		}
	}
	for i := range histBuckets {
		if v := histValue(i); i > 0 && histIndex(v) != i {
			t.Fatalf("bucket %d: upper bound %d maps to bucket %d", i, v, histIndex(v))
		}
	}
}

func testReport() *Report {
	cfg := QuickConfig()
	cfg.Goroutines, cfg.Keys, cfg.ClusterGoroutines, cfg.MemKeys = []int{1}, []int{1}, nil, MinMemKeys
	r := &Report{Config: cfg, Redis: "7.0", Go: "go", CPUs: 2, Started: time.Unix(0, 0), Took: time.Second}
	r.Contenders = []Contender{{Name: "ours <a&b>"}, {Name: "peer", Peer: true}}
	r.Throughput = []Throughput{
		{Contender: "ours <a&b>", Goroutines: 1, Keys: 1, Rounds: []Slice{{Decisions: 3000, Admitted: 3000, Elapsed: time.Second, Mallocs: 3000, RedisCPU: 9 * time.Millisecond,
			Call: Call{Name: "FCALL", Calls: 3000, Usec: 42000}, Inside: []CommandStat{{"set", 3000, 3000}, {"get", 6000, 1500}}}}},
		{Contender: "peer", Goroutines: 1, Keys: 1, Rounds: []Slice{{Decisions: 1000, Admitted: 990, Elapsed: time.Second, RedisCPU: 6 * time.Millisecond, Call: Call{Name: "EVALSHA", Calls: 1000, Usec: 5000}}}},
	}
	r.Admission = []Admission{{Contender: "ours <a&b>", Worst: 100}, {Contender: "peer", Worst: 199}}
	r.Memory = []Memory{{Contender: "ours <a&b>", PerKey: 60, PerKeyOne: 50}, {Contender: "peer", PerKey: 120, PerKeyOne: 110}}
	r.Deny = []Deny{{Goroutines: 1, On: Slice{Decisions: 500, Elapsed: time.Second}, Off: Slice{Decisions: 10, Elapsed: time.Second}}}
	return r
}

func TestMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := testReport().Markdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| ours <a&b> | 3,000 (3.00×) |",
		"| peer | 1,000 (1.00×) |",
		"| ours <a&b> | 3,000 | 3.00× | 0 ns | 0 ns | 1.0 | 0.0 | 3.0 | 14.00 | 1.0 | 0 | 0 |",
		"| peer | 1,000 | 1.00× | 0 ns | 0 ns | 0.0 | 0.0 | 6.0 | 5.00 | 1.0 | 10 | 0 |",
		"| ours <a&b> | 3.0 (0.50×) |",
		"| ours <a&b> | FCALL | 14.00 | 1.0 | SET 1.00, GET ×2 0.50 | 1.50 | 12.50 |",
		"| peer | EVALSHA | 5.00 | 1.0 | — | 0.00 | 5.00 |",
		"One round: each figure is that round's.",
		"| 1 | 500 | 10 | 50.00× | 0.0 |",
		"| peer |  | 199 |",
		"| ours <a&b> | 60.0 | 0.50× | 50.0 | 0 |",
		Command,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Markdown lacks %q:\n%s", want, b.String())
		}
	}
}

// tables returns the Markdown tables of md: each its header line and its
// rows.
func tables(md string) (headers []string, rows [][]string) {
	lines := strings.Split(md, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "|") || !strings.HasPrefix(lines[i+1], "|--") {
			continue
		}
		headers = append(headers, lines[i])
		var body []string
		for i += 2; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
			body = append(body, lines[i])
		}
		rows = append(rows, body)
	}
	return headers, rows
}

// TestMarkdownPrintsOnlyWhatRan: every table printed has rows, and a run of
// one part (the flood alone, the throughput alone, a quick run without
// memory) prints that part's sections and no other.
func TestMarkdownPrintsOnlyWhatRan(t *testing.T) {
	full := testReport()
	flood := &Report{Config: FullConfig(), Redis: "7.0", Go: "go", CPUs: 2, Started: time.Unix(0, 0), Took: time.Second,
		Contenders: full.Contenders, Flood: []Flood{{Contender: "ratewindow sliding-log", Worst: 100, Admitted: 200, Decisions: 1000, For: time.Second}}}
	flood.Config.FloodOnly = true
	speed := testReport()
	speed.Admission, speed.Deny, speed.Memory = nil, nil, nil
	quick := testReport()
	quick.Memory, quick.MemoryNote = nil, "not measured: a quick run"
	cases := []struct {
		name     string
		r        *Report
		sections []string // the "## " headings, in order
	}{
		{"full", full, []string{"Contenders", "Decisions per second (median)", "Redis CPU µs a decision (median)",
			"Redis's own time a call, 1 goroutine(s) (INFO commandstats)", "Hot denied key: ratewindow's deny cache",
			"Worst count in one 1 s window (limit 100 per second)", "Redis memory per key"}},
		{"flood only", flood, []string{"Flood: 3 replicas hit one key"}},
		{"throughput only", speed, []string{"Contenders", "Decisions per second (median)", "Redis CPU µs a decision (median)",
			"Redis's own time a call, 1 goroutine(s) (INFO commandstats)"}},
		{"quick, no memory", quick, []string{"Contenders", "Decisions per second (median)", "Redis CPU µs a decision (median)",
			"Redis's own time a call, 1 goroutine(s) (INFO commandstats)", "Hot denied key: ratewindow's deny cache",
			"Worst count in one 1 s window (limit 100 per second)", "Redis memory per key"}},
	}
	for _, c := range cases {
		var b bytes.Buffer
		if err := c.r.Markdown(&b); err != nil {
			t.Fatal(err)
		}
		md := b.String()
		var sections []string
		for _, line := range strings.Split(md, "\n") {
			if h, ok := strings.CutPrefix(line, "## "); ok {
				sections = append(sections, h)
			}
		}
		if !slices.Equal(sections, c.sections) {
			t.Errorf("%s: sections %q, want %q", c.name, sections, c.sections)
		}
		headers, rows := tables(md)
		for i, h := range headers {
			if len(rows[i]) == 0 {
				t.Errorf("%s: an empty table: %s\n%s", c.name, h, md)
			}
		}
	}
}

// TestMarkdownMemoryNoise: a memory figure of 0 or less (the server's own
// churn, larger than the keys' memory) is printed as —, never as a number,
// and is no ratio's base.
func TestMarkdownMemoryNoise(t *testing.T) {
	r := testReport()
	r.Contenders = append(r.Contenders, Contender{Name: "small peer", Peer: true})
	r.Memory = []Memory{
		{Contender: "ours <a&b>", PerKey: 163.1, PerKeyOne: 149},
		{Contender: "peer", PerKey: 120, PerKeyOne: 130.4},
		{Contender: "small peer", PerKey: -54, PerKeyOne: 0},
	}
	var b bytes.Buffer
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"| ours <a&b> | 163.1 | 1.36× | 149.0 | 0 |",
		"| peer | 120.0 | 1.00× | 130.4 | 0 |",
		"| small peer | — | — | — | 0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "-54") {
		t.Errorf("Markdown prints the negative figure:\n%s", md)
	}
}

// TestMarkdownCluster: the Cluster's settings come after the server's, in
// both summaries, with a contender that cannot run on a Cluster shown as —
// there and named in the text with its reason.
func TestMarkdownCluster(t *testing.T) {
	r := testReport()
	r.Config.ClusterGoroutines = []int{64}
	r.Contenders = append(r.Contenders, Contender{Name: "single only", Peer: true, NoCluster: "it takes a *redis.Client"})
	sl := func(n int64, cpu time.Duration) []Slice {
		return []Slice{{Decisions: n, Admitted: n, Elapsed: time.Second, RedisCPU: cpu}}
	}
	r.Throughput = append(r.Throughput,
		Throughput{Contender: "single only", Goroutines: 1, Keys: 1, Rounds: sl(500, 5*time.Millisecond)},
		Throughput{Contender: "ours <a&b>", Goroutines: 64, Keys: 1, Cluster: true, Rounds: sl(150_000, 300*time.Millisecond)},
		Throughput{Contender: "peer", Goroutines: 64, Keys: 1, Cluster: true, Rounds: sl(100_000, 400*time.Millisecond)},
	)
	var b bytes.Buffer
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"| contender | 1 goroutine(s), 1 hot key | 64 goroutine(s), 1 hot key, Cluster of 3 |",
		"| ours <a&b> | 3,000 (3.00×) | 150,000 (1.50×) |",
		"| single only | 500 (0.50×) | — |",
		"| ours <a&b> | 3.0 (0.50×) | 2.0 (0.50×) |",
		"| peer | 6.0 (1.00×) | 4.0 (1.00×) |",
		"### 64 goroutine(s), 1 hot key, Cluster of 3 (baseline: peer)",
		"| ours <a&b> | 150,000 | 1.50× | 0 ns | 0 ns | 0.0 | 0.0 | 2.0 | 0.00 | 0.0 | 0 | 0 |",
		"single only is not among them: it takes a *redis.Client.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	if b, ok := r.Baseline(64, 1, true); !ok || b.Contender != "peer" {
		t.Errorf("Cluster baseline %+v %v", b, ok)
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	var b bytes.Buffer
	if err := testReport().SVG(&b); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	texts := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "text" {
			texts++
		}
	}
	if texts != 2+2*2*2+1 { // titles, names and labels of 2 bars in 2 panels, the limit
		t.Errorf("SVG has %d text elements", texts)
	}
}

func TestBaselineIsTheFastestPeer(t *testing.T) {
	r := testReport()
	r.Contenders = append(r.Contenders, Contender{Name: "fast peer", Peer: true})
	r.Throughput = append(r.Throughput, Throughput{Contender: "fast peer", Goroutines: 1, Keys: 1, Rounds: []Slice{{Decisions: 2000, Elapsed: time.Second}}})
	if b, ok := r.Baseline(1, 1, false); !ok || b.Contender != "fast peer" {
		t.Fatalf("baseline %+v %v", b, ok)
	}
	r.Config.Baseline = "peer"
	if b, ok := r.Baseline(1, 1, false); !ok || b.Contender != "peer" {
		t.Fatalf("named baseline %+v %v", b, ok)
	}
}

func TestMedianAndSpread(t *testing.T) {
	sl := func(n ...int64) Throughput {
		var tp Throughput
		for _, d := range n {
			tp.Rounds = append(tp.Rounds, Slice{Decisions: d, Elapsed: time.Second})
		}
		return tp
	}
	cases := []struct {
		name         string
		t            Throughput
		med, lo, hi  float64
		formatted    string
		perSecondMed float64
	}{
		{"none", sl(), 0, 0, 0, "0", 0},
		{"one round has no spread", sl(7), 7, 7, 7, "7", 7},
		{"odd", sl(30, 10, 20), 20, 10, 30, "20 (10–30)", 20},
		{"even: the mean of the middle two", sl(40, 10, 20, 30), 25, 10, 40, "25 (10–40)", 25},
	}
	for _, c := range cases {
		med, lo, hi := c.t.Median(Slice.PerSecond)
		if med != c.med || lo != c.lo || hi != c.hi {
			t.Errorf("%s: Median = %v, %v, %v; want %v, %v, %v", c.name, med, lo, hi, c.med, c.lo, c.hi)
		}
		if got := spread(c.t, Slice.PerSecond, count); got != c.formatted {
			t.Errorf("%s: spread = %q, want %q", c.name, got, c.formatted)
		}
		if got := c.t.PerSecond(); got != c.perSecondMed {
			t.Errorf("%s: PerSecond = %v, want %v", c.name, got, c.perSecondMed)
		}
	}
}

func TestDurationUnits(t *testing.T) {
	cases := []struct {
		med, lo, hi float64
		spread      bool
		want        string
	}{
		{500, 400, 600, true, "500 ns (400–600)"},
		{41_000, 39_400, 52_600, true, "41 µs (39–53)"},
		{41_000, 0, 0, false, "41 µs"},
		{1_210_000, 900_000, 5_110_000, true, "1.21 ms (0.90–5.11)"},
	}
	for _, c := range cases {
		if got := durNs(c.med, c.lo, c.hi, c.spread); got != c.want {
			t.Errorf("durNs(%v, %v, %v) = %q, want %q", c.med, c.lo, c.hi, got, c.want)
		}
	}
}

const commandStatsInfo = "# Commandstats\r\n" +
	"cmdstat_fcall:calls=10,usec=150,usec_per_call=15.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_get:calls=20,usec=10,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_config|resetstat:calls=1,usec=30,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_info:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_time:calls=10,usec=2,usec_per_call=0.20,rejected_calls=0,failed_calls=0\r\n"

func TestParseCommandStats(t *testing.T) {
	got, err := parseCommandStats(commandStatsInfo)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]CommandStat{
		"fcall":            {"fcall", 10, 150},
		"get":              {"get", 20, 10},
		"config|resetstat": {"config|resetstat", 1, 30},
		"info":             {"info", 3, 90},
		"time":             {"time", 10, 2},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %+v, want %+v", k, got[k], w)
		}
	}
	for _, bad := range []string{"cmdstat_get\r\n", "cmdstat_get:calls=x,usec=1\r\n", "cmdstat_get:usec=1\r\n"} {
		if _, err := parseCommandStats(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSplitCall(t *testing.T) {
	before := map[string]CommandStat{"fcall": {"fcall", 4, 60}, "info": {"info", 1, 30}}
	after := map[string]CommandStat{
		"fcall": {"fcall", 14, 210}, "get": {"get", 20, 10}, "time": {"time", 10, 2},
		"info": {"info", 3, 90}, "config|resetstat": {"config|resetstat", 1, 30}, "set": {"set", 0, 0},
	}
	delta := commandDelta(before, after)
	call, inside := splitCall(delta, nil, "")
	if want := (Call{Name: "FCALL", Calls: 10, Usec: 150}); call != want {
		t.Errorf("script call: got %+v, want %+v", call, want)
	}
	if want := []CommandStat{{"get", 20, 10}, {"time", 10, 2}}; !slices.Equal(inside, want) {
		t.Errorf("inside the script: got %+v, want %+v", inside, want)
	}
	tx := map[string]CommandStat{
		"exec": {"exec", 5, 20}, "mget": {"mget", 5, 4}, "multi": {"multi", 5, 1},
		"incrby": {"incrby", 5, 3}, "expire": {"expire", 5, 6},
	}
	call, inside = splitCall(tx, []string{"exec", "mget", "multi"}, "MGET + MULTI/EXEC")
	if want := (Call{Name: "MGET + MULTI/EXEC", Calls: 5, Usec: 25}); call != want {
		t.Errorf("named call: got %+v, want %+v", call, want)
	}
	if want := []CommandStat{{"expire", 5, 6}, {"incrby", 5, 3}}; !slices.Equal(inside, want) {
		t.Errorf("inside the transaction: got %+v, want %+v", inside, want)
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"ratewindow sliding-log":     "ratewindow-sliding-log",
		"plain sliding log, rueidis": "plain-sliding-log-rueidis",
		"go-redis/redis_rate v10":    "go-redis-redis-rate-v10",
		" x ":                        "x",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
