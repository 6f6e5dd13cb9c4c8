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
	cfg.Goroutines, cfg.Keys = []int{1}, []int{1}
	r := &Report{Config: cfg, Redis: "7.0", Go: "go", CPUs: 2, Started: time.Unix(0, 0), Took: time.Second}
	r.Contenders = []Contender{{Name: "ours <a&b>"}, {Name: "peer", Peer: true}}
	r.Throughput = []Throughput{
		{Contender: "ours <a&b>", Goroutines: 1, Keys: 1, Rounds: []Slice{{Decisions: 3000, Elapsed: time.Second, Mallocs: 3000,
			Call: Call{Name: "FCALL", Calls: 3000, Usec: 42000}, Inside: []CommandStat{{"set", 3000, 3000}, {"get", 6000, 1500}}}}},
		{Contender: "peer", Goroutines: 1, Keys: 1, Rounds: []Slice{{Decisions: 1000, Elapsed: time.Second, Call: Call{Name: "EVALSHA", Calls: 1000, Usec: 5000}}}},
	}
	r.Admission = []Admission{{Contender: "ours <a&b>", Worst: 100}, {Contender: "peer", Worst: 199}}
	r.Memory = []Memory{{Contender: "ours <a&b>", PerKey: 60}, {Contender: "peer", PerKey: 120}}
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
		"| ours <a&b> | 3,000 | 3.00× | 0 ns | 0 ns | 1.0 | 0.0 | 0.0 | 14.00 | 1.0 | 0 |",
		"| ours <a&b> | FCALL | 14.00 | 1.0 | SET 1.00, GET ×2 0.50 | 1.50 | 12.50 |",
		"| peer | EVALSHA | 5.00 | 1.0 | — | 0.00 | 5.00 |",
		"One round: each figure is that round's.",
		"| 1 | 500 | 10 | 50.00× | 0.0 |",
		"| peer |  | 199 |",
		"| ours <a&b> | 60.0 | 0.50× | 0.0 | 0 |",
		Command,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Markdown lacks %q:\n%s", want, b.String())
		}
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
	if b, ok := r.Baseline(1, 1); !ok || b.Contender != "fast peer" {
		t.Fatalf("baseline %+v %v", b, ok)
	}
	r.Config.Baseline = "peer"
	if b, ok := r.Baseline(1, 1); !ok || b.Contender != "peer" {
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
