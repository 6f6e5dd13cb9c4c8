package dashboards

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
	ratewindowprom "github.com/ratewindow/ratewindow/prometheus"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// dashboardFile is the dashboard, read from this directory.
const dashboardFile = "ratewindow.json"

// dashboard is the part of a Grafana dashboard's JSON model the tests read.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Title      string `json:"title"`
	Type       string `json:"type"`
	Datasource dsRef  `json:"datasource"`
	Targets    []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource dsRef  `json:"datasource"`
	} `json:"targets"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Query      string `json:"query"`
	Definition string `json:"definition"`
	Datasource *dsRef `json:"datasource"`
	Multi      bool   `json:"multi"`
	IncludeAll bool   `json:"includeAll"`
	AllValue   string `json:"allValue"`
}

// datasourceUID is how every panel names its data source: the dashboard's
// data source variable, so that an import asks for nothing else.
const datasourceUID = "${datasource}"

func readDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// queryVars are the dashboard's query variables, in order (a variable's
// query may use the ones before it).
func (d *dashboard) queryVars() []variable {
	var vs []variable
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			vs = append(vs, v)
		}
	}
	return vs
}

// varRef matches a variable in a query: $name, ${name} or ${name:format}.
var varRef = regexp.MustCompile(`\$(\w+)|\$\{(\w+)(?::\w+)?\}`)

// expand replaces the variables of expr as Grafana does for a Prometheus
// query: values maps a variable to its value formatted for a regular
// expression (the dashboard matches variables with =~), and
// $__rate_interval becomes window. A variable it does not know is an error.
func expand(expr string, values map[string]string, window string) (string, error) {
	var unknown []string
	out := varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		name := m[1] + m[2]
		if name == "__rate_interval" {
			return window
		}
		v, ok := values[name]
		if !ok {
			unknown = append(unknown, ref)
		}
		return v
	})
	if unknown != nil {
		return "", fmt.Errorf("unknown variables %v in %q", unknown, expr)
	}
	return out, nil
}

// allValues selects every value of every query variable, as "All" does.
func (d *dashboard) allValues() map[string]string {
	values := map[string]string{}
	for _, v := range d.queryVars() {
		values[v.Name] = v.AllValue
	}
	return values
}

// TestDashboardModel checks what Grafana needs to import the dashboard and
// what its queries need: a Prometheus data source variable that every panel
// and query uses, query variables that offer All, panels with unique ids
// and titles, queries whose every variable is defined, and a query for
// every metric the collector exports.
func TestDashboardModel(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: both are needed to import and link the dashboard", d.Title, d.UID)
	}
	if d.SchemaVersion < 36 { // Grafana 9.0's, the first with data source references by uid
		t.Errorf("schemaVersion %d", d.SchemaVersion)
	}
	var ds []variable
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			ds = append(ds, v)
		}
	}
	if len(ds) != 1 || ds[0].Name != "datasource" || ds[0].Query != "prometheus" {
		t.Fatalf("data source variables %+v, want one named datasource of type prometheus", ds)
	}
	for _, v := range d.queryVars() {
		if v.Datasource == nil || *v.Datasource != (dsRef{"prometheus", datasourceUID}) {
			t.Errorf("variable %s: data source %+v", v.Name, v.Datasource)
		}
		if !v.Multi || !v.IncludeAll || v.AllValue != ".*" {
			t.Errorf("variable %s: multi %v, includeAll %v, allValue %q: want several values, All as .*", v.Name, v.Multi, v.IncludeAll, v.AllValue)
		}
		if _, _, err := parseLabelValues(v.Definition); err != nil || v.Query != v.Definition {
			t.Errorf("variable %s: query %q, definition %q: %v", v.Name, v.Query, v.Definition, err)
		}
	}

	values := d.allValues()
	ids, titles := map[int]bool{}, map[string]bool{}
	var exprs []string
	for _, p := range d.Panels {
		if ids[p.ID] || titles[p.Title] || p.Title == "" {
			t.Errorf("panel %d %q: id and title must be unique", p.ID, p.Title)
		}
		ids[p.ID], titles[p.Title] = true, true
		if p.Datasource != (dsRef{"prometheus", datasourceUID}) {
			t.Errorf("panel %q: data source %+v", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Datasource != (dsRef{"prometheus", datasourceUID}) || q.Expr == "" {
				t.Errorf("panel %q query %s: data source %+v, expr %q", p.Title, q.RefID, q.Datasource, q.Expr)
			}
			if _, err := expand(q.Expr, values, "1m"); err != nil {
				t.Errorf("panel %q query %s: %v", p.Title, q.RefID, err)
			}
			exprs = append(exprs, q.Expr)
		}
	}

	// Every metric the collector exports has a panel: a metric added to
	// the collector fails this test until the dashboard shows it.
	c := ratewindowprom.NewCollector(ratewindowprom.Opts{})
	c.Observe(core.Event{Op: core.OpAllow, Rule: "r"}) // creates the rule's series
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) < 7 {
		t.Fatalf("the collector exports %d metrics", len(families))
	}
	for _, f := range families {
		name := f.GetName()
		if f.GetType().String() == "HISTOGRAM" {
			name += "_bucket"
		}
		if !slices.ContainsFunc(exprs, func(e string) bool { return strings.Contains(e, name+"{") }) {
			t.Errorf("no panel queries %s", name)
		}
	}
}

// TestExpand: variables are replaced in every form Grafana accepts, and an
// unknown one is an error, not a query that silently matches nothing.
func TestExpand(t *testing.T) {
	values := map[string]string{"job": ".*", "rule": "api"}
	got, err := expand(`rate(m{job=~"$job", rule=~"${rule}", x=~"${rule:regex}"}[$__rate_interval])`, values, "42s")
	if want := `rate(m{job=~".*", rule=~"api", x=~"api"}[42s])`; err != nil || got != want {
		t.Fatalf("got %q, %v; want %q", got, err, want)
	}
	for _, expr := range []string{`m{a=~"$instance"}`, `m[$__interval]`, `m{a=~"${ruler}"}`} {
		if _, err := expand(expr, values, "1m"); err == nil || !strings.Contains(err.Error(), "unknown variables") {
			t.Errorf("%s: %v, want an unknown variable", expr, err)
		}
	}
	if keys := slices.Sorted(maps.Keys(readDashboard(t).allValues())); !slices.Equal(keys, []string{"job", "rule"}) {
		t.Errorf("query variables %v", keys)
	}
}

// labelValuesCall matches Grafana's label_values(selector, label).
var labelValuesCall = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// parseLabelValues returns the selector and label of a variable's query,
// label_values(selector, label).
func parseLabelValues(q string) (selector, label string, err error) {
	m := labelValuesCall.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		return "", "", fmt.Errorf("not label_values(selector, label): %q", q)
	}
	return strings.TrimSpace(m[1]), m[2], nil
}

func TestParseLabelValues(t *testing.T) {
	sel, label, err := parseLabelValues(`label_values(m{job=~"$job"}, rule)`)
	if err != nil || sel != `m{job=~"$job"}` || label != "rule" {
		t.Fatalf("%q %q %v", sel, label, err)
	}
	for _, q := range []string{"", "label_values(rule)", "query_result(m)", "label_values(m, a b)"} {
		if _, _, err := parseLabelValues(q); err == nil {
			t.Errorf("%q: no error", q)
		}
	}
}
