package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
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
		{Contender: "ours <a&b>", Goroutines: 1, Keys: 1, Decisions: 3000, Elapsed: time.Second, Mallocs: 3000},
		{Contender: "peer", Goroutines: 1, Keys: 1, Decisions: 1000, Elapsed: time.Second},
	}
	r.Admission = []Admission{{Contender: "ours <a&b>", Worst: 100}, {Contender: "peer", Worst: 199}}
	r.Memory = []Memory{{Contender: "ours <a&b>", PerKey: 60}, {Contender: "peer", PerKey: 120}}
	r.Deny = []Deny{{Goroutines: 1, On: Throughput{Decisions: 500, Elapsed: time.Second}, Off: Throughput{Decisions: 10, Elapsed: time.Second}}}
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
	r.Throughput = append(r.Throughput, Throughput{Contender: "fast peer", Goroutines: 1, Keys: 1, Decisions: 2000, Elapsed: time.Second})
	if b, ok := r.Baseline(1, 1); !ok || b.Contender != "fast peer" {
		t.Fatalf("baseline %+v %v", b, ok)
	}
	r.Config.Baseline = "peer"
	if b, ok := r.Baseline(1, 1); !ok || b.Contender != "peer" {
		t.Fatalf("named baseline %+v %v", b, ok)
	}
}
